package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// A handler that swallows a unique violation ("it already exists, return
// nil") leaves its transaction aborted. That is the failure of its own
// record: it is retried, then dead-lettered with a reason saying what
// happened, while every other record of the batch of ten is applied and the
// partition moves on. (It used to be taken for a database outage and
// retried for ever, with no outcome at all.) The same holds for a
// set-based handler that inserts the batch in one statement and swallows
// its violation: the set is split until the records whose rows collide are
// alone.
func TestSwallowedUniqueViolationHoldsOnlyItsRecord(t *testing.T) {
	swallow := func(err error) error {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			return nil // "already exists": swallowed, as users do
		}
		return err
	}
	for _, tc := range []struct {
		form string
		h    handler.Any
	}{
		{"tx", handler.New("credit", creditKey(),
			func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
				return swallow(insertCredit(ctx, tx, msg.Value))
			})},
		{"set", handler.NewSet("credit", creditKey(),
			func(ctx context.Context, tx pgx.Tx, msgs []handler.Message[credit]) error {
				ids, accts, amts := make([]string, len(msgs)), make([]int64, len(msgs)), make([]int64, len(msgs))
				for i, m := range msgs {
					ids[i], accts[i], amts[i] = m.Value.OrderID, m.Value.Account, m.Value.Amount
				}
				_, err := tx.Exec(ctx, `insert into ledger(order_id, account, amount)
					select * from unnest($1::text[], $2::bigint[], $3::bigint[])`, ids, accts, amts)
				return swallow(err)
			})},
	} {
		t.Run(tc.form, func(t *testing.T) {
			ctx := context.Background()
			pool, ob, brokers := outboxSetup(t, 1, "cmds")
			if _, err := pool.Exec(ctx, `create unique index on ledger (order_id);
				insert into ledger (order_id, account, amount) values ('order-2', 0, 0), ('order-5', 0, 0), ('order-9', 0, 0)`); err != nil {
				t.Fatal(err)
			}
			produceCopies(t, brokers, "cmds", 10, 1, 1)
			o := newOutcomes()
			cfg := testConfig(brokers, "swallow", "cmds")
			cfg.MaxAttempts = 2
			startConsumer(t, cfg, pool, consumer.Handle(tc.h), consumer.WithHooks(o.hooks()),
				consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)))
			o.await(t, 30*time.Second, "an outcome for every record", func() bool { return o.total() == 10 })
			if a, d := o.get("applied"), o.get("dead_lettered"); a != 7 || d != 3 {
				t.Errorf("applied=%d dead_lettered=%d, want 7 and 3", a, d)
			}
			o.awaitCommitted(t, 10*time.Second, "cmds", 0, 10) // past the batch
			if n := count(t, pool, `select count(*) from ledger where amount = 100`); n != 7 {
				t.Errorf("%d ledger rows applied, want 7", n)
			}
			reasons := deadLetterReasons(t, pool, "cmds.dlq")
			if len(reasons) != 3 {
				t.Fatalf("%d dead letters, want 3", len(reasons))
			}
			for _, r := range reasons {
				if want := "handler credit returned nil but its transaction was aborted"; !strings.Contains(r, want) {
					t.Errorf("dead letter reason %q does not say %q", r, want)
				}
			}
		})
	}
}

// A dead-lettered record leaves a mark: delivered to a second consumer
// group (or again to the first), it is a duplicate and no second dead
// letter is written, for an undecodable record (marked by its coordinates)
// as for a keyed record whose handler failed for good (handler.Permanent:
// one run, no retries). A replayed copy at other coordinates applies once.
func TestDeadLetteredOnceAcrossGroups(t *testing.T) {
	ctx := context.Background()
	pool, ob, brokers := outboxSetup(t, 1, "cmds")
	good, _ := json.Marshal(credit{OrderID: "order-k", Account: 1, Amount: 100})
	testenv.Produce(t, brokers,
		&kgo.Record{Topic: "cmds", Value: []byte("\xffnot json")},
		&kgo.Record{Topic: "cmds", Value: good})
	var broken atomic.Bool
	broken.Store(true)
	var calls atomic.Int32
	h := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			calls.Add(1)
			if broken.Load() {
				return handler.Permanent(errors.New("unknown account"))
			}
			_, err := tx.Exec(ctx, `insert into ledger(order_id, account, amount, off) values($1,$2,$3,$4)`,
				msg.Value.OrderID, msg.Value.Account, msg.Value.Amount, msg.Record.Offset)
			return err
		})
	run := func(group string, want map[string]int) {
		t.Helper()
		o := newOutcomes()
		cfg := testConfig(brokers, group, "cmds")
		cfg.MaxAttempts = 5
		stop := startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()),
			consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)))
		total := 0
		for _, n := range want {
			total += n
		}
		o.await(t, 30*time.Second, fmt.Sprintf("%d outcomes in group %s", total, group), func() bool { return o.total() >= total })
		stop()
		if got := o.snapshot(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("group %s: outcomes %v, want %v", group, got, want)
		}
	}
	run("first", map[string]int{"dead_lettered": 2})
	if n := calls.Load(); n != 1 {
		t.Errorf("the permanently failing handler ran %d times, want 1", n)
	}
	run("second", map[string]int{"duplicate": 2})
	if n := count(t, pool, `select count(*) from exactly_outbox where topic = 'cmds.dlq'`); n != 2 {
		t.Errorf("%d dead letters, want 2 (one per record, whatever the groups)", n)
	}
	var attempts []string
	rows, err := pool.Query(ctx, `select convert_from(decode(h->>'value', 'base64'), 'UTF8') from exactly_outbox, jsonb_array_elements(headers) h
		where topic = 'cmds.dlq' and h->>'key' = $1 order by id`, outbox.HeaderAttempts)
	if err != nil {
		t.Fatal(err)
	}
	if attempts, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || fmt.Sprint(attempts) != "[0 1]" {
		t.Errorf("dead letters' attempts %v (%v), want [0 1]: no handler ran for the undecodable record", attempts, err)
	}
	var state string
	if err := pool.QueryRow(ctx, `select state from exactly_guard where key = $1 and topic = 'cmds' and kafka_partition = 0 and kafka_offset = 0 and handler = 'credit'`,
		dedupe.DeadLetterKey("cmds", 0, 0)).Scan(&state); err != nil || state != "dead_lettered" {
		t.Errorf("mark of the undecodable record: state %q (%v), want dead_lettered", state, err)
	}

	// The handler is fixed and the keyed record replayed (a copy at offset
	// 2): both groups see it; it applies once.
	broken.Store(false)
	testenv.Produce(t, brokers, &kgo.Record{Topic: "cmds", Value: good})
	run("first", map[string]int{"applied": 1})
	run("second", map[string]int{"duplicate": 1})
	if n := count(t, pool, `select count(*) from ledger where order_id = 'order-k' and off = 2`); n != 1 {
		t.Errorf("%d ledger rows of the replayed copy, want 1", n)
	}
}

