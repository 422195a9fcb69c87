package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// Every kind of bad input ends in the dead-letter topic with its reason, and
// nothing is lost: input == applied + duplicates + dead-lettered. A dead
// letter replayed after the bug is fixed applies once; replayed again, it is
// a duplicate.
func TestBadInputGoesToDeadLetterTopic(t *testing.T) {
	ctx := context.Background()
	pool, ob, brokers := outboxSetup(t, 2, "cmds")

	good := func(id string) []byte {
		b, _ := json.Marshal(credit{OrderID: id, Account: 1, Amount: 10})
		return b
	}
	recs := []*kgo.Record{
		{Key: []byte("garbage"), Value: []byte("\xff\x00not json at all")},
		{Key: []byte("wrong-type"), Value: []byte(`{"order_id": 42, "account": "one"}`)},
		{Key: []byte("no-key"), Value: []byte(`{"account": 1, "amount": 5}`)},
		{Key: []byte("tombstone"), Value: nil},
		{Key: []byte("bad-header"), Value: []byte("\x00garbage"), Headers: []kgo.RecordHeader{{Key: "trace\xff\x00id", Value: []byte("x")}}},
		{Key: []byte("order-panic"), Value: good("order-panic")},
		{Key: []byte("order-fail"), Value: good("order-fail")},
		{Key: []byte("order-fixed"), Value: good("order-fixed")},
	}
	for i := 0; i < 10; i++ {
		id := "order-" + string(rune('a'+i))
		recs = append(recs, &kgo.Record{Key: []byte(id), Value: good(id)})
		if i < 5 {
			recs = append(recs, &kgo.Record{Key: []byte(id), Value: good(id)}) // producer-side duplicate
		}
	}
	for _, r := range recs {
		r.Topic = "cmds"
	}
	testenv.Produce(t, brokers, recs...)

	var broken atomic.Bool
	broken.Store(true)
	h := handler.New("credit",
		handler.FromPayload(func(c credit) string {
			if c.OrderID == "" {
				return ""
			}
			return dedupe.Key("credit", c.OrderID)
		}),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			switch msg.Value.OrderID {
			case "order-panic":
				panic("nil map somewhere")
			case "order-fail":
				return errors.New("always fails")
			case "order-fixed":
				if broken.Load() {
					return errors.New("bug not fixed yet")
				}
			}
			return insertCredit(ctx, tx, msg.Value)
		})
	relay, err := outbox.NewRelay(pool, brokers, outbox.RelayConfig{Outbox: ob})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()
	defer func() { stopRelay(); <-relayDone }()

	o := newOutcomes()
	cfg := testConfig(brokers, "dlq", "cmds")
	cfg.MaxAttempts = 3
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()),
		consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)))
	o.await(t, 60*time.Second, "every input record", func() bool { return o.total() >= len(recs) })

	counts, err := dedupe.New().Outcomes(ctx, pool, "credit")
	if err != nil {
		t.Fatal(err)
	}
	if counts.Total() != int64(len(recs)) || counts.Applied != 10 || counts.Duplicate != 5 || counts.DeadLettered != 8 {
		t.Fatalf("counted %+v over %d inputs; want 10 applied, 5 duplicates, 8 dead-lettered", counts, len(recs))
	}

	// The dead-letter topic holds the 8 records with their reasons.
	dead := testenv.ReadTopic(t, brokers, "cmds.dlq", 8)
	want := map[string]string{
		"garbage": "decoding", "wrong-type": "decoding", "no-key": "deriving key",
		"tombstone": "tombstone", "bad-header": "decoding", "order-panic": "panicked", "order-fail": "always fails", "order-fixed": "bug not fixed",
	}
	for _, r := range dead {
		reason := recHeader(r, outbox.HeaderError)
		if w, ok := want[string(r.Key)]; !ok || !strings.Contains(reason, w) {
			t.Errorf("dead letter %q: reason %q, want it to mention %q", r.Key, reason, w)
		}
		if recHeader(r, outbox.HeaderOriginalTopic) != "cmds" || recHeader(r, outbox.HeaderOriginalOffset) == "" ||
			recHeader(r, outbox.HeaderHandler) != "credit" || recHeader(r, outbox.HeaderAttempts) == "" {
			t.Errorf("dead letter %q lacks its origin headers: %v", r.Key, r.Headers)
		}
		delete(want, string(r.Key))
	}
	if len(want) > 0 {
		t.Errorf("not dead-lettered: %v", want)
	}

	// Fix the bug and replay that one dead letter: it applies once.
	broken.Store(false)
	before := o.total()
	res, err := outbox.Replay(ctx, brokers, outbox.ReplayOptions{Topic: "cmds.dlq", Key: []byte("order-fixed")})
	if err != nil || res.Replayed != 1 {
		t.Fatalf("replay: %+v, %v; want 1 replayed", res, err)
	}
	o.await(t, 30*time.Second, "the replayed record", func() bool { return o.total() >= before+1 })
	if n := count(t, pool, `select count(*) from ledger where order_id = 'order-fixed'`); n != 1 {
		t.Fatalf("order-fixed applied %d times after replay, want 1", n)
	}
	// Replayed again: a duplicate, no second effect.
	dupBefore := o.get("duplicate")
	if _, err := outbox.Replay(ctx, brokers, outbox.ReplayOptions{Topic: "cmds.dlq", Key: []byte("order-fixed")}); err != nil {
		t.Fatal(err)
	}
	o.await(t, 30*time.Second, "the second replay", func() bool { return o.get("duplicate") >= dupBefore+1 })
	if n := count(t, pool, `select count(*) from ledger where order_id = 'order-fixed'`); n != 1 {
		t.Fatalf("order-fixed applied %d times after a second replay, want 1", n)
	}
}

