package dedupe_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
)

// Counters are appended, one row per Count (no row is updated, so
// concurrent batches never wait on a counter row); Outcomes sums them; the
// pruner rolls the rows of each (scope, topic, partition) into one without
// changing the totals, in a table with a custom name.
func TestOutcomeCountersAppendAndRollUp(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t, dedupe.WithTable("", "my guard"))
	count := func(scope string, partition int32, c dedupe.Counts) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return g.Count(ctx, tx, scope, "orders", partition, c)
		}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		count("credit", 0, dedupe.Counts{Applied: 2, Duplicate: 1})
		count("credit", 1, dedupe.Counts{DeadLettered: 1})
		count("notify", 0, dedupe.Counts{Applied: 5})
	}
	count("credit", 1, dedupe.Counts{}) // nothing to count: no row
	rows := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `select count(*) from `+g.OutcomeTable().Sanitize()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := rows(); n != 9 {
		t.Errorf("%d counter rows after 9 counts, want 9 (append-only)", n)
	}
	want := dedupe.Counts{Applied: 6, Duplicate: 3, DeadLettered: 3}
	if c, err := g.Outcomes(ctx, pool, "credit"); err != nil || c != want {
		t.Fatalf("Outcomes = %+v, %v; want %+v", c, err, want)
	}

	p, err := g.NewPruner(pool, dedupe.PrunerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ran, err := p.PruneOnce(ctx); err != nil || !ran {
		t.Fatalf("PruneOnce: ran %v, %v", ran, err)
	}
	if n := rows(); n != 3 {
		t.Errorf("%d counter rows after the roll-up, want 3 (one per scope, topic and partition)", n)
	}
	if c, err := g.Outcomes(ctx, pool, "credit"); err != nil || c != want {
		t.Errorf("after the roll-up, Outcomes = %+v, %v; want %+v", c, err, want)
	}
	if c, err := g.Outcomes(ctx, pool, "notify"); err != nil || c != (dedupe.Counts{Applied: 15}) {
		t.Errorf("after the roll-up, notify Outcomes = %+v, %v; want 15 applied", c, err)
	}
}
