package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// produceCredits sends n credits of account 1 to each of partitions
// partitions of topic, order ids "p<partition>-<i>".
func produceCredits(t *testing.T, brokers []string, topic string, partitions int32, n int) {
	t.Helper()
	var recs []*kgo.Record
	for p := range partitions {
		for i := range n {
			v, _ := json.Marshal(credit{OrderID: fmt.Sprintf("p%d-%d", p, i), Account: 1, Amount: 1})
			recs = append(recs, &kgo.Record{Topic: topic, Partition: p, Value: v})
		}
	}
	produceManual(t, brokers, recs...)
}

// runRelay runs a relay for ob, reading the table at least every poll,
// until the test ends.
func runRelay(t *testing.T, pool *pgxpool.Pool, brokers []string, ob *outbox.Outbox, poll time.Duration, hooks outbox.RelayHooks) {
	t.Helper()
	r, err := outbox.NewRelay(pool, brokers, outbox.RelayConfig{Outbox: ob, PollInterval: poll, Hooks: hooks,
		TakeoverInterval: 100 * time.Millisecond, RetryBackoff: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer r.Close()
		if err := r.Run(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("relay: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// TestBatchesOnTwoPartitionsPublishInCommitOrder runs two partitions'
// batches that credit the same account. Each record first adds an event
// keyed by the account (the order id), then updates the account's row,
// recording the balance it saw: the balances are the order in which the
// records, and so their batches, committed. The first batches are made to
// interleave: partition 1's adds its event while partition 0's holds the
// account's row lock, then waits for that lock, so it commits after every
// record of partition 0's batch although its event was added before theirs.
// The outbox takes no key locks in a consumer's flush; the relay (started
// once everything committed, so it reads every row at once, in id order)
// must still publish the account's events in balance order. Ids drawn when
// the event is added, not at the flush, fail this.
func TestBatchesOnTwoPartitionsPublishInCommitOrder(t *testing.T) {
	ctx := context.Background()
	pool, ob, brokers := outboxSetup(t, 2, "credits")
	if _, err := pool.Exec(ctx, `create table accounts(id bigint primary key, balance bigint not null);
insert into accounts values (1, 0);
create table seen(order_id text primary key, balance bigint not null)`); err != nil {
		t.Fatal(err)
	}
	const perPartition = 60
	produceCredits(t, brokers, "credits", 2, perPartition)

	locked, added := make(chan struct{}), make(chan struct{})
	var lockedOnce, addedOnce sync.Once
	wait := func(c chan struct{}) {
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			t.Error("the two partitions' first batches did not interleave")
		}
	}
	h := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			first := msg.Record.Offset == 0 && msg.Attempt == 1
			if first && msg.Record.Partition == 1 {
				wait(locked) // partition 0's batch holds the account's row
			}
			if err := ob.Add(ctx, tx, outbox.Message{Topic: "credited", Key: []byte("1"), Value: []byte(msg.Value.OrderID)}); err != nil {
				return err
			}
			if first && msg.Record.Partition == 1 {
				addedOnce.Do(func() { close(added) }) // and now waits for that row
			}
			var balance int64
			if err := tx.QueryRow(ctx, `update accounts set balance = balance + $1 where id = $2 returning balance`,
				msg.Value.Amount, msg.Value.Account).Scan(&balance); err != nil {
				return err
			}
			if first && msg.Record.Partition == 0 {
				lockedOnce.Do(func() { close(locked) })
				wait(added)
			}
			_, err := tx.Exec(ctx, `insert into seen values ($1, $2)`, msg.Value.OrderID, balance)
			return err
		})
	o := newOutcomes()
	cfg := testConfig(brokers, "order", "credits")
	cfg.BatchMaxRecords = 10
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	o.await(t, 60*time.Second, "every record", func() bool { return o.total() >= 2*perPartition })
	if a := o.get("applied"); a != 2*perPartition {
		t.Fatalf("applied %d, want %d", a, 2*perPartition)
	}

	balances := map[string]int64{}
	rows, err := pool.Query(ctx, `select order_id, balance from seen`)
	if err != nil {
		t.Fatal(err)
	}
	var id string
	var b int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &b}, func() error { balances[id] = b; return nil }); err != nil {
		t.Fatal(err)
	}
	runRelay(t, pool, brokers, ob, 50*time.Millisecond, outbox.RelayHooks{})
	recs := testenv.ReadTopic(t, brokers, "credited", 2*perPartition)
	var prev int64
	for i, r := range recs {
		b, ok := balances[string(r.Value)]
		if !ok {
			t.Fatalf("published event %q has no credit", r.Value)
		}
		if b <= prev {
			t.Fatalf("event %d (%s, balance %d) published after one with balance %d: the account's events are not in commit order", i, r.Value, b, prev)
		}
		prev = b
	}
}

