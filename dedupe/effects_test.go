package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
)

// external is a fake external system: effects by key, and how often it was
// called and asked.
type external struct {
	mu         sync.Mutex
	effects    map[string]string // key -> result
	calls      int
	reconciles int
	keys       []string
	// failNext makes the next call fail: before acting (the request never
	// arrived) or after acting (the response was lost).
	failBefore, failAfter bool
}

var errUnavailable = errors.New("external system unavailable")

func newExternal() *external { return &external{effects: map[string]string{}} }

// withKey acts like an API that honours idempotency keys.
func (x *external) withKey(_ context.Context, key string) ([]byte, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.calls++
	x.keys = append(x.keys, key)
	if r, ok := x.effects[key]; ok {
		return []byte(r), nil
	}
	r := fmt.Sprintf("result-%d", len(x.effects)+1)
	x.effects[key] = r
	return []byte(r), nil
}

// noKey acts every time it is called (the key is only a reference stored
// with the effect).
func (x *external) noKey(_ context.Context, key string) ([]byte, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.calls++
	x.keys = append(x.keys, key)
	if x.failBefore {
		x.failBefore = false
		return nil, errUnavailable
	}
	r := fmt.Sprintf("result-%d", x.calls)
	x.effects[fmt.Sprintf("%s#%d", key, x.calls)] = r
	x.effects[key] = r
	if x.failAfter {
		x.failAfter = false
		return nil, errUnavailable
	}
	return []byte(r), nil
}

func (x *external) reconcile(_ context.Context, key string) ([]byte, bool, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.reconciles++
	r, ok := x.effects[key]
	return []byte(r), ok, nil
}

func (x *external) counts() (calls, reconciles int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.calls, x.reconciles
}

func effects(t *testing.T, opts ...dedupe.Option) (*dedupe.Effects, *pgxpool.Pool) {
	t.Helper()
	g, pool := migrated(t, opts...)
	return dedupe.NewEffects(g), pool
}