// When a later record of a batch fails, the batch is replayed without it in
// a fresh transaction and the earlier records' handlers run again. An
// external call made by CallReconciled in the rolled-back run must not be
// made again, even with a reconcile that cannot see calls younger than a
// second (an eventually consistent API).
func TestReplayedBatchCallsExternalAPIOnce(t *testing.T) {
	pool, ob, brokers := outboxSetup(t, 1, "cmds")
	var mu sync.Mutex
	calledAt := map[string]time.Time{}
	var calls atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		mu.Lock()
		calledAt[r.URL.Query().Get("key")] = time.Now()
		mu.Unlock()
		fmt.Fprint(w, "charge-1")
	}))
	defer api.Close()
	effects := dedupe.NewEffects(nil)
	produceCopies(t, brokers, "cmds", 2, 1, 1) // order-0 (calls the API), order-1 (fails)
	h := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			if msg.Value.OrderID == "order-1" {
				return errors.New("order-1 fails")
			}
			_, err := effects.CallReconciled(ctx, pool, tx, msg.Scope, msg.Key,
				func(ctx context.Context, key string) ([]byte, error) {
					resp, err := http.Get(api.URL + "?key=" + key)
					if err != nil {
						return nil, err
					}
					defer resp.Body.Close()
					return []byte("charge-1"), nil
				},
				func(ctx context.Context, key string) ([]byte, bool, error) {
					mu.Lock()
					defer mu.Unlock()
					at, ok := calledAt[key]
					return []byte("charge-1"), ok && time.Since(at) > time.Second, nil
				})
			return err
		})
	o := newOutcomes()
	cfg := testConfig(brokers, "calls", "cmds")
	cfg.MaxAttempts = 1
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()),
		consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)))
	o.await(t, 30*time.Second, "both records", func() bool { return o.total() == 2 })
	if a, d := o.get("applied"), o.get("dead_lettered"); a != 1 || d != 1 {
		t.Errorf("applied=%d dead_lettered=%d, want 1 and 1", a, d)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the external API was called %d times, want 1", n)
	}
}

// A COMMIT that fails (its backend terminated just before it) takes the
// batch's outbox rows with it: they were written in the batch's own
// transaction, so after the retry there is exactly one row per key.
func TestFailedCommitLeavesNoOutboxRows(t *testing.T) {
	ctx := context.Background()
	pool, ob, brokers := outboxSetup(t, 1, "cmds")
	produceCopies(t, brokers, "cmds", 5, 1, 1)
	h := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			return ob.Add(ctx, tx, outbox.Message{Topic: "events", Key: []byte(msg.Value.OrderID), Value: []byte("credited")})
		})
	var killed atomic.Bool
	o := newOutcomes()
	hooks := o.hooks()
	hooks.BeforeDBCommit = func(ctx context.Context, _ consumer.CommitData) {
		if killed.Swap(true) {
			return
		}
		// The batch's transaction is the database's only one idle in a
		// transaction: end its backend, so its COMMIT fails.
		var n int
		if err := pool.QueryRow(ctx, `select count(pg_terminate_backend(pid)) from pg_stat_activity
			where datname = current_database() and state = 'idle in transaction' and pid <> pg_backend_pid()`).Scan(&n); err != nil || n != 1 {
			t.Errorf("terminated %d backends (%v), want the batch's one", n, err)
		}
	}
	cfg := testConfig(brokers, "commitfail", "cmds")
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(hooks))
	o.await(t, 30*time.Second, "five applied", func() bool { return o.get("applied") == 5 })
	if !killed.Load() {
		t.Fatal("the commit was never interrupted")
	}
	rows, err := pool.Query(ctx, `select convert_from(key, 'UTF8'), count(*)::int from exactly_outbox where topic = 'events' group by 1 order by 1`)
	if err != nil {
		t.Fatal(err)
	}
	perKey := map[string]int{}
	var k string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&k, &n}, func() error { perKey[k] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(perKey) != "map[order-0:1 order-1:1 order-2:1 order-3:1 order-4:1]" {
		t.Errorf("outbox rows per key %v, want exactly one for each of order-0..4", perKey)
	}
}