// TestConsumerCommitWakesRelay runs a relay whose poll interval is an hour,
// built from the consumer's Outbox value: after its first, empty read only
// a wake can make it read again. The consumer's commit must wake it
// (in-process, after COMMIT), so the events are published within seconds.
// Without the executor's call to the buffer's after-commit callbacks this
// times out.
func TestConsumerCommitWakesRelay(t *testing.T) {
	pool, ob, brokers := outboxSetup(t, 1, "credits")
	polled := make(chan int, 1)
	runRelay(t, pool, brokers, ob, time.Hour, outbox.RelayHooks{OnPoll: func(n int) {
		select {
		case polled <- n:
		default:
		}
	}})
	if n := <-polled; n != 0 {
		t.Fatalf("the relay's first read found %d rows, want 0", n)
	}
	h := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			return ob.Add(ctx, tx, outbox.Message{Topic: "credited", Key: []byte("1"), Value: []byte(msg.Value.OrderID)})
		})
	startConsumer(t, testConfig(brokers, "wake", "credits"), pool, consumer.Handle(h))
	produceCredits(t, brokers, "credits", 1, 3)
	testenv.ReadTopic(t, brokers, "credited", 3)
}

// A handler that adds its events through outbox.Add's default Outbox value
// (not the one the relay was built from) still wakes the service's relay
// in-process: the consumer knows its outbox's table, and any batch that
// wrote to that table wakes the relay after COMMIT. So no notification is
// sent at all (the relay built from the consumer's outbox is active here),
// and the relay, which polls only hourly, publishes at once.
func TestDefaultOutboxValueWakesServiceRelay(t *testing.T) {
	pool, ob, brokers := outboxSetup(t, 1, "credits")
	polled := make(chan int, 1)
	runRelay(t, pool, brokers, ob, time.Hour, outbox.RelayHooks{OnPoll: func(n int) {
		select {
		case polled <- n:
		default:
		}
	}})
	if n := <-polled; n != 0 {
		t.Fatalf("the relay's first read found %d rows, want 0", n)
	}
	cfg := pool.Config()
	notifies := &notifyCounter{}
	cfg.ConnConfig.Tracer = notifies
	cpool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cpool.Close)
	h := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			return outbox.Add(ctx, tx, outbox.Message{Topic: "credited", Key: []byte("1"), Value: []byte(msg.Value.OrderID)})
		})
	startConsumer(t, testConfig(brokers, "wake-default", "credits"), cpool, consumer.Handle(h), consumer.WithOutbox(ob))
	produceCredits(t, brokers, "credits", 1, 3)
	testenv.ReadTopic(t, brokers, "credited", 3)
	if n := notifies.n.Load(); n != 0 {
		t.Errorf("the consumer sent %d notifications; its relay is active in this process and needs none", n)
	}
}

// notifyCounter counts the pg_notify statements a pool sends.
type notifyCounter struct{ n atomic.Int64 }

func (c *notifyCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pg_notify") {
		c.n.Add(1)
	}
	return ctx
}

func (c *notifyCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
