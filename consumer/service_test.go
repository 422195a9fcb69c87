package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sethvargo/go-envconfig"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/internal/testenv/broker"
	"github.com/exactly-go/exactly/outbox"
)

// runService runs svc until the returned stop is called, and returns Run's
// error from stop.
func runService(t *testing.T, svc *consumer.Service) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	var once bool
	var err error
	stop = func() error {
		if !once {
			once = true
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("Service.Run did not return within 30s of the cancellation")
			}
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// A service started before its tables exist fails at once with a
// *SchemaError naming the configured guard table, instead of retrying a
// missing relation as an outage; after Migrate it runs.
func TestServiceFailsFastOnMissingTablesAndMigratesConfiguredOnes(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool) // migrates the DEFAULT guard table only
	kc := testenv.Kafka(t, 1, "credits")
	cfg := testConfig(testenv.Brokers(kc), "g", "credits")
	cfg.GuardTable = "billing.guard"
	o := newOutcomes()
	svc, err := consumer.NewService(cfg, pool, consumer.Handle(creditHandler(0)), consumer.WithHooks(o.hooks()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = svc.Run(ctx) // returns by itself: nothing cancels ctx
	var se *consumer.SchemaError
	if !errors.As(err, &se) || !se.Missing || !strings.Contains(se.Table, `"billing"."guard"`) {
		t.Fatalf("Run before Migrate = %v, want a *SchemaError for the missing \"billing\".\"guard\"", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run waited for the deadline instead of failing fast")
	}
	if _, err := pool.Exec(ctx, `create schema billing`); err != nil {
		t.Fatal(err)
	}
	if err := svc.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if got := count(t, pool, `select count(*) from pg_tables where schemaname = 'billing' and tablename = 'guard'`); got != 1 {
		t.Fatalf("Migrate did not create the configured guard table billing.guard")
	}
	if err := svc.CheckSchema(ctx); err != nil {
		t.Fatalf("CheckSchema after Migrate: %v", err)
	}
	produceCopies(t, testenv.Brokers(kc), "credits", 3, 2, 1)
	stop := runService(t, svc)
	o.await(t, 30*time.Second, "every delivery", func() bool { return o.total() >= 6 })
	if err := stop(); err != nil {
		t.Fatalf("Run after cancellation = %v, want nil", err)
	}
	if got := count(t, pool, `select count(*) from ledger`); got != 3 {
		t.Errorf("ledger rows = %d, want 3 (one per order)", got)
	}
	if got := count(t, pool, `select count(*) from billing.guard`); got != 3 {
		t.Errorf("guard rows in billing.guard = %d, want 3", got)
	}
}

// An outdated schema (recorded version behind) is refused too.
func TestServiceRefusesOutdatedSchema(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "credits")
	svc, err := consumer.NewService(testConfig(testenv.Brokers(kc), "g", "credits"), pool, consumer.Handle(creditHandler(0)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := svc.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `delete from exactly_schema_migrations where component like 'outbox:%' and version = (select max(version) from exactly_schema_migrations where component like 'outbox:%')`); err != nil {
		t.Fatal(err)
	}
	var se *consumer.SchemaError
	if err := svc.CheckSchema(ctx); !errors.As(err, &se) || se.Missing || se.Current >= se.Latest {
		t.Fatalf("CheckSchema with the outbox one version behind = %v, want a *SchemaError (current < latest)", err)
	}
}

// EXACTLY_METRICS_ADDR set in a service's environment without
// WithMetricsHandler would serve nothing: NewService refuses it with a
// *ConfigError naming the variable and the option to pass, and nothing is
// listened on. With the option it builds.
func TestServiceRefusesMetricsAddrWithoutHandler(t *testing.T) {
	pool := testenv.DB(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg, err := consumer.ConfigFromLookuper(t.Context(), envconfig.MapLookuper(map[string]string{
		"EXACTLY_KAFKA_BROKERS": "127.0.0.1:1", "EXACTLY_TOPICS": "credits", "EXACTLY_METRICS_ADDR": addr,
	}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = consumer.NewService(cfg, pool, consumer.Handle(creditHandler(0)))
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Field != "Config.MetricsAddr" {
		t.Fatalf("NewService with EXACTLY_METRICS_ADDR and no handler = %v, want a *ConfigError on Config.MetricsAddr", err)
	}
	for _, want := range []string{"EXACTLY_METRICS_ADDR", addr, "WithMetricsHandler", "otelexport"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Errorf("something listens on %s after NewService failed", addr)
	}
	h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	if _, err := consumer.NewService(cfg, pool, consumer.Handle(creditHandler(0)), consumer.WithMetricsHandler(h)); err != nil {
		t.Errorf("NewService with EXACTLY_METRICS_ADDR and WithMetricsHandler: %v", err)
	}
}

// The metrics handler passed with WithMetricsHandler is served on
// Config.MetricsAddr at /metrics while the service runs; without an
// address, NewService refuses it.
func TestServiceServesMetricsHandler(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "credits")
	cfg := testConfig(testenv.Brokers(kc), "g", "credits")
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "exactly_test 1\n") })
	var ce *consumer.ConfigError
	if _, err := consumer.NewService(cfg, pool, consumer.Handle(creditHandler(0)), consumer.WithMetricsHandler(h)); !errors.As(err, &ce) ||
		!strings.Contains(err.Error(), "Config.MetricsAddr") {
		t.Fatalf("NewService with a handler and no address = %v, want a *ConfigError naming Config.MetricsAddr", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.MetricsAddr = ln.Addr().String()
	ln.Close()
	svc, err := consumer.NewService(cfg, pool, consumer.Handle(creditHandler(0)), consumer.WithMetricsHandler(h))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	stop := runService(t, svc)
	var body []byte
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + cfg.MetricsAddr + "/metrics")
		if err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics endpoint never answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // the listener opens inside Run
	}
	if string(body) != "exactly_test 1\n" {
		t.Errorf("/metrics = %q, want the handler's output", body)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://" + cfg.MetricsAddr + "/metrics"); err == nil {
		t.Error("the metrics endpoint still answers after Run returned")
	}
}

// A Config literal with only Brokers and Group is complete: zero fields
// take the documented defaults.
func TestConfigLiteralUsesDefaults(t *testing.T) {
	pool := testenv.DB(t)
	c, err := consumer.New(consumer.Config{Brokers: []string{"127.0.0.1:1"}, Group: "billing"}, pool,
		consumer.Handle(creditHandler(0), "credits"))
	if err != nil || c == nil {
		t.Fatalf("New(Config{Brokers, Group}) = %v", err)
	}
	if err := (&consumer.Config{Brokers: []string{"b:9092"}}).Validate(); err != nil {
		t.Errorf("a near-zero Config does not validate: %v", err)
	}
}

// Validation names Config fields, never environment variables; reading
// the environment names the variables instead.
func TestValidationNamesFieldsAndEnvironmentNamesVariables(t *testing.T) {
	bad := consumer.Config{BatchMaxRecords: -1, RetryBackoff: time.Second, RetryBackoffMax: time.Millisecond, SASLUser: "u"}
	err := bad.Validate()
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Validate = %v, want a *ConfigError", err)
	}
	fields := map[string]bool{}
	for _, p := range ce.Problems {
		fields[p.Field] = true
	}
	for _, f := range []string{"Config.BatchMaxRecords", "Config.RetryBackoffMax", "Config.SASLUser"} {
		if !fields[f] {
			t.Errorf("Validate does not name %s: %v", f, err)
		}
	}
	if strings.Contains(err.Error(), "EXACTLY_") {
		t.Errorf("Validate names an environment variable: %v", err)
	}
	_, err = consumer.ConfigFromLookuper(context.Background(), envconfig.MapLookuper(map[string]string{
		"EXACTLY_RETRY_BACKOFF": "1s", "EXACTLY_RETRY_BACKOFF_MAX": "1ms"}))
	if err == nil || !strings.Contains(err.Error(), "EXACTLY_RETRY_BACKOFF_MAX: must be >= EXACTLY_RETRY_BACKOFF") ||
		strings.Contains(err.Error(), "Config.") {
		t.Errorf("ConfigFromLookuper = %v, want the variables named, not the fields", err)
	}
}

// On a broker that requires SASL, the service's relay authenticates with
// the consumer's settings: the events a handler wrote to the outbox reach
// their topic. (A relay without the SASL options cannot publish at all.)
func TestServiceRelayUsesConsumerSASL(t *testing.T) {
	b, err := broker.Start(context.Background(), broker.Options{Partitions: 1, Topics: []string{"credits", "credited"},
		Extra: []kfake.Opt{kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "admin", "admin-pw")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	cfg := envConfig(t, b.Addrs(), "sasl-service", map[string]string{
		"EXACTLY_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
		"EXACTLY_KAFKA_SASL_USER":      "admin",
		"EXACTLY_KAFKA_SASL_PASSWORD":  "admin-pw",
	})
	pool := testenv.DB(t)
	setupLedger(t, pool)
	emit := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			return outbox.AddJSON(ctx, tx, "credited", []byte(msg.Value.OrderID), msg.Value)
		})
	svc, err := consumer.NewService(cfg, pool, consumer.Handle(emit))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	kopts, err := cfg.KafkaOptions()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(kopts, kgo.SeedBrokers(cfg.Brokers...), kgo.ConsumeTopics("credited"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 3
	for i := 0; i < n; i++ {
		rec := &kgo.Record{Topic: "credits", Value: []byte(fmt.Sprintf(`{"order_id":"order-%d","account":1,"amount":5}`, i))}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	stop := runService(t, svc)
	got := 0
	for got < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("%d of %d events reached the topic: the relay did not publish through SASL", got, n)
		}
		got += len(fs.Records())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// slowProducer delays every produced record, standing in for a slow
// broker, so the relay is still publishing when the consumer stops.
type slowProducer struct{ d time.Duration }

func (s slowProducer) OnProduceRecordBuffered(*kgo.Record) { time.Sleep(s.d) }

// Shutdown order: after the consumer has stopped and committed, the relay
// publishes what the last transactions wrote before Run returns, so a
// cancelled service leaves no outbox rows behind (within ShutdownTimeout).
func TestServiceShutdownLetsRelayFlush(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "credits", "credited")
	brokers := testenv.Brokers(kc)
	cfg := testConfig(brokers, "flush", "credits")
	const n = 5
	emit := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			return outbox.AddJSON(ctx, tx, "credited", []byte(msg.Value.OrderID), msg.Value)
		})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen int
	svc, err := consumer.NewService(cfg, pool, consumer.Handle(emit),
		consumer.WithKafkaOptions(kgo.WithHooks(slowProducer{200 * time.Millisecond})),
		consumer.WithHooks(consumer.Hooks{OnOutcome: func(context.Context, consumer.OutcomeData) {
			if seen++; seen == n { // worker goroutine: one partition, one caller
				cancel() // stop as soon as the last record committed
			}
		}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	produceCopies(t, brokers, "credits", n, 1, 1)
	if err := svc.Run(ctx); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if got := count(t, pool, `select count(*) from exactly_outbox`); got != 0 {
		t.Errorf("%d outbox rows left after Run returned; the relay was stopped before it flushed", got)
	}
	if got := len(testenv.ReadTopic(t, brokers, "credited", n)); got != n {
		t.Errorf("%d events published, want %d", got, n)
	}
}
