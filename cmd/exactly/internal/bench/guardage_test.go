package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testenv"
)

// The full guard of the guard-age rows holds its rows in sealed
// generations and an empty current one, as a guard on day 14 does, and
// its expiry drops one generation whole.
func TestFillGuardSealsGenerations(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	spec := Spec{Schema: guardFullSchema}
	sc := scenario{id: idGuardFull, spec: spec}
	if err := fixture(guardFullSchema, "events").migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	g := dedupe.New(dedupe.WithTable(guardFullSchema, "exactly_guard"))
	if err := fillGuard(ctx, pool, g, 2000, 2); err != nil {
		t.Fatal(err)
	}
	gens, err := g.Generations(ctx, pool)
	if err != nil || len(gens) != 3 || gens[0].Rows != 1000 || gens[1].Rows != 1000 || gens[2].Rows != 0 {
		t.Fatalf("Generations = %+v, %v; want two sealed of 1000 rows and an empty current one", gens, err)
	}
	var out bytes.Buffer
	if err := expiryCost(ctx, &out, pool, sc, spec); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), " 1000 rows dropped in ") {
		t.Fatalf("expiry printed %q, want 1000 rows dropped", out.String())
	}
	if gens, err := g.Generations(ctx, pool); err != nil || len(gens) != 2 {
		t.Fatalf("after the expiry: %+v, %v; want one sealed and the current", gens, err)
	}
}
