package apply_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
	"github.com/exactly-go/exactly/internal/runtime/deferred"
	"github.com/exactly-go/exactly/outbox"
)

// xfer is a transfer of the check tests: Amount from account From to
// account To. Its "id" field names it in the dead table.
type xfer struct {
	ID     string `json:"id"`
	From   string `json:"from"`
	To     string `json:"to"`
	Amount int64  `json:"amount"`
}

// xfers returns n transfers round accounts a0…a4, the one at missing (-1
// for none) to an account that does not exist.
func xfers(t *testing.T, n, missing int) []apply.Item {
	t.Helper()
	items := make([]apply.Item, n)
	for i := range items {
		x := xfer{ID: fmt.Sprintf("x%03d", i), From: fmt.Sprintf("a%d", i%5), To: fmt.Sprintf("a%d", (i+1)%5), Amount: int64(i + 1)}
		if i == missing {
			x.To = "missing"
		}
		v, err := json.Marshal(x)
		if err != nil {
			t.Fatal(err)
		}
		items[i] = apply.Item{Record: handler.Record{Topic: "transfers", Offset: int64(i), Value: v}, Attempt: 1}
	}
	return items
}

// checkedTransfers returns a pipelined transfer handler that queues the
// debit unchecked, the credit with check, and an event; runs counts its
// runs by transfer id.
func checkedTransfers(check func(pgconn.CommandTag) error, runs map[string]int) handler.Any {
	const update = `update accounts set balance = balance + $2 where id = $1`
	return handler.NewPipelined("transfer", handler.FromPayload(func(x xfer) string { return dedupe.Key("transfer", x.ID) }),
		func(ctx context.Context, q handler.Queue, msg handler.Message[xfer]) error {
			x := msg.Value
			runs[x.ID]++
			q.Queue(update, x.From, -x.Amount)
			q.QueueCheck(check, update, x.To, x.Amount)
			return outbox.Add(ctx, q.Tx(), outbox.Message{Topic: "transferred", Key: []byte(x.ID), Value: msg.Record.Value})
		})
}

// newAccounts adds the accounts a0…a4 with 1000 each to the executor's
// database.
func newAccounts(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `create table accounts (id text primary key, balance bigint not null);
		insert into accounts select 'a' || g, 1000 from generate_series(0, 4) g`); err != nil {
		t.Fatal(err)
	}
}

// checkBalances compares the accounts with those the transfers of items
// other than skip (-1 for none) leave, and checks that every event but
// skip's was added.
func checkBalances(t *testing.T, pool *pgxpool.Pool, items []apply.Item, skip int) {
	t.Helper()
	ctx := context.Background()
	want := map[string]int64{"a0": 1000, "a1": 1000, "a2": 1000, "a3": 1000, "a4": 1000}
	for i, it := range items {
		if i == skip {
			continue
		}
		var x xfer
		if err := json.Unmarshal(it.Record.Value, &x); err != nil {
			t.Fatal(err)
		}
		want[x.From] -= x.Amount
		want[x.To] += x.Amount
	}
	got := map[string]int64{}
	rows, err := pool.Query(ctx, `select id, balance from accounts`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var b int64
		if err := rows.Scan(&id, &b); err != nil {
			t.Fatal(err)
		}
		got[id] = b
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("balances %v, want %v", got, want)
	}
	var events int
	var skipped bool
	skipID := fmt.Sprintf("x%03d", skip)
	if err := pool.QueryRow(ctx, `select count(*), coalesce(bool_or(key = $1::bytea), false) from exactly_outbox where topic = 'transferred'`,
		[]byte(skipID)).Scan(&events, &skipped); err != nil {
		t.Fatal(err)
	}
	wantEvents := len(items)
	if skip >= 0 {
		wantEvents--
	}
	if events != wantEvents || skipped {
		t.Errorf("%d events (one of %s: %t), want %d and none of %s", events, skipID, skipped, wantEvents, skipID)
	}
}