// A handler whose external call keeps failing with a network error uses up
// its attempts and is dead-lettered: only the database's errors are outages
// that hold a partition.
func TestHandlerNetworkErrorIsNotAnOutage(t *testing.T) {
	pool, ob, brokers := outboxSetup(t, 1, "cmds")
	produceCopies(t, brokers, "cmds", 1, 1, 1)
	h := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "tcp", "127.0.0.1:1") // a payment API that is down
			if err == nil {
				conn.Close()
				return errors.New("expected the dial to fail")
			}
			return fmt.Errorf("calling the payment API: %w", err)
		})
	o := newOutcomes()
	cfg := testConfig(brokers, "neterr", "cmds")
	cfg.MaxAttempts = 3
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()),
		consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)))
	o.await(t, 30*time.Second, "the record to be dead-lettered", func() bool { return o.get("dead_lettered") == 1 })
	if n := count(t, pool, `select count(*) from exactly_outbox where topic = 'cmds.dlq'`); n != 1 {
		t.Errorf("%d dead-letter rows, want 1", n)
	}
}

// Two copies of one key in one partition, the first dead-lettered: the
// second is not a "duplicate" of an effect that never happened; it runs
// and applies.
func TestCopyAfterDeadLetteredCopyApplies(t *testing.T) {
	pool, ob, brokers := outboxSetup(t, 1, "cmds")
	produceCopies(t, brokers, "cmds", 1, 2, 1) // order-0 twice, offsets 0 and 1
	h := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			if msg.Record.Offset == 0 {
				return errors.New("the first copy fails")
			}
			return insertCredit(ctx, tx, msg.Value)
		})
	o := newOutcomes()
	cfg := testConfig(brokers, "copies", "cmds")
	cfg.MaxAttempts = 1
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()),
		consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)))
	o.await(t, 30*time.Second, "both copies", func() bool { return o.total() >= 2 })
	if d, a, dup := o.get("dead_lettered"), o.get("applied"), o.get("duplicate"); d != 1 || a != 1 || dup != 0 {
		t.Errorf("dead_lettered=%d applied=%d duplicate=%d; want 1, 1, 0", d, a, dup)
	}
	if n := count(t, pool, `select count(*) from ledger`); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
}

// outboxSetup gives a test a fresh database with the ledger, guard and
// outbox tables, and a broker with topic.
func outboxSetup(t *testing.T, partitions int32, topic string) (*pgxpool.Pool, *outbox.Outbox, []string) {
	t.Helper()
	pool := testenv.DB(t)
	setupLedger(t, pool)
	ob := outbox.New()
	if err := ob.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool, ob, testenv.Brokers(testenv.Kafka(t, partitions, topic))
}
