package status_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// With the guard in generations, status counts the rows of every
// generation, inspect finds a guard key in a sealed generation, and a
// Kafka-key match reads the current generation (its documented bound).
func TestStatusAndInspectReadEveryGeneration(t *testing.T) {
	ctx := t.Context()
	pool := testenv.DB(t)
	g := dedupe.New()
	if err := g.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	claim := func(key string, offset int64) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := g.ClaimRecords(ctx, tx, []dedupe.RecordClaim{{Scope: "orders", Key: key, Topic: "orders", Offset: offset, Handler: "orders"}})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	claim(dedupe.Key("order", "o-1"), 1)
	p, err := g.NewPruner(pool, dedupe.PrunerConfig{GenerationSpan: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, ran, err := p.PruneOnce(ctx); err != nil || !ran {
		t.Fatalf("PruneOnce: %v, %v", ran, err)
	}
	claim(dedupe.Key("order", "o-2"), 2)

	cfg := status.Config{Pool: pool, Guard: g, Outbox: outbox.New(), Retention: dedupe.DefaultRetention}
	rep, err := status.Collect(context.Background(), cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Guard.Rows != 2 || rep.Guard.Oldest <= 0 || rep.Guard.Violated {
		t.Errorf("guard %+v; want 2 rows over two generations, an age, within retention", rep.Guard)
	}
	sealed, err := status.Inspect(ctx, cfg, dedupe.Key("order", "o-1"), status.InspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sealed.Matched != status.MatchedGuardKey || len(sealed.Guard) != 1 || sealed.Guard[0].Offset == nil || *sealed.Guard[0].Offset != 1 {
		t.Errorf("a guard key of a sealed generation: matched %q, rows %+v", sealed.Matched, sealed.Guard)
	}
	current, err := status.Inspect(ctx, cfg, "o-2", status.InspectOptions{Scope: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if current.Matched != status.MatchedKafkaKey || len(current.Guard) != 1 {
		t.Errorf("a Kafka key in the current generation: matched %q, rows %+v", current.Matched, current.Guard)
	}
}