// One transfer of ten credits an account that does not exist, its credit
// queued with handler.RowsAffected(1): the check refuses the result before
// anything commits, so that record alone is retried, then dead-lettered at
// its third attempt with a reason naming the check (want 1, got 0); its
// debit and its event, queued beside the refused credit, roll back; the
// other nine commit. (With the checks not called the bad transfer is
// applied; with COMMIT left in the checked pipeline its debit commits and
// the others turn into duplicates.)
func TestPipelinedCheckFailsOnlyItsRecord(t *testing.T) {
	ctx := context.Background()
	runs := map[string]int{}
	e, pool := newFormExecutor(t, checkedTransfers(handler.RowsAffected(1), runs))
	newAccounts(t, pool)
	const bad = 6
	items := xfers(t, 10, bad)
	res := drive(t, e, items)
	if len(res) != 10 {
		t.Fatalf("%d results, want 10", len(res))
	}
	for i, r := range res {
		want := dedupe.Applied
		if i == bad {
			want = dedupe.DeadLettered
		}
		if r.Outcome != want {
			t.Errorf("record %d: %s (%v), want %s", i, r.Outcome, r.Reason, want)
		}
	}
	var rae *handler.RowsAffectedError
	var qe *apply.QueuedError
	reason := res[bad].Reason
	if !errors.As(reason, &rae) || rae.Want != 1 || rae.Got != 0 || !errors.As(reason, &qe) || !qe.Checked || qe.Statement != 1 {
		t.Errorf("reason %v, want a checked *QueuedError of statement 1 wrapping a *RowsAffectedError{Want: 1, Got: 0}", reason)
	}
	if s := fmt.Sprint(reason); !strings.Contains(s, "failed its check") || !strings.Contains(s, "affected 0 rows, want 1") {
		t.Errorf("reason %q does not name the check and its counts", s)
	}
	if runs["x006"] < 3 {
		t.Errorf("the refused transfer ran %d times, want at least 3 (retried before being dead-lettered)", runs["x006"])
	}
	var dead int
	var attempts int
	if err := pool.QueryRow(ctx, `select count(*), coalesce(max(attempts), 0) from dead where id = 'x006'`).Scan(&dead, &attempts); err != nil {
		t.Fatal(err)
	}
	if dead != 1 || attempts != 3 {
		t.Errorf("%d dead letters of x006 after %d attempts, want 1 after 3", dead, attempts)
	}
	checkBalances(t, pool, items, bad)
	c, err := e.Guard.Outcomes(ctx, pool, e.Handler.Scope())
	if err != nil {
		t.Fatal(err)
	}
	if c != (dedupe.Counts{Applied: 9, DeadLettered: 1}) {
		t.Errorf("outcome counters %+v, want 9 applied and 1 dead-lettered", c)
	}
}

// Checks that pass commit everything, in one run, and each check sees its
// own statement's tag.
func TestPipelinedCheckPassingCommitsAll(t *testing.T) {
	var tags []string
	check := func(tag pgconn.CommandTag) error {
		tags = append(tags, tag.String())
		return handler.RowsAffected(1)(tag)
	}
	e, pool := newFormExecutor(t, checkedTransfers(check, map[string]int{}))
	newAccounts(t, pool)
	items := xfers(t, 10, -1)
	res, herr, err := e.Run(context.Background(), items)
	if err != nil || herr != nil || len(res) != 10 {
		t.Fatalf("%d results, handler error %v, error %v; want 10 applied", len(res), herr, err)
	}
	for i, r := range res {
		if r.Outcome != dedupe.Applied {
			t.Errorf("record %d: %s, want applied", i, r.Outcome)
		}
	}
	if len(tags) != 10 || strings.Join(tags, ",") != strings.TrimSuffix(strings.Repeat("UPDATE 1,", 10), ",") {
		t.Errorf("checks saw tags %q, want UPDATE 1 for each of the 10 credits", tags)
	}
	checkBalances(t, pool, items, -1)
}

