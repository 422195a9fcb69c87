package apply_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
)

// A router decides per record whether a guard row is claimed: records of
// its NaturallyIdempotent route claim none, however many share a key, while
// its guarded route still deduplicates. (A router-wide "guarded" made the
// second snapshot of one account a duplicate and dropped it.)
func TestRouterClaimsGuardRowsPerRoute(t *testing.T) {
	ctx := context.Background()
	ran := map[string]int{}
	fn := func(name string) handler.Func[entry] {
		return func(context.Context, pgx.Tx, handler.Message[entry]) error { ran[name]++; return nil }
	}
	r := handler.NewRouter("acct", handler.ByHeader("type"),
		handler.Route("deposit", handler.New("deposit", handler.FromPayload(entryKey), fn("deposit"))),
		handler.Route("snapshot", handler.New("snapshot", handler.FromPayload(entryKey), fn("snapshot"), handler.NaturallyIdempotent())))
	e, pool := newFormExecutor(t, r)
	items := entries(t, 4, -1, 1)
	// Two snapshots and two deposits of one entry id each.
	for i, typ := range []string{"snapshot", "snapshot", "deposit", "deposit"} {
		items[i].Record.Value = items[0].Record.Value
		items[i].Record.Headers = []handler.Header{{Key: "type", Value: []byte(typ)}}
	}
	var outcomes []dedupe.Outcome
	for len(items) > 0 { // a repeated guarded key ends a batch: run until all are done
		res, herr, err := e.Run(ctx, items)
		if err != nil || herr != nil || len(res) == 0 {
			t.Fatalf("%d results, handler error %v, error %v", len(res), herr, err)
		}
		for _, r := range res {
			outcomes = append(outcomes, r.Outcome)
		}
		items = items[len(res):]
	}
	want := []dedupe.Outcome{dedupe.Applied, dedupe.Applied, dedupe.Applied, dedupe.Duplicate}
	for i := range want {
		if outcomes[i] != want[i] {
			t.Fatalf("outcomes %v, want %v", outcomes, want)
		}
	}
	if ran["snapshot"] != 2 || ran["deposit"] != 1 {
		t.Fatalf("handler runs %v, want snapshot 2 and deposit 1", ran)
	}
	var guarded int
	if err := pool.QueryRow(ctx, `select count(*) from exactly_guard where scope = 'snapshot'`).Scan(&guarded); err != nil {
		t.Fatal(err)
	}
	if guarded != 0 {
		t.Fatalf("%d guard rows claimed for the naturally idempotent route, want 0", guarded)
	}
	// The unguarded route's applied records are in the counter rows, the
	// guarded route's in its guard rows: every delivery counted once.
	for scope, want := range map[string]dedupe.Counts{"snapshot": {Applied: 2}, "deposit": {Applied: 1, Duplicate: 1}} {
		if c, err := e.Guard.Outcomes(ctx, pool, scope); err != nil || c != want {
			t.Errorf("Outcomes(%s) = %+v, %v; want %+v", scope, c, err, want)
		}
	}
}
