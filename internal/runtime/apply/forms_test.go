package apply_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// entry is a record of the form tests: Amount < 0 violates the check
// constraint of the entries table, so its statement fails in the database.
type entry struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
}

// newFormExecutor migrates a fresh database (guard, outbox, an entries
// table whose amount must be >= 0, a dead table) and returns an executor
// over h that dead-letters at attempt 3.
func newFormExecutor(t testing.TB, h handler.Any) (*apply.Executor, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	pool := testenv.DB(t)
	guard := dedupe.New()
	if err := guard.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `create table entries (id text primary key, amount bigint not null check (amount >= 0));
		create table dead (id text not null, attempts int not null, reason text not null)`); err != nil {
		t.Fatal(err)
	}
	return &apply.Executor{Pool: pool, Guard: guard, Handler: h, MaxAttempts: 3,
		DeadLetter: func(ctx context.Context, tx pgx.Tx, rec handler.Record, _ string, attempts int, reason error) error {
			var v entry
			_ = json.Unmarshal(rec.Value, &v)
			_, err := tx.Exec(ctx, `insert into dead (id, attempts, reason) values ($1, $2, $3)`, v.ID, attempts, reason.Error())
			return err
		}}, pool
}

// entries returns n records, all valid but the one at bad (-1 for none).
func entries(t *testing.T, n, bad, attempt int) []apply.Item {
	t.Helper()
	items := make([]apply.Item, n)
	for i := range items {
		v := entry{ID: fmt.Sprintf("e%03d", i), Amount: int64(i)}
		if i == bad {
			v.Amount = -1
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		items[i] = apply.Item{Record: handler.Record{Topic: "entries", Offset: int64(i), Value: b}, Attempt: attempt}
	}
	return items
}

func entryKey(e entry) string { return dedupe.Key("entry", e.ID) }

// checkIsolated runs 100 records, one of which (42) fails in the database,
// and checks that it alone fails: at its first attempt the 42 before it
// commit and it is the batch's handler error; at its last, it is
// dead-lettered alone, and the 57 after it commit, each with its outbox
// row, and the outcome counters say so.
func checkIsolated(t *testing.T, e *apply.Executor, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	const n, bad = 100, 42
	res, herr, err := e.Run(ctx, entries(t, n, bad, 1))
	if err != nil {
		t.Fatalf("first attempt: %v (a failing statement is its record's failure, not an outage)", err)
	}
	var pgErr *pgconn.PgError
	if herr == nil || herr.Index != bad || !errors.As(herr, &pgErr) || pgErr.Code != "23514" || len(res) != bad {
		t.Fatalf("first attempt: %d results, handler error %v; want %d applied and record %d failing with a check violation", len(res), herr, bad, bad)
	}
	res, herr, err = e.Run(ctx, entries(t, n, bad, 3)[bad:])
	if err != nil || herr != nil || len(res) != n-bad {
		t.Fatalf("last attempt: %d results, handler error %v, error %v; want %d", len(res), herr, err, n-bad)
	}
	if res[0].Outcome != dedupe.DeadLettered || !strings.Contains(res[0].Reason.Error(), "entries_amount_check") {
		t.Errorf("record %d: outcome %s (%v), want dead-lettered for the check violation", bad, res[0].Outcome, res[0].Reason)
	}
	for i, r := range res[1:] {
		if r.Outcome != dedupe.Applied {
			t.Errorf("record %d: outcome %s, want applied", bad+1+i, r.Outcome)
		}
	}
	var rows, events, dead int
	var deadID string
	if err := pool.QueryRow(ctx, `select (select count(*) from entries), (select count(*) from exactly_outbox),
		(select count(*) from dead), (select coalesce(min(id), '') from dead)`).Scan(&rows, &events, &dead, &deadID); err != nil {
		t.Fatal(err)
	}
	if rows != n-1 || events != n-1 || dead != 1 || deadID != fmt.Sprintf("e%03d", bad) {
		t.Errorf("%d entries, %d outbox rows, %d dead letters (%q); want %d, %d, 1 (e%03d)", rows, events, dead, deadID, n-1, n-1, bad)
	}
	c, err := e.Guard.Outcomes(ctx, pool, e.Handler.Scope())
	if err != nil {
		t.Fatal(err)
	}
	if c != (dedupe.Counts{Applied: n - 1, DeadLettered: 1}) {
		t.Errorf("outcome counters %+v, want %d applied and 1 dead-lettered", c, n-1)
	}
}

// One queued statement among 100 fails (a check violation): its record
// alone is retried, then dead-lettered; the other 99 commit with their
// outbox rows.
func TestPipelinedIsolatesFailingStatement(t *testing.T) {
	var runs atomic.Int32
	h := handler.NewPipelined("entry", handler.FromPayload(entryKey),
		func(ctx context.Context, q handler.Queue, msg handler.Message[entry]) error {
			runs.Add(1)
			q.Queue(`insert into entries (id, amount) values ($1, $2)`, msg.Value.ID, msg.Value.Amount)
			return outbox.Add(ctx, q.Tx(), outbox.Message{Topic: "entered", Key: []byte(msg.Value.ID), Value: msg.Record.Value})
		})
	e, pool := newFormExecutor(t, h)
	checkIsolated(t, e, pool)
	t.Logf("%d handler runs for 100 records", runs.Load())
}

// A pipelined handler cannot read: its Tx's Query fails, saying why.
func TestPipelinedCannotRead(t *testing.T) {
	h := handler.NewPipelined("entry", handler.FromPayload(entryKey),
		func(ctx context.Context, q handler.Queue, msg handler.Message[entry]) error {
			var n int
			return q.Tx().QueryRow(ctx, `select 1`).Scan(&n)
		})
	e, _ := newFormExecutor(t, h)
	_, herr, err := e.Run(context.Background(), entries(t, 1, -1, 1))
	if err != nil || herr == nil || !strings.Contains(herr.Error(), "pipelined handler cannot read") {
		t.Fatalf("handler error %v, error %v; want the record failed because a pipelined handler cannot read", herr, err)
	}
}

// A set-based handler's statement fails for one record among 100 (the
// whole INSERT … unnest fails): bisection finds it; it alone is retried,
// then dead-lettered; the other 99 commit with their outbox rows.
func TestSetBisectsFailingRecord(t *testing.T) {
	var calls atomic.Int32
	h := handler.NewSet("entry", handler.FromPayload(entryKey),
		func(ctx context.Context, tx pgx.Tx, msgs []handler.Message[entry]) error {
			calls.Add(1)
			ids, amounts := make([]string, len(msgs)), make([]int64, len(msgs))
			for i, m := range msgs {
				ids[i], amounts[i] = m.Value.ID, m.Value.Amount
				if err := outbox.Add(ctx, tx, outbox.Message{Topic: "entered", Key: []byte(m.Value.ID), Value: m.Record.Value}); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `insert into entries (id, amount) select * from unnest($1::text[], $2::bigint[])`, ids, amounts)
			return err
		})
	e, pool := newFormExecutor(t, h)
	checkIsolated(t, e, pool)
	// Per failing pass: the whole set, then 2 calls per level of the
	// bisection (log2(100) < 7), then the replay: at most 16.
	if c := calls.Load(); c > 2*16 {
		t.Errorf("%d set calls over two runs, want at most 32", c)
	}
}

// A set-based handler that fails only as a whole (no record fails alone)
// fails the first record of the set, saying so, instead of looping.
func TestSetFailingOnlyTogetherFailsFirst(t *testing.T) {
	h := handler.NewSet("entry", handler.FromPayload(entryKey),
		func(ctx context.Context, tx pgx.Tx, msgs []handler.Message[entry]) error {
			if len(msgs) > 1 {
				return errors.New("too many at once")
			}
			_, err := tx.Exec(ctx, `insert into entries (id, amount) values ($1, $2)`, msgs[0].Value.ID, msgs[0].Value.Amount)
			return err
		})
	e, _ := newFormExecutor(t, h)
	res, herr, err := e.Run(context.Background(), entries(t, 4, -1, 1))
	if err != nil || herr == nil || herr.Index != 0 || len(res) != 0 || !strings.Contains(herr.Error(), "none alone") {
		t.Fatalf("%d results, handler error %v, error %v; want record 0 failed as the first of a set failing together", len(res), herr, err)
	}
}

// A set-based handler that fails in the normal pass but succeeds when the
// bisecting pass calls it again on the same records (a flaky or
// state-dependent handler: here, every other call fails) charges an
// attempt to the first record of the set, with the normal pass's error,
// instead of replaying the batch until its deadline; at the last attempt,
// the batch ends with an outcome for every record. (The old code looped:
// normal pass fails, bisection finds nothing, replay, and again.)
func TestSetFailingOnlyInNormalPassFailsFirst(t *testing.T) {
	var calls atomic.Int32
	h := handler.NewSet("entry", handler.FromPayload(entryKey),
		func(ctx context.Context, tx pgx.Tx, msgs []handler.Message[entry]) error {
			if calls.Add(1)%2 == 1 {
				return errors.New("flaky downstream")
			}
			for _, m := range msgs {
				if _, err := tx.Exec(ctx, `insert into entries (id, amount) values ($1, $2)`, m.Value.ID, m.Value.Amount); err != nil {
					return err
				}
			}
			return nil
		})
	e, _ := newFormExecutor(t, h)
	// Bounded, so that the old code ends too; the assertions are on outcomes.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, herr, err := e.Run(ctx, entries(t, 4, -1, 1))
	if err != nil || herr == nil || herr.Index != 0 || len(res) != 0 ||
		!strings.Contains(herr.Error(), "flaky downstream") || strings.Contains(herr.Error(), "deadline") {
		t.Fatalf("%d results, handler error %v, error %v; want record 0 failed with the normal pass's error", len(res), herr, err)
	}
	if c := calls.Load(); c != 2 {
		t.Errorf("%d set calls, want 2 (the normal pass and the bisecting pass)", c)
	}
	// At the last attempt every record ends with an outcome.
	res, herr, err = e.Run(ctx, entries(t, 4, -1, 3))
	if err != nil || herr != nil || len(res) != 4 {
		t.Fatalf("last attempt: %d results, handler error %v, error %v; want 4 outcomes", len(res), herr, err)
	}
	if res[0].Outcome != dedupe.DeadLettered || !strings.Contains(res[0].Reason.Error(), "flaky downstream") {
		t.Errorf("record 0: %s (%v), want dead-lettered with the handler's error", res[0].Outcome, res[0].Reason)
	}
	for i, r := range res {
		if r.Outcome == "" {
			t.Errorf("record %d has no outcome", i)
		}
	}
}

// A set-based handler that swallows a statement's error (it inserts row by
// row without a savepoint and ignores what fails) returns nil with the
// transaction aborted. That is a failure of the call, never an outage:
// bisection, whose calls run under savepoints, finds the one record whose
// statement fails; it alone fails with *handler.AbortedTxError, is
// dead-lettered at its last attempt, and the others commit.
func TestSetSwallowingAnErrorFailsOnlyItsRecord(t *testing.T) {
	h := handler.NewSet("entry", handler.FromPayload(entryKey),
		func(ctx context.Context, tx pgx.Tx, msgs []handler.Message[entry]) error {
			for _, m := range msgs {
				_, _ = tx.Exec(ctx, `insert into entries (id, amount) values ($1, $2)`, m.Value.ID, m.Value.Amount) // swallowed
			}
			return nil
		})
	e, pool := newFormExecutor(t, h)
	ctx := context.Background()
	const n, bad = 8, 5
	res, herr, err := e.Run(ctx, entries(t, n, bad, 1))
	if err != nil {
		t.Fatalf("first attempt: %v (a swallowed error is its record's failure, not an outage)", err)
	}
	var aborted *handler.AbortedTxError
	if herr == nil || herr.Index != bad || !errors.As(herr, &aborted) || len(res) != bad {
		t.Fatalf("first attempt: %d results, handler error %v; want %d applied and record %d failed with *AbortedTxError", len(res), herr, bad, bad)
	}
	res, herr, err = e.Run(ctx, entries(t, n, bad, 3)[bad:])
	if err != nil || herr != nil || len(res) != n-bad {
		t.Fatalf("last attempt: %d results, handler error %v, error %v; want %d", len(res), herr, err, n-bad)
	}
	if res[0].Outcome != dedupe.DeadLettered || !errors.As(res[0].Reason, &aborted) {
		t.Errorf("record %d: %s (%v), want dead-lettered with *AbortedTxError", bad, res[0].Outcome, res[0].Reason)
	}
	for i, r := range res[1:] {
		if r.Outcome != dedupe.Applied {
			t.Errorf("record %d: %s, want applied", bad+1+i, r.Outcome)
		}
	}
	var rows, dead int
	if err := pool.QueryRow(ctx, `select (select count(*) from entries), (select count(*) from dead)`).Scan(&rows, &dead); err != nil {
		t.Fatal(err)
	}
	if rows != n-1 || dead != 1 {
		t.Errorf("%d entries and %d dead letters, want %d and 1", rows, dead, n-1)
	}
}

// A set-based handler that makes an external call per message
// (dedupe.Effects.Call) calls each key once over its whole run, although
// the run calls it on the whole set, then on halves while bisecting (each
// half under its first record's context), then again in the replay, each
// time in a rolled-back or fresh transaction: the run's one memo holds
// every record's result, whichever record's context a call runs under.
func TestSetCallsEachExternalEffectOnceAcrossReplays(t *testing.T) {
	var mu sync.Mutex
	calls := map[string]int{}
	var effects *dedupe.Effects
	h := handler.NewSet("entry", handler.FromPayload(entryKey),
		func(ctx context.Context, tx pgx.Tx, msgs []handler.Message[entry]) error {
			ids, amounts := make([]string, len(msgs)), make([]int64, len(msgs))
			for i, m := range msgs {
				ids[i], amounts[i] = m.Value.ID, m.Value.Amount
				if _, err := effects.Call(ctx, tx, "billing", m.Value.ID, func(_ context.Context, key string) ([]byte, error) {
					mu.Lock()
					defer mu.Unlock()
					calls[key]++
					return []byte("charged"), nil
				}); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `insert into entries (id, amount) select * from unnest($1::text[], $2::bigint[])`, ids, amounts)
			return err
		})
	e, pool := newFormExecutor(t, h)
	effects = dedupe.NewEffects(e.Guard)
	const n, bad = 16, 11
	res, herr, err := e.Run(context.Background(), entries(t, n, bad, 1))
	if err != nil || herr == nil || herr.Index != bad || len(res) != bad {
		t.Fatalf("%d results, handler error %v, error %v; want %d applied and record %d failed", len(res), herr, err, bad, bad)
	}
	for i := range n {
		if id := fmt.Sprintf("e%03d", i); calls[id] != 1 {
			t.Errorf("%s: called %d times over the run (normal pass, bisection, replay), want 1", id, calls[id])
		}
	}
	var done int
	if err := pool.QueryRow(context.Background(), fmt.Sprintf(`select count(*) from %s where state = 'done'`,
		e.Guard.EffectsTable().Sanitize())).Scan(&done); err != nil {
		t.Fatal(err)
	}
	if done != bad {
		t.Errorf("%d effects recorded done, want %d (the committed records')", done, bad)
	}
}

// TestConsecutiveRunsWriteOnlyTheirOwnOutboxRows: an executor's runs take
// the previous transaction's outbox queue again (emptied), so each run's
// rows must be its own: four runs of 25 records, in both handler forms
// that add rows, leave each record's row once, with its own value, and no
// run's row twice.
func TestConsecutiveRunsWriteOnlyTheirOwnOutboxRows(t *testing.T) {
	add := func(ctx context.Context, tx pgx.Tx, m handler.Message[entry]) error {
		return outbox.Add(ctx, tx, outbox.Message{Topic: "entered", Key: []byte(m.Value.ID), Value: m.Record.Value})
	}
	forms := map[string]handler.Any{
		"pipelined": handler.NewPipelined("entry", handler.FromPayload(entryKey),
			func(ctx context.Context, q handler.Queue, m handler.Message[entry]) error { return add(ctx, q.Tx(), m) }),
		"set": handler.NewSet("entry", handler.FromPayload(entryKey),
			func(ctx context.Context, tx pgx.Tx, msgs []handler.Message[entry]) error {
				for _, m := range msgs {
					if err := add(ctx, tx, m); err != nil {
						return err
					}
				}
				return nil
			}),
	}
	for name, h := range forms {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e, pool := newFormExecutor(t, h)
			all := entries(t, 100, -1, 1)
			for run := range 4 {
				res, herr, err := e.Run(ctx, all[run*25:(run+1)*25])
				if err != nil || herr != nil || len(res) != 25 {
					t.Fatalf("run %d: %d results, handler error %v, error %v; want 25 applied", run, len(res), herr, err)
				}
				var rows, keys, wrong int
				err = pool.QueryRow(ctx, `select count(*), count(distinct key),
	count(*) filter (where convert_from(value, 'UTF8')::jsonb->>'id' <> convert_from(key, 'UTF8'))
from exactly_outbox`).Scan(&rows, &keys, &wrong)
				if err != nil {
					t.Fatal(err)
				}
				if want := (run + 1) * 25; rows != want || keys != want || wrong != 0 {
					t.Fatalf("after run %d: %d outbox rows of %d keys, %d with another record's value; want %d rows of %d keys, none wrong", run, rows, keys, wrong, want, want)
				}
			}
		})
	}
}
