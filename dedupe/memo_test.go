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
