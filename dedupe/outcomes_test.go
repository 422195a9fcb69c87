package dedupe_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

// claimApplied claims keys as a consumer does (ClaimRecords, with the
// record's topic and partition) and commits, as a batch of applied records
// that writes no counter row.
func claimApplied(t *testing.T, g *dedupe.Guard, pool *pgxpool.Pool, scope string, partition int32, keys ...string) {
	t.Helper()
	claims := make([]dedupe.RecordClaim, len(keys))
	for i, k := range keys {
		claims[i] = dedupe.RecordClaim{Scope: scope, Key: k, Topic: "orders", Partition: partition, Offset: int64(i)}
	}
	if err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		_, err := g.ClaimRecords(t.Context(), tx, claims)
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// A guard row claimed by ClaimRecords counts its own applied delivery: the
// totals add the applied rows to the counter rows, a dead-lettered row is
// not counted as applied, and pruning or releasing rows moves their count
// into a counter row in the same statement, so the totals never change.
func TestClaimedGuardRowsCountThemselves(t *testing.T) {
	ctx := t.Context()
	g, pool := migrated(t)
	claimApplied(t, g, pool, "credit", 0, "a", "b", "c")
	claimApplied(t, g, pool, "credit", 1, "d")
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := g.MarkDeadLettered(ctx, tx, dedupe.RecordClaim{Scope: "credit", Key: "c", Topic: "orders", Partition: 0, Offset: 2}); err != nil {
			return err
		}
		return g.Count(ctx, tx, "credit", "orders", 0, dedupe.Counts{Duplicate: 2, DeadLettered: 1})
	}); err != nil {
		t.Fatal(err)
	}
	want := dedupe.Counts{Applied: 3, Duplicate: 2, DeadLettered: 1}
	check := func(when string) {
		t.Helper()
		if c, err := g.Outcomes(ctx, pool, "credit"); err != nil || c != want {
			t.Fatalf("%s: Outcomes = %+v, %v; want %+v", when, c, err, want)
		}
		rows, err := g.OutcomeRows(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		wantRows := []dedupe.OutcomeRow{
			{Scope: "credit", Topic: "orders", Partition: 0, Counts: dedupe.Counts{Applied: 2, Duplicate: 2, DeadLettered: 1}},
			{Scope: "credit", Topic: "orders", Partition: 1, Counts: dedupe.Counts{Applied: 1}},
		}
		if !slices.Equal(rows, wantRows) {
			t.Fatalf("%s: OutcomeRows = %+v, want %+v", when, rows, wantRows)
		}
	}
	check("after the claims")
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return g.Release(ctx, tx, "credit", "d") }); err != nil {
		t.Fatal(err)
	}
	check("after releasing an applied row")
	if n, err := g.Prune(ctx, pool, 0, 2); err != nil || n != 4 { // a, b, c and c's mark by coordinates
		t.Fatalf("Prune = %d, %v; want 4 rows", n, err)
	}
	check("after pruning every row")
}

// Migration 0006: the guard rows claimed before it, or by an older binary
// still running during a rolling deploy, were counted in the counter rows;
// they do not count themselves, so the totals read are unchanged.
func TestMigrationKeepsTotalsOfRowsCountedBefore(t *testing.T) {
	ctx := t.Context()
	pool := testDB(t)
	g := dedupe.New()
	if err := dedupe.MigrateTo(ctx, g, pool, 5); err != nil {
		t.Fatal(err)
	}
	// What an older consumer did: claim (without self_counted), and count
	// the applied too.
	oldClaim := `insert into exactly_guard (scope, key, topic, kafka_partition, kafka_offset) values ('credit', $1, 'orders', 0, $2)`
	countOld := func() {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, oldClaim, "k"+strconv.Itoa(rand.Int()), 1); err != nil {
				return err
			}
			return g.Count(ctx, tx, "credit", "orders", 0, dedupe.Counts{Applied: 1})
		}); err != nil {
			t.Fatal(err)
		}
	}
	countOld()
	countOld()
	// A reader of a table not yet migrated (a newer binary during the
	// rolling deploy) reads the counter rows alone.
	if c, err := g.Outcomes(ctx, pool, "credit"); err != nil || c != (dedupe.Counts{Applied: 2}) {
		t.Fatalf("before migrating, Outcomes = %+v, %v; want 2 applied", c, err)
	}
	if rows, err := g.OutcomeRows(ctx, pool); err != nil || len(rows) != 1 || rows[0].Applied != 2 {
		t.Fatalf("before migrating, OutcomeRows = %+v, %v; want one row of 2 applied", rows, err)
	}
	if err := g.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	countOld() // an older binary, after the migration
	claimApplied(t, g, pool, "credit", 0, "new")
	if c, err := g.Outcomes(ctx, pool, "credit"); err != nil || c != (dedupe.Counts{Applied: 4}) {
		t.Fatalf("after migrating, Outcomes = %+v, %v; want 4 applied (3 counted by counter rows, 1 by its guard row)", c, err)
	}
}

// Releasing a key in the transaction that claimed it (its record failed and
// its effect was rolled back, as Release's doc describes) unclaims a
// delivery that did not commit: nothing is counted for it, and its
// redelivery, claimed again, counts once. Releasing a row claimed by an
// earlier, committed transaction still keeps its count.
func TestReleaseInClaimingTransactionCountsNothing(t *testing.T) {
	ctx := t.Context()
	g, pool := migrated(t)
	claim := dedupe.RecordClaim{Scope: "credit", Key: "x", Topic: "orders", Partition: 0, Offset: 7}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := g.ClaimRecords(ctx, tx, []dedupe.RecordClaim{claim}); err != nil {
			return err
		}
		// In a savepoint, as a handler rolled back to one would.
		return pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { return g.Release(ctx, sp, "credit", "x") })
	}); err != nil {
		t.Fatal(err)
	}
	if c, err := g.Outcomes(ctx, pool, "credit"); err != nil || c != (dedupe.Counts{}) {
		t.Fatalf("after claiming and releasing in one transaction, Outcomes = %+v, %v; want nothing counted", c, err)
	}
	claimApplied(t, g, pool, "credit", 0, "x") // the redelivery
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return g.Release(ctx, tx, "credit", "x") }); err != nil {
		t.Fatal(err)
	}
	if c, err := g.Outcomes(ctx, pool, "credit"); err != nil || c != (dedupe.Counts{Applied: 1}) {
		t.Fatalf("after the redelivery, and releasing it later, Outcomes = %+v, %v; want 1 applied", c, err)
	}
}
