package dedupe_test

import (
	"context"
	"testing"

	"github.com/exactly-go/exactly/internal/runtime/memo"
)

// Inside a consumer's run, a call made in a transaction that was rolled back
// (a later record of the batch failed) is not made again when the record's
// handler runs in the replay: Call and CallReconciled record the
// remembered result in the new transaction. Without the run's memo (a new
// delivery), Call calls again with the same idempotency key.
func TestCallsRememberedAcrossReplays(t *testing.T) {
	e, pool := effects(t)
	x := newExternal()
	var m memo.Memo
	ctx := memo.With(context.Background(), &m)
	for _, tc := range []struct {
		name string
		call func(ctx context.Context) ([]byte, error)
	}{
		{"Call", func(ctx context.Context) ([]byte, error) {
			tx := begin(t, pool)
			defer tx.Rollback(ctx) //nolint:errcheck // the run is rolled back
			return e.Call(ctx, tx, "billing", "order-1", x.withKey)
		}},
		{"CallReconciled", func(ctx context.Context) ([]byte, error) {
			tx := begin(t, pool)
			defer tx.Rollback(ctx) //nolint:errcheck // the run is rolled back
			return e.CallReconciled(ctx, pool, tx, "billing", "order-2", x.noKey,
				func(context.Context, string) ([]byte, bool, error) { return nil, false, nil }) // sees nothing yet
		}},
	} {
		before, _ := x.counts()
		first, err := tc.call(ctx)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		again, err := tc.call(ctx) // the replay, in a fresh transaction
		if err != nil || string(again) != string(first) {
			t.Fatalf("%s replayed: %q, %v; want %q", tc.name, again, err, first)
		}
		if calls, _ := x.counts(); calls-before != 1 {
			t.Errorf("%s: %d calls over a run and its replay, want 1", tc.name, calls-before)
		}
	}
	before, _ := x.counts()
	if _, err := e.Call(context.Background(), begin(t, pool), "billing", "order-1", x.withKey); err != nil {
		t.Fatal(err)
	}
	if calls, _ := x.counts(); calls-before != 1 {
		t.Errorf("a delivery outside the run called %d times, want 1 (nothing remembered)", calls-before)
	}
}

// A remembered result (the record's pre-transaction call, or a call in a
// rolled-back run) is looked up and recorded in one statement, and a result
// recorded first still wins: Call returns the recorded one without calling,
// whether it was committed before the statement, recorded in the same
// transaction, or committed by a concurrent transaction while the statement
// waited for its row. With nothing recorded, the remembered result is
// recorded and returned.
func TestRememberedResultYieldsToRecorded(t *testing.T) {
	e, pool := effects(t)
	ctx := context.Background()
	x := newExternal()
	run := func() context.Context {
		var m memo.Memo
		rctx := memo.With(ctx, &m)
		if _, err := e.Precall(rctx, "billing", "k", func(context.Context, string) ([]byte, error) { return []byte("mine"), nil }); err != nil {
			t.Fatal(err)
		}
		return rctx
	}
	uniq := func(s string) string { return s + "-" + t.Name() }

	// Nothing recorded: the remembered result is recorded.
	rctx := run()
	tx := begin(t, pool)
	got, err := e.Call(rctx, tx, "billing", "k", x.withKey)
	if err != nil || string(got) != "mine" {
		t.Fatalf("nothing recorded: %q, %v; want mine", got, err)
	}
	if ef, found := lookup(t, e, tx, "billing", "k"); !found || string(ef.Result) != "mine" || ef.State != "done" {
		t.Fatalf("nothing recorded: row %+v found=%v, want done mine", ef, found)
	}
	// Recorded in the same transaction: a second Call returns it.
	again, err := e.Call(rctx, tx, "billing", "k", x.withKey)
	if err != nil || string(again) != "mine" {
		t.Fatalf("recorded in the same transaction: %q, %v", again, err)
	}
	commit(t, tx)

	// Committed before: the recorded result wins over the remembered one.
	theirs := begin(t, pool)
	if _, err := e.Call(ctx, theirs, "billing", uniq("a"), func(context.Context, string) ([]byte, error) { return []byte("theirs"), nil }); err != nil {
		t.Fatal(err)
	}
	commit(t, theirs)
	var m memo.Memo
	rctx = memo.With(ctx, &m)
	if _, err := e.Precall(rctx, "billing", uniq("a"), func(context.Context, string) ([]byte, error) { return []byte("mine"), nil }); err != nil {
		t.Fatal(err)
	}
	tx = begin(t, pool)
	if got, err := e.Call(rctx, tx, "billing", uniq("a"), x.withKey); err != nil || string(got) != "theirs" {
		t.Fatalf("committed before: %q, %v; want theirs", got, err)
	}
	_ = tx.Rollback(ctx)

	// Committed by a concurrent transaction while Call waits for the row.
	first := begin(t, pool)
	if _, err := e.Call(ctx, first, "billing", uniq("b"), func(context.Context, string) ([]byte, error) { return []byte("first"), nil }); err != nil {
		t.Fatal(err)
	}
	var m2 memo.Memo
	rctx = memo.With(ctx, &m2)
	if _, err := e.Precall(rctx, "billing", uniq("b"), func(context.Context, string) ([]byte, error) { return []byte("mine"), nil }); err != nil {
		t.Fatal(err)
	}
	second := begin(t, pool)
	defer second.Rollback(ctx) //nolint:errcheck // read only
	var pid int
	if err := second.QueryRow(ctx, "select pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	type res struct {
		b   []byte
		err error
	}
	done := make(chan res, 1)
	go func() {
		b, err := e.Call(rctx, second, "billing", uniq("b"), x.withKey)
		done <- res{b, err}
	}()
	for waiting := false; !waiting; {
		if err := pool.QueryRow(ctx, "select coalesce(wait_event_type = 'Lock', false) from pg_stat_activity where pid = $1", pid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	commit(t, first)
	r := <-done
	if r.err != nil || string(r.b) != "first" {
		t.Fatalf("committed while waiting: %q, %v; want first", r.b, r.err)
	}
	if calls, _ := x.counts(); calls != 0 {
		t.Errorf("%d calls with a remembered result, want 0", calls)
	}
}
