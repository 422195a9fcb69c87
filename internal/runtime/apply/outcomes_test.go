package apply_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
)

// The outcome totals equal the deliveries committed, by outcome, along
// every path that claims, marks or deletes a guard row: applied records
// (counted by their own guard rows), a handler failing at its last attempt
// and a record that cannot be decoded (dead-lettered, the latter marked by
// its coordinates), the same records delivered again (duplicates), a
// dead-lettered key taken over by a record at other coordinates (a batch
// of one), a batch replayed after a failure (only its committed prefix
// counts), and pruning every guard row.
func TestOutcomeTotalsEqualCommittedDeliveries(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	f.exec.DeadLetter = func(ctx context.Context, tx pgx.Tx, rec handler.Record, _ string, _ int, reason error) error {
		_, err := tx.Exec(ctx, `insert into dead (id, reason) values ($1, $2)`, string(rec.Value), reason.Error())
		return err
	}
	var want dedupe.Counts
	run := func(what string, its []apply.Item, wantHandlerError bool) {
		t.Helper()
		res, herr, err := f.exec.Run(ctx, its)
		if err != nil || (herr != nil) != wantHandlerError {
			t.Fatalf("%s: handler error %v, error %v", what, herr, err)
		}
		for _, r := range res {
			switch r.Outcome {
			case dedupe.Applied:
				want.Applied++
			case dedupe.Duplicate:
				want.Duplicate++
			case dedupe.DeadLettered:
				want.DeadLettered++
			}
		}
		if c, err := f.exec.Guard.Outcomes(ctx, f.pool, "t"); err != nil || c != want {
			t.Fatalf("%s: Outcomes = %+v, %v; want %+v (the %d results committed so far)", what, c, err, want, want.Total())
		}
	}
	batch := items(t, 3, cmd{ID: "a"}, cmd{ID: "b", Fail: true}, cmd{ID: "c"}, cmd{ID: "junk"})
	batch[3].Record.Value = []byte(`{"id":`)
	run("applied and dead-lettered", batch, false)
	again := items(t, 1, cmd{ID: "a"}, cmd{ID: "b", Fail: true}, cmd{ID: "c"}, cmd{ID: "junk"})
	again[3].Record.Value = []byte(`{"id":`)
	run("delivered again", again, false)
	if want != (dedupe.Counts{Applied: 2, Duplicate: 4, DeadLettered: 2}) {
		t.Fatalf("outcomes %+v, want 2 applied, 4 duplicates, 2 dead-lettered", want)
	}
	takeover := items(t, 1, cmd{ID: "b"})
	takeover[0].Record.Offset = 10
	run("dead-lettered key taken over", takeover, false)
	replayed := items(t, 1, cmd{ID: "d"}, cmd{ID: "e", Fail: true}, cmd{ID: "f"})
	for i := range replayed {
		replayed[i].Record.Offset += 20
	}
	run("replayed after a failure", replayed, true)
	if want.Applied != 4 {
		t.Fatalf("%d applied, want 4 (a, c, b taken over, d)", want.Applied)
	}
	if _, err := f.exec.Guard.Prune(ctx, f.pool, 0, 2); err != nil {
		t.Fatal(err)
	}
	if c, err := f.exec.Guard.Outcomes(ctx, f.pool, "t"); err != nil || c != want {
		t.Fatalf("after pruning every guard row: Outcomes = %+v, %v; want %+v", c, err, want)
	}
}