func commit(t *testing.T, tx pgx.Tx) {
	t.Helper()
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func lookup(t *testing.T, e *dedupe.Effects, q dedupe.Querier, scope, key string) (dedupe.Effect, bool) {
	t.Helper()
	ef, found, err := e.Lookup(context.Background(), q, scope, key)
	if err != nil {
		t.Fatal(err)
	}
	return ef, found
}

// A result recorded and committed is returned without calling again.
func TestCallReturnsRecordedResultWithoutCalling(t *testing.T) {
	ctx := context.Background()
	e, pool := effects(t)
	x := newExternal()
	key := dedupe.Key("charge", "order-1")

	tx := begin(t, pool)
	r, err := e.Call(ctx, tx, "billing", key, x.withKey)
	if err != nil || string(r) != "result-1" {
		t.Fatalf("Call = %q, %v", r, err)
	}
	if ef, found := lookup(t, e, tx, "billing", key); !found || ef.State != dedupe.Done || string(ef.Result) != "result-1" {
		t.Fatalf("inside tx: %+v, %v", ef, found)
	}
	if _, found := lookup(t, e, pool, "billing", key); found {
		t.Fatal("result visible outside the uncommitted transaction")
	}
	commit(t, tx)

	tx = begin(t, pool)
	r, err = e.Call(ctx, tx, "billing", key, x.withKey)
	if err != nil || string(r) != "result-1" {
		t.Fatalf("second Call = %q, %v", r, err)
	}
	commit(t, tx)
	if calls, _ := x.counts(); calls != 1 {
		t.Fatalf("%d calls, want 1: the recorded result must be returned without calling", calls)
	}
	if x.keys[0] != key {
		t.Fatalf("idempotency key %q, want the job's key %q", x.keys[0], key)
	}
	// Another scope is another operation.
	tx = begin(t, pool)
	if _, err := e.Call(ctx, tx, "other", key, x.withKey); err != nil {
		t.Fatal(err)
	}
	if calls, _ := x.counts(); calls != 2 {
		t.Fatalf("%d calls, want 2 (scopes are separate)", calls)
	}
}

// The handler's transaction rolls back after the call: no result stays
// recorded, and the next attempt calls again with the same idempotency key.
func TestCallRollbackLeavesNoResult(t *testing.T) {
	ctx := context.Background()
	e, pool := effects(t)
	x := newExternal()
	key := dedupe.Key("charge", "order-2")

	tx := begin(t, pool)
	if _, err := e.Call(ctx, tx, "billing", key, x.withKey); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if ef, found := lookup(t, e, pool, "billing", key); found {
		t.Fatalf("after rollback the effect row is %+v", ef)
	}
	if n := count(t, pool, `select count(*) from exactly_guard_effects`); n != 0 {
		t.Fatalf("%d effect rows after rollback", n)
	}

	tx = begin(t, pool)
	r, err := e.Call(ctx, tx, "billing", key, x.withKey)
	if err != nil || string(r) != "result-1" {
		t.Fatalf("Call after rollback = %q, %v", r, err)
	}
	commit(t, tx)
	if len(x.keys) != 2 || x.keys[0] != x.keys[1] {
		t.Fatalf("idempotency keys %q: want the same key twice", x.keys)
	}
	if len(x.effects) != 1 {
		t.Fatalf("%d effects at the provider, want 1", len(x.effects))
	}
}

func TestCallErrors(t *testing.T) {
	ctx := context.Background()
	e, pool := effects(t)
	tx := begin(t, pool)

	_, err := e.Call(ctx, tx, "billing", "k", func(context.Context, string) ([]byte, error) { return nil, errUnavailable })
	var ee *dedupe.EffectError
	if !errors.Is(err, errUnavailable) || !errors.As(err, &ee) || ee.Step != dedupe.StepCall || ee.Scope != "billing" || ee.Key != "k" {
		t.Fatalf("Call error = %v (%#v)", err, ee)
	}
	// Nothing recorded, and tx is still usable.
	if _, found := lookup(t, e, tx, "billing", "k"); found {
		t.Fatal("a failed call recorded a result")
	}
	x := newExternal()
	if _, err := e.Call(ctx, tx, "billing", "", x.withKey); !errors.Is(err, dedupe.ErrEmptyKey) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := e.Call(ctx, tx, "bad\x00scope", "k", x.withKey); !errors.Is(err, dedupe.ErrInvalidScope) {
		t.Fatalf("bad scope: %v", err)
	}
	if _, err := e.Call(ctx, tx, "billing", "k", nil); !errors.Is(err, dedupe.ErrNilFunc) {
		t.Fatalf("nil call: %v", err)
	}
	if _, err := e.CallReconciled(ctx, pool, tx, "billing", "k", x.noKey, nil); !errors.Is(err, dedupe.ErrNilFunc) {
		t.Fatalf("nil reconcile: %v", err)
	}
	if _, err := e.CallReconciled(ctx, nil, tx, "billing", "k", x.noKey, x.reconcile); !errors.Is(err, dedupe.ErrNilFunc) {
		t.Fatalf("nil db: %v", err)
	}
	if calls, _ := x.counts(); calls != 0 {
		t.Fatalf("%d calls on invalid input", calls)
	}
}

func TestCallJSON(t *testing.T) {
	ctx := context.Background()
	e, pool := effects(t)
	type charge struct {
		ID     string `json:"id"`
		Amount int64  `json:"amount"`
	}
	calls := 0
	call := func(_ context.Context, key string) (charge, error) {
		calls++
		return charge{ID: "ch_" + key, Amount: 500}, nil
	}
	for range 2 {
		tx := begin(t, pool)
		c, err := dedupe.CallJSON(ctx, e, tx, "billing", "o-1", call)
		if err != nil || c != (charge{ID: "ch_o-1", Amount: 500}) {
			t.Fatalf("CallJSON = %+v, %v", c, err)
		}
		commit(t, tx)
	}
	if calls != 1 {
		t.Fatalf("%d calls, want 1", calls)
	}
	// A recorded result that does not decode into R.
	tx := begin(t, pool)
	_, err := dedupe.CallJSON(ctx, e, tx, "billing", "o-1", func(context.Context, string) (int, error) { return 0, nil })
	var ee *dedupe.EffectError
	if !errors.As(err, &ee) || ee.Step != dedupe.StepDecode {
		t.Fatalf("decode error = %v", err)
	}
	// A result that cannot be encoded.
	tx2 := begin(t, pool)
	_, err = dedupe.CallJSON(ctx, e, tx2, "billing", "o-2", func(context.Context, string) (chan int, error) { return nil, nil })
	if !errors.As(err, &ee) || ee.Step != dedupe.StepEncode {
		t.Fatalf("encode error = %v", err)
	}
}

// "started" is committed, in its own transaction, before the call; "done"
// commits with the handler's transaction.
func TestCallReconciledCommitsStartedBeforeCalling(t *testing.T) {
	ctx := context.Background()
	e, pool := effects(t)
	x := newExternal()
	tx := begin(t, pool)
	var during dedupe.Effect
	var seen bool
	r, err := e.CallReconciled(ctx, pool, tx, "refunds", "refund:o-1",
		func(ctx context.Context, key string) ([]byte, error) {
			during, seen = lookup(t, e, pool, "refunds", "refund:o-1") // another connection
			return x.noKey(ctx, key)
		}, x.reconcile)
	if err != nil || string(r) != "result-1" {
		t.Fatalf("CallReconciled = %q, %v", r, err)
	}
	if !seen || during.State != dedupe.Started || during.Attempts != 1 || during.StartedAt.IsZero() {
		t.Fatalf("during the call, outside tx: %+v (found %v); want started, committed", during, seen)
	}
	if ef, _ := lookup(t, e, pool, "refunds", "refund:o-1"); ef.State != dedupe.Started {
		t.Fatalf("before commit, outside tx: %+v; want still started", ef)
	}
	commit(t, tx)
	ef, _ := lookup(t, e, pool, "refunds", "refund:o-1")
	if ef.State != dedupe.Done || string(ef.Result) != "result-1" || ef.DoneAt.IsZero() {
		t.Fatalf("after commit: %+v", ef)
	}
	// Done: neither called nor reconciled again.
	tx = begin(t, pool)
	if r, err := e.CallReconciled(ctx, pool, tx, "refunds", "refund:o-1", x.noKey, x.reconcile); err != nil || string(r) != "result-1" {
		t.Fatalf("again = %q, %v", r, err)
	}
	if calls, recs := x.counts(); calls != 1 || recs != 0 {
		t.Fatalf("calls=%d reconciles=%d, want 1 and 0", calls, recs)
	}
}

// The call acts, then the handler's transaction rolls back (as when the
// worker dies before COMMIT): the next attempt reconciles, finds the effect
// and records it without calling again.
func TestCallReconciledRollbackThenReconcileFindsEffect(t *testing.T) {
	ctx := context.Background()
	e, pool := effects(t)
	x := newExternal()
	tx := begin(t, pool)
	if _, err := e.CallReconciled(ctx, pool, tx, "refunds", "refund:o-2", x.noKey, x.reconcile); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if ef, _ := lookup(t, e, pool, "refunds", "refund:o-2"); ef.State != dedupe.Started {
		t.Fatalf("after rollback: %+v; want started to survive", ef)
	}
	tx = begin(t, pool)
	r, err := e.CallReconciled(ctx, pool, tx, "refunds", "refund:o-2", x.noKey, x.reconcile)
	if err != nil || string(r) != "result-1" {
		t.Fatalf("redelivery = %q, %v", r, err)
	}
	commit(t, tx)
	if calls, recs := x.counts(); calls != 1 || recs != 1 {
		t.Fatalf("calls=%d reconciles=%d, want 1 and 1", calls, recs)
	}
	if ef, _ := lookup(t, e, pool, "refunds", "refund:o-2"); ef.State != dedupe.Done || string(ef.Result) != "result-1" {
		t.Fatalf("after redelivery: %+v", ef)
	}
}

// The response is lost after the external system acted: the call fails,
// "started" stays, and the retry finds the effect by reconciling.
func TestCallReconciledLostResponse(t *testing.T) {
	ctx := context.Background()
	e, pool := effects(t)
	x := newExternal()
	x.failAfter = true
	tx := begin(t, pool)
	_, err := e.CallReconciled(ctx, pool, tx, "refunds", "k", x.noKey, x.reconcile)
	var ee *dedupe.EffectError
	if !errors.Is(err, errUnavailable) || !errors.As(err, &ee) || ee.Step != dedupe.StepCall {
		t.Fatalf("err = %v", err)
	}
	_ = tx.Rollback(ctx)
	tx = begin(t, pool)
	if _, err := e.CallReconciled(ctx, pool, tx, "refunds", "k", x.noKey, x.reconcile); err != nil {
		t.Fatal(err)
	}
	commit(t, tx)
	if calls, recs := x.counts(); calls != 1 || recs != 1 {
		t.Fatalf("calls=%d reconciles=%d, want 1 and 1", calls, recs)
	}
}

// The first attempt fails before the external system acted: reconcile says
// it did not happen, and the retry calls exactly once.
func TestCallReconciledReconcileSaysNoCallsOnce(t *testing.T) {
	ctx := context.Background()
	e, pool := effects(t)
	x := newExternal()
	x.failBefore = true
	tx := begin(t, pool)
	if _, err := e.CallReconciled(ctx, pool, tx, "refunds", "k", x.noKey, x.reconcile); !errors.Is(err, errUnavailable) {
		t.Fatalf("err = %v", err)
	}
	_ = tx.Rollback(ctx)
	if ef, _ := lookup(t, e, pool, "refunds", "k"); ef.State != dedupe.Started || ef.Attempts != 1 {
		t.Fatalf("after the failed call: %+v", ef)
	}
	tx = begin(t, pool)
	r, err := e.CallReconciled(ctx, pool, tx, "refunds", "k", x.noKey, x.reconcile)
	if err != nil || string(r) != "result-2" {
		t.Fatalf("retry = %q, %v", r, err)
	}
	commit(t, tx)
	calls, recs := x.counts()
	if calls != 2 || recs != 1 {
		t.Fatalf("calls=%d reconciles=%d, want 2 (one failed before acting) and 1", calls, recs)
	}
	if n := len(x.effects); n != 2 { // the key and one "key#n" entry: one effect
		t.Fatalf("effects %v: want exactly one", x.effects)
	}
	if ef, _ := lookup(t, e, pool, "refunds", "k"); ef.State != dedupe.Done || ef.Attempts != 2 {
		t.Fatalf("after the retry: %+v", ef)
	}
}

// reconcile cannot tell: nothing is called, the error is returned.
func TestCallReconciledReconcileError(t *testing.T) {
	ctx := context.Background()
	e, pool := effects(t)
	x := newExternal()
	tx := begin(t, pool)
	if _, err := e.CallReconciled(ctx, pool, tx, "refunds", "k", x.noKey, x.reconcile); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	tx = begin(t, pool)
	_, err := e.CallReconciled(ctx, pool, tx, "refunds", "k", x.noKey,
		func(context.Context, string) ([]byte, bool, error) { return nil, false, errUnavailable })
	var ee *dedupe.EffectError
	if !errors.Is(err, errUnavailable) || !errors.As(err, &ee) || ee.Step != dedupe.StepReconcile {
		t.Fatalf("err = %v", err)
	}
	if calls, _ := x.counts(); calls != 1 {
		t.Fatalf("%d calls, want 1: a failed reconcile must not call", calls)
	}
}

// Concurrent attempts of one key, without any guard row: the advisory lock
// makes them wait for each other, and the effect happens once.
func TestCallReconciledConcurrentOneEffect(t *testing.T) {
	ctx := context.Background()
	e, pool := effects(t)
	x := newExternal()
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			errs <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := e.CallReconciled(ctx, pool, tx, "refunds", "k", x.noKey, x.reconcile)
				return err
			})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if calls, recs := x.counts(); calls != 1 || recs != 0 {
		t.Fatalf("calls=%d reconciles=%d, want 1 and 0", calls, recs)
	}
}