// A check that panics fails its record with a *handler.PanicError instead
// of crashing the executor; a check that returns handler.Permanent
// dead-letters its record at its first attempt.
func TestPipelinedCheckPanicAndPermanent(t *testing.T) {
	t.Run("panic", func(t *testing.T) {
		e, pool := newFormExecutor(t, checkedTransfers(func(pgconn.CommandTag) error { panic("check exploded") }, map[string]int{}))
		newAccounts(t, pool)
		res, herr, err := e.Run(context.Background(), xfers(t, 3, -1))
		var pe *handler.PanicError
		if err != nil || herr == nil || herr.Index != 0 || len(res) != 0 || !errors.As(herr, &pe) || pe.Value != "check exploded" {
			t.Fatalf("%d results, handler error %v, error %v; want record 0 failed with the check's panic", len(res), herr, err)
		}
		checkBalances(t, pool, nil, -1)
	})
	t.Run("permanent", func(t *testing.T) {
		refuse := func(tag pgconn.CommandTag) error {
			if err := handler.RowsAffected(1)(tag); err != nil {
				return handler.Permanent(err)
			}
			return nil
		}
		e, pool := newFormExecutor(t, checkedTransfers(refuse, map[string]int{}))
		newAccounts(t, pool)
		items := xfers(t, 3, 1)
		res, herr, err := e.Run(context.Background(), items)
		if err != nil || herr != nil || len(res) != 3 || res[1].Outcome != dedupe.DeadLettered || res[0].Outcome != dedupe.Applied || res[2].Outcome != dedupe.Applied {
			t.Fatalf("results %+v, handler error %v, error %v; want record 1 dead-lettered at its first attempt, the others applied", res, herr, err)
		}
		checkBalances(t, pool, items, 1)
	})
}

// A check that outlives the batch deadline (it waits on something) is an
// attempt of its record, as a handler overrunning the deadline is: Run
// returns a *HandlerError at that record's index, not an outage that would
// retry the batch for ever without charging the record; once its attempts
// are exhausted the record is dead-lettered without running, and the
// others commit; when Run returns, no connection of its pool is acquired.
// (With the overrun left to COMMIT, Run fails with the context's error,
// which IsTransient calls an outage.)
func TestPipelinedCheckOverrunningTheDeadlineIsAnAttempt(t *testing.T) {
	// The deadline starts once the database is set up (creating it can
	// take longer than the deadline on a loaded machine); the slow check
	// waits for it.
	var deadline context.Context
	const update = `update accounts set balance = balance + $2 where id = $1`
	var slowChecks int
	h := handler.NewPipelined("transfer", handler.FromPayload(func(x xfer) string { return dedupe.Key("transfer", x.ID) }),
		func(ctx context.Context, q handler.Queue, msg handler.Message[xfer]) error {
			x := msg.Value
			check := handler.RowsAffected(1)
			if x.ID == "x001" {
				check = func(pgconn.CommandTag) error {
					slowChecks++
					<-deadline.Done()
					return nil
				}
			}
			q.QueueCheck(handler.RowsAffected(1), update, x.From, -x.Amount)
			q.QueueCheck(check, update, x.To, x.Amount)
			return outbox.Add(ctx, q.Tx(), outbox.Message{Topic: "transferred", Key: []byte(x.ID), Value: msg.Record.Value})
		})
	e, pool := newFormExecutor(t, h)
	// The outbox's wake after COMMIT notifies the relays through the pool
	// in a goroutine of its own ("never blocks on the database"), which
	// holds a connection for a moment after Run returned: counted here,
	// so that the connections acquired when Run returns are Run's own.
	var wakes atomic.Int32
	e.Wakes = map[string]deferred.Waker{outbox.New().Table().Sanitize(): deferred.WakeFunc(func(*pgxpool.Pool) { wakes.Add(1) })}
	newAccounts(t, pool)
	items := xfers(t, 3, -1)
	deadline, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	res, herr, err := e.Run(deadline, items)
	if err != nil || herr == nil || herr.Index != 1 || len(res) != 0 {
		t.Fatalf("results %v, handler error %v, error %v (transient: %t); want the check's overrun as a handler error at index 1",
			res, herr, err, apply.IsTransient(err))
	}
	if !strings.Contains(herr.Error(), "did not finish within the batch deadline") || !strings.Contains(herr.Error(), "check of statement 1") {
		t.Errorf("handler error %q does not name the overrunning check", herr)
	}
	items[1].Attempt, items[1].Exhausted = 4, herr.Err
	res, herr, err = e.Run(context.Background(), items)
	if err != nil || herr != nil || len(res) != 3 || res[0].Outcome != dedupe.Applied || res[1].Outcome != dedupe.DeadLettered || res[2].Outcome != dedupe.Applied {
		t.Fatalf("results %+v, handler error %v, error %v; want x001 dead-lettered, the others applied", res, herr, err)
	}
	if slowChecks != 1 {
		t.Errorf("the slow check ran %d times, want 1", slowChecks)
	}
	var stuck int
	if err := pool.QueryRow(context.Background(), `select count(*) from pg_stat_activity
		where datname = current_database() and state like 'idle in transaction%'`).Scan(&stuck); err != nil || stuck != 0 {
		t.Errorf("%d transactions left open (%v), want 0", stuck, err)
	}
	if s := e.Pool.Stat(); s.AcquiredConns() != 0 {
		t.Errorf("%d connections still acquired, want 0", s.AcquiredConns())
	}
	if n := wakes.Load(); n != 1 {
		t.Errorf("the outbox was woken %d times, want once (after the run that committed)", n)
	}
	checkBalances(t, pool, items, 1)
}

