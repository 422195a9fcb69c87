package status_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type order struct {
	ID string `json:"id"`
}

// scenario is a consumer group that consumed part of a topic (and stopped),
// emitting one outbox row per applied order that no relay publishes.
type scenario struct {
	pool    *pgxpool.Pool
	brokers []string
	admin   *kadm.Client
	cfg     status.Config
}

const (
	scenarioTopic     = "orders"
	scenarioGroup     = "order-service"
	scenarioConsumed  = 120 // records the consumer applied or skipped
	scenarioUnique    = 100 // distinct order ids among them (20 duplicates)
	scenarioLag       = 45  // records produced after the consumer stopped
	scenarioDLQ       = 7   // records on orders.dlq
	scenarioHandler   = "orders"
	scenarioOutboxTop = "order-events"
)

// newScenario runs the real consumer on kfake over the real migrations:
// scenarioConsumed records (scenarioUnique distinct keys) are consumed and
// committed, then scenarioLag more are produced with nobody consuming, and
// scenarioDLQ records land on the dead-letter topic.
func newScenario(t *testing.T) *scenario {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	pool := testenv.DB(t)
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	cluster := testenv.Kafka(t, 3, scenarioTopic, scenarioTopic+".dlq")
	brokers := testenv.Brokers(cluster)

	records := func(from, n int) []*kgo.Record {
		var recs []*kgo.Record
		for i := from; i < from+n; i++ {
			v, _ := json.Marshal(order{ID: fmt.Sprintf("order-%d", i%scenarioUnique)})
			recs = append(recs, &kgo.Record{Topic: scenarioTopic, Key: []byte(fmt.Sprint(i)), Value: v})
		}
		return recs
	}
	testenv.Produce(t, brokers, records(0, scenarioConsumed)...)

	h := handler.New(scenarioHandler,
		handler.FromPayload(func(o order) string { return dedupe.Key("order", o.ID) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[order]) error {
			return outbox.Add(ctx, tx, outbox.Message{Topic: scenarioOutboxTop, Key: []byte(msg.Value.ID), Value: []byte("placed"),
				Headers: []handler.Header{{Key: "source", Value: []byte("status-test")}}})
		})
	cfg := consumer.DefaultConfig()
	cfg.Brokers, cfg.Group, cfg.Topics = brokers, scenarioGroup, []string{scenarioTopic}
	cfg.CommitInterval = 50 * time.Millisecond
	var seen atomic.Int64
	all := make(chan struct{})
	c, err := consumer.New(cfg, pool, consumer.Handle(h),
		consumer.WithLogger(slog.New(slog.DiscardHandler)),
		consumer.WithHooks(consumer.Hooks{OnOutcome: func(context.Context, consumer.OutcomeData) {
			if seen.Add(1) == scenarioConsumed {
				close(all)
			}
		}}))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	select {
	case <-all:
	case err := <-done:
		t.Fatalf("consumer stopped early: %v", err)
	case <-ctx.Done():
		t.Fatalf("consumer handled %d of %d records before the deadline", seen.Load(), scenarioConsumed)
	}
	stop() // commits the offsets of everything handled, then leaves
	if err := <-done; err != nil {
		t.Fatalf("consumer: %v", err)
	}

	testenv.Produce(t, brokers, records(scenarioConsumed, scenarioLag)...)
	var dlq []*kgo.Record
	for i := range scenarioDLQ {
		dlq = append(dlq, &kgo.Record{Topic: scenarioTopic + ".dlq", Key: []byte(fmt.Sprint(i)), Value: []byte("poison")})
	}
	testenv.Produce(t, brokers, dlq...)

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	s := &scenario{pool: pool, brokers: brokers, admin: kadm.NewClient(cl)}
	s.cfg = status.Config{Pool: pool, Admin: s.admin, Groups: []string{scenarioGroup},
		Database: pool.Config().ConnString(), Brokers: brokers}
	return s
}

// addOutboxRow commits one outbox row as a producer would.
func addOutboxRow(t *testing.T, pool *pgxpool.Pool, msg outbox.Message) {
	t.Helper()
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(t.Context()))
	if err := outbox.Add(t.Context(), tx, msg); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// apartFromStoppedGroup returns problems without the one every scenario
// has: its group stopped with lag (no members).
func apartFromStoppedGroup(problems []string) []string {
	var out []string
	for _, p := range problems {
		if !strings.Contains(p, "records of lag and no members") {
			out = append(out, p)
		}
	}
	return out
}
