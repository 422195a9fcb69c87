package consumer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/consumer/otelexport"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/redact"
	"github.com/exactly-go/exactly/internal/runtime/telemetry"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

type notification struct {
	OrderID string `json:"order_id"`
}

// creditNotifier credits and emits a notification through the outbox.
func creditNotifier() *handler.Handler[credit] {
	return handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			if err := insertCredit(ctx, tx, msg.Value); err != nil {
				return err
			}
			return outbox.AddJSON(ctx, tx, "notifications", []byte(msg.Value.OrderID), notification{OrderID: msg.Value.OrderID})
		})
}

func spansNamed(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attrOf(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

func attrStr(s sdktrace.ReadOnlySpan, key string) string {
	v, _ := attrOf(s, key)
	return v.String()
}

func childrenOf(spans []sdktrace.ReadOnlySpan, parent sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spansNamed(spans, name) {
		if s.Parent().SpanID() == parent.SpanContext().SpanID() && s.Parent().TraceID() == parent.SpanContext().TraceID() {
			out = append(out, s)
		}
	}
	return out
}

// One trace from the producer of a command, through the credit handler and
// its outbox row, the relay's publish, to the notify consumer; span names,
// parents, attributes and the duplicate event along the way.
func TestTraceFromCommandThroughOutboxToDownstream(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	setupLedger(t, pool)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	kc := testenv.Kafka(t, 1, "credits", "notifications")
	brokers := testenv.Brokers(kc)

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	mp := metricnoop.NewMeterProvider()

	// The command's producer: a span of its own, kotel injects traceparent.
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), telemetry.KafkaTracing(tp, mp))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	cmdCtx, cmd := tp.Tracer("test").Start(ctx, "send credit command")
	v1, _ := json.Marshal(credit{OrderID: "order-1", Account: 1, Amount: 100})
	v2, _ := json.Marshal(credit{OrderID: "order-2", Account: 2, Amount: 100})
	// order-1 is sent twice (a producer retry): the copy is a duplicate.
	if err := prod.ProduceSync(cmdCtx, &kgo.Record{Topic: "credits", Value: v1}, &kgo.Record{Topic: "credits", Value: v1}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cmd.End()
	if err := prod.ProduceSync(ctx, &kgo.Record{Topic: "credits", Value: v2}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	relay, err := outbox.NewRelay(pool, brokers, outbox.RelayConfig{TracerProvider: tp, MeterProvider: mp, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()
	t.Cleanup(func() { stopRelay(); <-relayDone; relay.Close() })

	credits := newOutcomes()
	startConsumer(t, testConfig(brokers, "credit-svc", "credits"), pool, consumer.Handle(creditNotifier()),
		consumer.WithHooks(credits.hooks()), consumer.WithTracerProvider(tp), consumer.WithMeterProvider(mp))
	notified := newOutcomes()
	notify := handler.New("notify", handler.FromHeader[notification](outbox.HeaderMessageID),
		func(context.Context, pgx.Tx, handler.Message[notification]) error { return nil })
	startConsumer(t, testConfig(brokers, "notify-svc", "notifications"), pool, consumer.Handle(notify),
		consumer.WithHooks(notified.hooks()), consumer.WithTracerProvider(tp), consumer.WithMeterProvider(mp))

	credits.await(t, 30*time.Second, "3 credit deliveries", func() bool { return credits.total() >= 3 })
	notified.await(t, 30*time.Second, "2 notifications", func() bool { return notified.total() >= 2 })
	if a, d := credits.get("applied"), credits.get("duplicate"); a != 2 || d != 1 {
		t.Fatalf("credits applied=%d duplicate=%d, want 2 and 1", a, d)
	}

	spans := rec.Ended()
	traceID := cmd.SpanContext().TraceID()
	inTrace := func(name string) []sdktrace.ReadOnlySpan {
		var out []sdktrace.ReadOnlySpan
		for _, s := range spansNamed(spans, name) {
			if s.SpanContext().TraceID() == traceID {
				out = append(out, s)
			}
		}
		return out
	}
	publishes := inTrace("credits publish")
	if len(publishes) != 2 {
		t.Fatalf("%d 'credits publish' spans in the command's trace, want 2 (kotel on the producer)", len(publishes))
	}
	processes := inTrace("credits process")
	if len(processes) != 2 {
		t.Fatalf("%d 'credits process' spans in the command's trace, want 2; all spans: %v", len(processes), names(spans))
	}
	var applied, dup sdktrace.ReadOnlySpan
	for _, p := range processes {
		if p.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("process span kind %v", p.SpanKind())
		}
		parentOK := false
		for _, pub := range publishes {
			parentOK = parentOK || p.Parent().SpanID() == pub.SpanContext().SpanID()
		}
		if !parentOK {
			t.Errorf("process span's parent %v is not a producer publish span", p.Parent().SpanID())
		}
		want := map[string]string{
			"messaging.system": "kafka", "messaging.operation.type": "process",
			"messaging.destination.name": "credits", "messaging.destination.partition.id": "0",
			"messaging.consumer.group.name": "credit-svc", "exactly.handler": "credit",
			"exactly.scope": "credit", "exactly.key": "credit:order-1",
		}
		for k, v := range want {
			if got := attrStr(p, k); got != v {
				t.Errorf("process span attribute %s = %q, want %q", k, got, v)
			}
		}
		if _, ok := attrOf(p, "messaging.kafka.offset"); !ok {
			t.Error("process span has no messaging.kafka.offset")
		}
		switch attrStr(p, "exactly.outcome") {
		case "applied":
			applied = p
		case "duplicate":
			dup = p
		}
	}
	if applied == nil || dup == nil {
		t.Fatalf("want one applied and one duplicate process span in the command's trace")
	}

	// Children: claim for both, handle only for the applied one, outbox.add
	// under handle.
	if n := len(childrenOf(spans, applied, "exactly.claim")); n != 1 {
		t.Errorf("applied record has %d claim spans, want 1", n)
	}
	if n := len(childrenOf(spans, dup, "exactly.claim")); n != 1 {
		t.Errorf("duplicate record has %d claim spans, want 1", n)
	}
	if n := len(childrenOf(spans, dup, "exactly.handle")); n != 0 {
		t.Errorf("duplicate record has %d handle spans, want 0", n)
	}
	handles := childrenOf(spans, applied, "exactly.handle")
	if len(handles) != 1 {
		t.Fatalf("applied record has %d handle spans, want 1", len(handles))
	}
	adds := childrenOf(spans, handles[0], "exactly.outbox.add")
	if len(adds) != 1 {
		t.Fatalf("handle span has %d outbox.add children, want 1", len(adds))
	}

	// The duplicate's event names when the matched processing happened.
	var ev *sdktrace.Event
	for _, e := range dup.Events() {
		if e.Name == telemetry.EventDuplicate {
			ev = &e
		}
	}
	if ev == nil {
		t.Fatal("duplicate process span has no exactly.duplicate event")
	}
	evAttrs := map[string]attribute.Value{}
	for _, a := range ev.Attributes {
		evAttrs[string(a.Key)] = a.Value
	}
	if !evAttrs["exactly.duplicate.original_found"].AsBool() {
		t.Errorf("duplicate event: original not found: %v", ev.Attributes)
	}
	at, err := time.Parse(time.RFC3339Nano, evAttrs["exactly.duplicate.original_processed_at"].AsString())
	if err != nil || time.Since(at) > time.Minute || time.Since(at) < 0 {
		t.Errorf("duplicate event processed_at %q (%v): not a recent time", evAttrs["exactly.duplicate.original_processed_at"].AsString(), err)
	}
	for _, s := range processes {
		if s != dup {
			for _, e := range s.Events() {
				if e.Name == telemetry.EventDuplicate {
					t.Error("applied record has a duplicate event")
				}
			}
		}
	}

	// The relay's publish span continues the writing trace (its parent is
	// the outbox.add span), and the notify consumer continues the relay's.
	relayPubs := inTrace("notifications publish")
	if len(relayPubs) != 1 || relayPubs[0].Parent().SpanID() != adds[0].SpanContext().SpanID() {
		t.Fatalf("relay publish spans in the trace: %d (want 1, child of outbox.add)", len(relayPubs))
	}
	down := inTrace("notifications process")
	if len(down) != 1 {
		t.Fatalf("%d 'notifications process' spans in the command's trace, want 1", len(down))
	}
	if down[0].Parent().SpanID() != relayPubs[0].SpanContext().SpanID() {
		t.Error("notify process span is not a child of the relay's publish span")
	}
	if got := attrStr(down[0], "exactly.outcome"); got != "applied" {
		t.Errorf("notify outcome %q", got)
	}
	// order-2 had no trace context: its process span is a root of its own trace.
	for _, s := range spansNamed(spans, "credits process") {
		if attrStr(s, "exactly.key") == "credit:order-2" && s.SpanContext().TraceID() == traceID {
			t.Error("order-2 joined the command's trace")
		}
	}
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name()
	}
	return out
}

// The Prometheus endpoint, scraped over HTTP and parsed: 10 credits sent 3
// times each are counted as 10 applied and 20 duplicates.
func TestPrometheusEndpointCountsOutcomes(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	const parts, n, copies = 3, 10, 3
	kc := testenv.Kafka(t, parts, "credits")
	brokers := testenv.Brokers(kc)
	produceCopies(t, brokers, "credits", n, copies, parts)

	tel, err := otelexport.Setup(context.Background(), otelexport.Config{Prometheus: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	srv := httptest.NewServer(tel.MetricsHandler)
	t.Cleanup(srv.Close)
	o := newOutcomes()
	startConsumer(t, testConfig(brokers, "g", "credits"), pool, consumer.Handle(creditHandler(0)),
		consumer.WithHooks(o.hooks()), consumer.WithMeterProvider(tel.MeterProvider))
	o.await(t, 30*time.Second, "every delivery", func() bool { return o.total() >= n*copies })

	families := scrape(t, srv.URL+"/metrics")
	got := map[string]float64{}
	fam, ok := families["exactly_records_total"]
	if !ok {
		t.Fatalf("no exactly_records_total; families: %v", keys(families))
	}
	for _, m := range fam.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["exactly_handler"] != "credit" {
			t.Errorf("record counter with handler %q", labels["exactly_handler"])
		}
		got[labels["exactly_outcome"]] += m.GetCounter().GetValue()
	}
	if got["applied"] != n || got["duplicate"] != n*(copies-1) || got["dead_lettered"] != 0 {
		t.Errorf("scraped outcomes %v, want applied %d, duplicate %d", got, n, n*(copies-1))
	}
	for _, name := range []string{"exactly_handler_duration_seconds", "exactly_transaction_duration_seconds", "exactly_consumer_lag", "exactly_duplicate_ratio"} {
		if _, ok := families[name]; !ok {
			t.Errorf("no %s in the scrape; families: %v", name, keys(families))
		}
	}
	if h := families["exactly_handler_duration_seconds"]; h != nil {
		var c uint64
		for _, m := range h.GetMetric() {
			c += m.GetHistogram().GetSampleCount()
		}
		if c != n {
			t.Errorf("handler duration samples = %d, want %d (one per applied record)", c, n)
		}
	}
}

func scrape(t *testing.T, u string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", u, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing the scrape: %v", err)
	}
	return fams
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func spikeCount(t *testing.T, r *sdkmetric.ManualReader) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == telemetry.MetricDuplicateSpikes {
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// runDuplicates runs a consumer over first (unique credits), then again
// over redelivered copies of the first `again` of them, and returns the
// log and the number of duplicate spikes counted.
func runDuplicates(t *testing.T, unique, again, copies int) (string, int64) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "credits")
	brokers := testenv.Brokers(kc)
	produceCopies(t, brokers, "credits", unique, 1, 1)

	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	cfg := testConfig(brokers, "g", "credits")
	cfg.DuplicateWindow = time.Hour // the whole test is one window: no timing involved
	cfg.DuplicateThreshold = 0.25
	cfg.DuplicateMinRecords = 20
	o := newOutcomes()
	startConsumer(t, cfg, pool, consumer.Handle(creditHandler(0)), consumer.WithHooks(o.hooks()),
		consumer.WithMeterProvider(mp), consumer.WithLogger(log))
	o.await(t, 30*time.Second, "the unique credits", func() bool { return o.total() >= unique })
	if again > 0 {
		var recs []*kgo.Record
		for c := 0; c < copies; c++ {
			for i := 0; i < again; i++ {
				v, _ := json.Marshal(credit{OrderID: fmt.Sprintf("order-%d", i), Account: int64(i % 10), Amount: 100})
				recs = append(recs, &kgo.Record{Topic: "credits", Value: v})
			}
		}
		testenv.Produce(t, brokers, recs...)
		o.await(t, 30*time.Second, "the redeliveries", func() bool { return o.total() >= unique+again*copies })
	}
	if d := o.get("duplicate"); d != again*copies {
		t.Fatalf("duplicates = %d, want %d", d, again*copies)
	}
	return logs.String(), spikeCount(t, reader)
}

// A burst of redeliveries (40 duplicates after 20 credits) is reported once:
// a warning and one exactly.duplicate_spikes event.
func TestDuplicateSpikeIsReported(t *testing.T) {
	logs, spikes := runDuplicates(t, 20, 20, 2)
	if n := strings.Count(logs, "duplicate rate spike"); n != 1 {
		t.Errorf("%d duplicate-spike warnings, want 1; logs:\n%s", n, logs)
	}
	if !strings.Contains(logs, `"level":"WARN","msg":"duplicate rate spike`) || !strings.Contains(logs, `"handler":"credit"`) {
		t.Errorf("spike warning not a WARN naming the handler:\n%s", logs)
	}
	if spikes != 1 {
		t.Errorf("exactly.duplicate_spikes = %d, want 1", spikes)
	}
}

// A steady trickle (3 duplicates among 103 records) is normal at-least-once
// behaviour: no warning.
func TestDuplicateTrickleIsNotReported(t *testing.T) {
	logs, spikes := runDuplicates(t, 100, 3, 1)
	if strings.Contains(logs, "duplicate rate spike") || spikes != 0 {
		t.Errorf("trickle reported as a spike (%d events); logs:\n%s", spikes, logs)
	}
	// Per-record logs carry coordinates, key and outcome.
	if !strings.Contains(logs, `"msg":"record processed","topic":"credits","partition":0,"offset":`) ||
		!strings.Contains(logs, `"key":"credit:order-1","outcome":"duplicate"`) {
		t.Errorf("no structured per-record log line with coordinates, key and outcome:\n%.2000s", logs)
	}
}

// The database password in DATABASE_URL never reaches a log line or a span,
// even when an error quotes the connection string.
func TestNoSecretInLogsOrSpans(t *testing.T) {
	const secret = "s3cr3t-Pa55word"
	ctx := context.Background()
	base := testenv.DBURL(t)
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `create role app_user login superuser password '`+secret+`'`); err != nil &&
		!strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	admin.Close(ctx)
	u, _ := url.Parse(base)
	u.User = url.UserPassword("app_user", secret)
	dbURL := u.String()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	setupLedger(t, pool)

	kc := testenv.Kafka(t, 1, "credits")
	brokers := testenv.Brokers(kc)
	produceCopies(t, brokers, "credits", 5, 2, 1)

	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	cfg := testConfig(brokers, "g", "credits")
	cfg.DatabaseURL = dbURL
	failed := false
	var mu sync.Mutex
	h := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			mu.Lock()
			first := !failed
			failed = true
			mu.Unlock()
			if first { // an error that quotes the connection string, as drivers sometimes do
				return fmt.Errorf("cannot reach %s", dbURL)
			}
			return insertCredit(ctx, tx, msg.Value)
		})
	o := newOutcomes()
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()), consumer.WithLogger(log),
		consumer.WithTracerProvider(tp))
	o.await(t, 30*time.Second, "every delivery", func() bool { return o.total() >= 10 })
	_ = tp.Shutdown(ctx)

	text := logs.String()
	if !strings.Contains(text, "handler failed") {
		t.Fatalf("the failing handler was not logged:\n%s", text)
	}
	if strings.Contains(text, secret) {
		t.Errorf("the database password appears in the logs:\n%s", text)
	}
	if !strings.Contains(text, redact.Redacted) {
		t.Errorf("the quoted URL was not redacted:\n%s", text)
	}
	spans := rec.Ended()
	if len(spans) == 0 {
		t.Fatal("no spans")
	}
	for _, s := range spans {
		var parts []string
		parts = append(parts, s.Name(), s.Status().Description)
		for _, a := range s.Attributes() {
			parts = append(parts, a.Value.String())
		}
		for _, e := range s.Events() {
			parts = append(parts, e.Name)
			for _, a := range e.Attributes {
				parts = append(parts, a.Value.String())
			}
		}
		if all := strings.Join(parts, " "); strings.Contains(all, secret) {
			t.Errorf("span %s carries the password: %s", s.Name(), all)
		}
	}
}