// When the connection dies after the checked pipeline and before COMMIT,
// which goes alone, the batch fails as an outage (IsTransient): nothing
// commits, no connection stays acquired, and the batch run again applies
// every record once.
func TestPipelinedCheckConnectionLostBeforeCommit(t *testing.T) {
	ctx := context.Background()
	var pool *pgxpool.Pool
	killed := false
	kill := func(tag pgconn.CommandTag) error {
		if !killed {
			killed = true
			// The batch's transaction is the database's only one idle in
			// a transaction: end its backend and wait until it is gone.
			var n int
			if err := pool.QueryRow(ctx, `select count(pg_terminate_backend(pid, 10000)) from pg_stat_activity
				where datname = current_database() and state = 'idle in transaction' and pid <> pg_backend_pid()`).Scan(&n); err != nil || n != 1 {
				t.Errorf("terminated %d backends (%v), want the batch's one", n, err)
			}
		}
		return handler.RowsAffected(1)(tag)
	}
	e, p := newFormExecutor(t, checkedTransfers(kill, map[string]int{}))
	pool = p
	newAccounts(t, pool)
	items := xfers(t, 4, -1)
	res, herr, err := e.Run(ctx, items)
	if err == nil || herr != nil || len(res) != 0 || !apply.IsTransient(err) {
		t.Fatalf("results %v, handler error %v, error %v; want a transient error and no results", res, herr, err)
	}
	awaitReleased(t, e.Pool)
	checkBalances(t, pool, nil, -1)
	var guards int
	if err := pool.QueryRow(ctx, `select count(*) from exactly_guard`).Scan(&guards); err != nil || guards != 0 {
		t.Errorf("%d guard rows committed (%v), want 0", guards, err)
	}
	res, herr, err = e.Run(ctx, items)
	if err != nil || herr != nil || len(res) != 4 {
		t.Fatalf("run again: %d results, handler error %v, error %v; want 4 applied", len(res), herr, err)
	}
	for i, r := range res {
		if r.Outcome != dedupe.Applied {
			t.Errorf("record %d: %s, want applied", i, r.Outcome)
		}
	}
	checkBalances(t, pool, items, -1)
}