func TestEffectsTableFollowsGuard(t *testing.T) {
	ctx := context.Background()
	e, pool := effects(t, dedupe.WithTable("s", `we"ird`))
	if got := e.Table(); len(got) != 2 || got[0] != "s" || got[1] != `we"ird_effects` {
		t.Fatalf("Table() = %v", got)
	}
	tx := begin(t, pool)
	if _, err := e.Call(ctx, tx, "sc", "k", newExternal().withKey); err != nil {
		t.Fatal(err)
	}
	commit(t, tx)
	if n := count(t, pool, `select count(*) from s."we""ird_effects"`); n != 1 {
		t.Fatalf("%d rows", n)
	}
}

func TestStaleAndPrune(t *testing.T) {
	ctx := context.Background()
	e, pool := effects(t)
	x := newExternal()
	// One done, one abandoned after "started".
	tx := begin(t, pool)
	if _, err := e.Call(ctx, tx, "sc", "done", x.withKey); err != nil {
		t.Fatal(err)
	}
	commit(t, tx)
	tx = begin(t, pool)
	if _, err := e.CallReconciled(ctx, pool, tx, "sc", "abandoned", x.noKey, x.reconcile); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)

	stale, err := e.Stale(ctx, pool, 0, 10)
	if err != nil || len(stale) != 1 || stale[0].Key != "abandoned" || stale[0].State != dedupe.Started {
		t.Fatalf("Stale = %+v, %v", stale, err)
	}
	if n, err := e.Prune(ctx, pool, 0, 1); err != nil || n != 1 {
		t.Fatalf("Prune = %d, %v", n, err)
	}
	if _, found := lookup(t, e, pool, "sc", "abandoned"); !found {
		t.Fatal("Prune deleted a started row")
	}
	if _, found := lookup(t, e, pool, "sc", "done"); found {
		t.Fatal("Prune kept the done row")
	}
	if _, err := e.Prune(ctx, pool, -1, 0); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("negative age: %v", err)
	}
}