// awaitReleased fails t unless every connection of pool is back or gone
// within 5 s: the pool destroys a broken connection in a goroutine of its
// own, which holds it acquired until then.
func awaitReleased(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); pool.Stat().AcquiredConns() != 0; {
		if time.Now().After(end) {
			t.Errorf("%d connections still acquired after 5 s, want 0", pool.Stat().AcquiredConns())
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A router's batch mixes checked pipelined transfers, set-based entries, a
// tx-form transfer and a duplicate: the check that refuses (a transfer to a
// missing account) fails only its transfer, which is dead-lettered after
// its attempts; the set call, the tx-form record and the other transfers
// commit; the duplicate's handler and checks never run; each check sees
// its own statement (no check is run on another record's tag).
func TestPipelinedCheckInAMixedBatch(t *testing.T) {
	ctx := context.Background()
	const update = `update accounts set balance = balance + $2 where id = $1`
	runs, checks := map[string]int{}, map[string]int{}
	xferKey := handler.FromPayload(func(x xfer) string { return dedupe.Key("transfer", x.ID) })
	piped := handler.NewPipelined("transfer", xferKey,
		func(ctx context.Context, q handler.Queue, msg handler.Message[xfer]) error {
			x := msg.Value
			runs[x.ID]++
			check := func(tag pgconn.CommandTag) error {
				checks[x.ID]++
				return handler.RowsAffected(1)(tag)
			}
			q.QueueCheck(check, update, x.From, -x.Amount)
			q.QueueCheck(check, update, x.To, x.Amount)
			return outbox.Add(ctx, q.Tx(), outbox.Message{Topic: "transferred", Key: []byte(x.ID), Value: msg.Record.Value})
		})
	txForm := handler.New("txtransfer", xferKey, func(ctx context.Context, tx pgx.Tx, msg handler.Message[xfer]) error {
		x := msg.Value
		runs[x.ID]++
		for _, m := range []struct {
			id    string
			delta int64
		}{{x.From, -x.Amount}, {x.To, x.Amount}} {
			if tag, err := tx.Exec(ctx, update, m.id, m.delta); err != nil || tag.RowsAffected() != 1 {
				return fmt.Errorf("account %s: %v (%s)", m.id, err, tag)
			}
		}
		return nil
	})
	set := handler.NewSet("ledger", handler.FromPayload(entryKey), func(ctx context.Context, tx pgx.Tx, msgs []handler.Message[entry]) error {
		for _, m := range msgs {
			runs[m.Value.ID]++
			if _, err := tx.Exec(ctx, `insert into entries (id, amount) values ($1, $2)`, m.Value.ID, m.Value.Amount); err != nil {
				return err
			}
		}
		return nil
	})
	r := handler.NewRouter("mixed", handler.ByHeader("type"),
		handler.Route("xfer", piped), handler.Route("txxfer", txForm), handler.Route("entry", set))
	e, pool := newFormExecutor(t, r)
	newAccounts(t, pool)
	item := func(off int, typ string, v any) apply.Item {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return apply.Item{Record: handler.Record{Topic: "mixed", Offset: int64(off), Value: b,
			Headers: []handler.Header{{Key: "type", Value: []byte(typ)}}}, Attempt: 1}
	}
	// x009 is applied first, so that its copy in the batch is a duplicate.
	if res, herr, err := e.Run(ctx, []apply.Item{item(0, "xfer", xfer{ID: "x009", From: "a4", To: "a0", Amount: 9})}); err != nil || herr != nil || len(res) != 1 || res[0].Outcome != dedupe.Applied {
		t.Fatalf("first run: %v %v %v", res, herr, err)
	}
	items := []apply.Item{
		item(1, "xfer", xfer{ID: "x000", From: "a0", To: "a1", Amount: 1}),
		item(2, "entry", entry{ID: "e001", Amount: 5}),
		item(3, "xfer", xfer{ID: "x002", From: "a1", To: "missing", Amount: 2}),
		item(4, "xfer", xfer{ID: "x009", From: "a4", To: "a0", Amount: 9}),
		item(5, "txxfer", xfer{ID: "x003", From: "a2", To: "a3", Amount: 3}),
		item(6, "entry", entry{ID: "e004", Amount: 7}),
		item(7, "xfer", xfer{ID: "x005", From: "a3", To: "a4", Amount: 5}),
	}
	res := drive(t, e, items)
	want := []dedupe.Outcome{dedupe.Applied, dedupe.Applied, dedupe.DeadLettered, dedupe.Duplicate, dedupe.Applied, dedupe.Applied, dedupe.Applied}
	checkOutcomes(t, res, want...)
	var rae *handler.RowsAffectedError
	if !errors.As(res[2].Reason, &rae) || rae.Got != 0 {
		t.Errorf("x002's reason %v, want its RowsAffected(1) check's refusal", res[2].Reason)
	}
	if runs["x009"] != 1 || checks["x009"] != 2 {
		t.Errorf("x009 ran %d times with %d checks, want 1 run and 2 checks (its duplicate copy runs neither)", runs["x009"], checks["x009"])
	}
	// A transfer's two checks run in every pass that sends its pipeline,
	// and only on its own statements: as often as it ran, twice each.
	for id, n := range runs {
		if id[0] == 'x' && id != "x003" && checks[id] > 2*n {
			t.Errorf("%s: %d checks in %d runs, want at most 2 per run", id, checks[id], n)
		}
	}
	if checks["x002"] == 0 || checks["x003"] != 0 {
		t.Errorf("checks by transfer %v: want x002's run, none for the tx-form x003", checks)
	}
	var balances string
	if err := pool.QueryRow(ctx, `select string_agg(id || '=' || balance, ' ' order by id) from accounts`).Scan(&balances); err != nil {
		t.Fatal(err)
	}
	// x009: a4 -9, a0 +9; x000: a0 -1, a1 +1; x003: a2 -3, a3 +3; x005: a3 -5, a4 +5.
	if wantB := "a0=1008 a1=1001 a2=997 a3=998 a4=996"; balances != wantB {
		t.Errorf("balances %s, want %s (x002's debit rolled back)", balances, wantB)
	}
	var ents, events int
	if err := pool.QueryRow(ctx, `select (select count(*) from entries), (select count(*) from exactly_outbox where topic = 'transferred')`).Scan(&ents, &events); err != nil {
		t.Fatal(err)
	}
	if ents != 2 || events != 3 {
		t.Errorf("%d entries and %d transfer events, want 2 (e001, e004) and 3 (x009, x000, x005)", ents, events)
	}
}

// A record whose first statement is checked, queued right after another
// record's unchecked statements: when its check refuses the result, that
// record is charged, the one queued before it applies. (Every other check
// test queues an unchecked statement of the same record just before the
// checked one, so a refusal charged to the owner of the statement before
// went unnoticed.)
func TestPipelinedCheckOnFirstStatementChargesItsOwnRecord(t *testing.T) {
	ctx := context.Background()
	const update = `update accounts set balance = balance + $2 where id = $1`
	runs := map[string]int{}
	h := handler.NewPipelined("transfer", handler.FromPayload(func(x xfer) string { return dedupe.Key("transfer", x.ID) }),
		func(ctx context.Context, q handler.Queue, msg handler.Message[xfer]) error {
			x := msg.Value
			runs[x.ID]++
			if x.ID == "x001" {
				// The credit comes first, checked: it is the record's first
				// statement, right after x000's unchecked ones.
				q.QueueCheck(handler.RowsAffected(1), update, x.To, x.Amount)
				q.Queue(update, x.From, -x.Amount)
				return nil
			}
			q.Queue(update, x.From, -x.Amount)
			q.Queue(update, x.To, x.Amount)
			return nil
		})
	e, pool := newFormExecutor(t, h)
	newAccounts(t, pool)
	items := xfers(t, 2, 1)
	first, herr, err := e.Run(ctx, items)
	if err != nil || herr == nil || herr.Index != 1 || len(first) != 1 || first[0].Outcome != dedupe.Applied {
		t.Fatalf("results %+v, handler error %v, error %v; want x000 applied and x001 charged with its check's refusal (index 1)", first, herr, err)
	}
	items[1].Attempt++
	res := append(first, drive(t, e, items[1:])...)
	checkOutcomes(t, res, dedupe.Applied, dedupe.DeadLettered)
	var qe *apply.QueuedError
	var rae *handler.RowsAffectedError
	if len(res) == 2 && (!errors.As(res[1].Reason, &qe) || !qe.Checked || qe.Statement != 0 || !errors.As(res[1].Reason, &rae)) {
		t.Errorf("x001's reason %v, want a checked *QueuedError of its statement 0 wrapping a *RowsAffectedError", res[1].Reason)
	}
	if runs["x001"] != 3 {
		t.Errorf("x001 ran %d times, want 3 (its attempts)", runs["x001"])
	}
	var balances string
	if err := pool.QueryRow(ctx, `select string_agg(id || '=' || balance, ' ' order by id) from accounts`).Scan(&balances); err != nil {
		t.Fatal(err)
	}
	// x000: a0 -1, a1 +1; x001 (a1 to the missing account) rolled back.
	if want := "a0=999 a1=1001 a2=1000 a3=1000 a4=1000"; balances != want {
		t.Errorf("balances %s, want %s", balances, want)
	}
}

// A statement a pipelined handler queued that runs past the batch's
// deadline (here it sleeps; in production it waits on a lock or scans too
// much) is an attempt of its record, as a tx-form handler's slow statement
// is: the server ends it (statement_timeout, set from the deadline) before
// the deadline cancels the pipeline, so the failure names its statement.
// Without that, the pipeline was lost as a whole, an outage retried for
// ever that never charged the record. The record is dead-lettered after
// its attempts, the others commit, and no run waits for the sleep.
func TestPipelinedStatementOverrunningTheDeadlineIsAnAttempt(t *testing.T) {
	var slowRuns atomic.Int32
	h := handler.NewPipelined("entry", handler.FromPayload(entryKey),
		func(ctx context.Context, q handler.Queue, msg handler.Message[entry]) error {
			if msg.Value.ID == "e001" {
				slowRuns.Add(1)
				q.Queue(`select pg_sleep(30)`)
			}
			q.Queue(`insert into entries (id, amount) values ($1, $2)`, msg.Value.ID, msg.Value.Amount)
			return nil
		})
	e, pool := newFormExecutor(t, h)
	start := time.Now()
	res := driveWithin(t, e, entries(t, 3, -1, 1), 2*time.Second)
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the runs took %s: the sleeping statement was waited for", took)
	}
	want := []dedupe.Outcome{dedupe.Applied, dedupe.DeadLettered, dedupe.Applied}
	checkOutcomes(t, res, want...)
	var qe *apply.QueuedError
	var pgErr *pgconn.PgError
	if reason := res[1].Reason; !errors.As(reason, &qe) || qe.Statement != 0 || !errors.As(reason, &pgErr) || pgErr.Code != "57014" {
		t.Errorf("reason %v, want a *QueuedError of statement 0 wrapping the server's statement timeout (57014)", reason)
	}
	if n := slowRuns.Load(); n != 3 {
		t.Errorf("the slow handler ran %d times, want 3 (its attempts)", n)
	}
	var rows int
	if err := pool.QueryRow(context.Background(), `select count(*) from entries`).Scan(&rows); err != nil || rows != 2 {
		t.Errorf("%d entries (%v), want 2", rows, err)
	}
	if s := e.Pool.Stat(); s.AcquiredConns() != 0 {
		t.Errorf("%d connections still acquired, want 0", s.AcquiredConns())
	}
}

// The statement timeout a pipeline gets is nine tenths of what is left of
// its deadline, and none without a deadline or with almost nothing left.
func TestStatementTimeoutLeavesTheServerTimeToFireFirst(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ms, err := strconv.Atoi(apply.StatementTimeout(ctx)); err != nil || ms < 8500 || ms > 9000 {
		t.Errorf("10 s left: timeout %q ms, want about 9000", apply.StatementTimeout(ctx))
	}
	if got := apply.StatementTimeout(context.Background()); got != "0" {
		t.Errorf("no deadline: timeout %q, want 0 (none)", got)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel2()
	if got := apply.StatementTimeout(short); got != "0" {
		t.Errorf("5 ms left: timeout %q, want 0 (the deadline decides)", got)
	}
}

// checkOutcomes fails t unless res holds one result per outcome of want,
// in order.
func checkOutcomes(t *testing.T, res []apply.Result, want ...dedupe.Outcome) {
	t.Helper()
	if len(res) != len(want) {
		t.Fatalf("%d results, want %d", len(res), len(want))
	}
	for i, r := range res {
		if r.Outcome != want[i] {
			t.Errorf("record %d: %s (%v), want %s", i, r.Outcome, r.Reason, want[i])
		}
	}
}
