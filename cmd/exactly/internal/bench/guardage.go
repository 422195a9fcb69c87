package bench

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
)

// The guard-age rows: "exactly, defaults" on an empty guard beside the
// same run on a guard filled as on day 14 of the default retention, at a
// stated size (guardFullRows in guardFullGens sealed generations: the
// default span is half the retention), and the cost of expiring
// such a generation.
const (
	idGuardEmpty = "guardempty"
	idGuardFull  = "guardfull"

	guardFullSchema  = "bench_guardfull"
	guardEmptySchema = "bench_guardempty"

	// guardFullRows is the size of the full guard: 2,000,000 rows fill in
	// about 20 s here. 14 days at 2,000 records/s are 2.4 billion rows
	// (each sealed generation 1.2 billion), at 10,000/s 12 billion: the
	// cost of a claim depends on the number of sealed generations and on
	// the current generation's size (see docs/operations.md, "Guard
	// table size"), not on the rows of the sealed ones, which a claim
	// reads by one primary-key probe each.
	guardFullRows = 2_000_000
	guardFullGens = 2
)

// guardScenarios returns the two guard-age scenarios of base (an exactly
// run with defaults): the empty one starts from freshly migrated tables;
// the full one's tables are migrated and filled by fillGuard before the
// empty one runs, so that both runs follow the fill's writes alike.
func guardScenarios(base Spec, run string, with func(func(*Spec)) Spec) []scenario {
	return []scenario{
		{idGuardEmpty, "exactly, defaults, empty guard", with(func(s *Spec) {
			s.Kind, s.Schema, s.Group = kindExactly, guardEmptySchema, "bench-guardempty-"+run
		}), true},
		{idGuardFull, fmt.Sprintf("exactly, defaults, guard of %d rows", guardFullRows), with(func(s *Spec) {
			s.Kind, s.Schema, s.Group = kindExactly, guardFullSchema, "bench-guardfull-"+run
		}), false},
	}
}

// fullSchema is the schema of the full guard of the round spec (a
// guard-age scenario's) runs in: each round fills its own.
func fullSchema(spec Spec) string {
	suffix := strings.TrimPrefix(strings.TrimPrefix(spec.Schema, guardFullSchema), guardEmptySchema)
	return guardFullSchema + suffix
}

// prepareGuard migrates and fills the full guards of every round (rounds)
// before the first guard-age scenario runs, so that no round but the
// first runs its pair right after a fill's writes; a guard filled already
// is kept.
func prepareGuard(ctx context.Context, w io.Writer, pool *pgxpool.Pool, sc scenario, spec Spec, events string, rounds int) error {
	if sc.id != idGuardFull && sc.id != idGuardEmpty {
		return nil
	}
	schemas := []string{fullSchema(spec)}
	if schemas[0] == guardFullSchema { // the first round: fill every round's
		for r := 2; r <= rounds; r++ {
			schemas = append(schemas, guardFullSchema+"_r"+strconv.Itoa(r))
		}
	}
	for _, schema := range schemas {
		g := dedupe.New(dedupe.WithTable(schema, "exactly_guard"))
		if gens, err := g.Generations(ctx, pool); err == nil && len(gens) == guardFullGens+1 {
			continue // filled for the other scenario
		}
		start := time.Now()
		if err := fixture(schema, events).migrate(ctx, pool); err != nil {
			return err
		}
		if err := fillGuard(ctx, pool, g, guardFullRows, guardFullGens); err != nil {
			return err
		}
		fmt.Fprintf(w, "bench: filled %s with %d rows in %d sealed generations in %s\n", g.Table().Sanitize(), guardFullRows, guardFullGens, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// fillGuard writes rows guard rows as the consumer writes them (random
// "credit:<uuid>" keys, the record's coordinates) into gens generations,
// spread over the last 14 days, sealing each (as the pruner does), so
// that the current generation is left empty, then analyzes them.
func fillGuard(ctx context.Context, pool *pgxpool.Pool, g *dedupe.Guard, rows, gens int) error {
	p, err := g.NewPruner(pool, dedupe.PrunerConfig{GenerationSpan: time.Microsecond})
	if err != nil {
		return err
	}
	per := rows / gens
	for i := range gens {
		_, err := pool.Exec(ctx, `insert into `+g.Table().Sanitize()+` (scope, key, topic, kafka_partition, kafka_offset, handler, self_counted, processed_at)
select 'credit', 'credit:' || gen_random_uuid(), 'bench-fill', n % 8, n, 'credit', true,
	now() - interval '14 days' + ($1::int * interval '3.5 days') + n * interval '1 microsecond'
from generate_series(1, $2::int) as n`, i, per)
		if err != nil {
			return fmt.Errorf("filling %s: %w", g.Table().Sanitize(), err)
		}
		if _, _, err := p.PruneOnce(ctx); err != nil {
			return fmt.Errorf("sealing a filled generation: %w", err)
		}
	}
	gs, err := g.Generations(ctx, pool)
	if err != nil {
		return err
	}
	for _, gen := range gs {
		ident := g.Table()
		ident[len(ident)-1] = gen.Name
		if _, err := pool.Exec(ctx, `vacuum analyze `+ident.Sanitize()); err != nil {
			return fmt.Errorf("analyzing %s: %w", ident.Sanitize(), err)
		}
	}
	return nil
}

// expiryCost drops the oldest sealed generation of the full guard (aged
// past the retention) and reports how long the prune took and how many
// rows it dropped.
func expiryCost(ctx context.Context, w io.Writer, pool *pgxpool.Pool, sc scenario, spec Spec) error {
	if sc.id != idGuardFull {
		return nil
	}
	g := dedupe.New(dedupe.WithTable(spec.Schema, "exactly_guard"))
	gt := g.GenerationsTable().Sanitize()
	if _, err := pool.Exec(ctx, `update `+gt+` set until = now() - interval '15 days'
where name = (select name from `+gt+` where until is not null order by since limit 1)`); err != nil {
		return fmt.Errorf("ageing a generation: %w", err)
	}
	p, err := g.NewPruner(pool, dedupe.PrunerConfig{})
	if err != nil {
		return err
	}
	start := time.Now()
	n, _, err := p.PruneOnce(ctx)
	if err != nil {
		return fmt.Errorf("expiring a generation: %w", err)
	}
	fmt.Fprintf(w, "bench: %-40s %9d rows dropped in %s\n", "guard expiry (one generation)", n, time.Since(start).Round(time.Millisecond))
	return nil
}

// reportGuardAge prints the full guard's rate over the empty one's, when
// both ran.
func reportGuardAge(w io.Writer, results []Result) {
	full, ok1 := find(results, idGuardFull)
	empty, ok2 := find(results, idGuardEmpty)
	if !ok1 || !ok2 || empty.Rate == 0 {
		return
	}
	fmt.Fprintf(w, "bench: guard of %d rows / empty guard: %.2f (%.0f / %.0f rec/s, side by side in this run)\n", guardFullRows, full.Rate/empty.Rate, full.Rate, empty.Rate)
}

// guardWALStart returns the WAL position before a guard-age scenario runs
// ("" for the other scenarios, and when it cannot be read).
func guardWALStart(ctx context.Context, pool *pgxpool.Pool, sc scenario) string {
	if sc.id != idGuardFull && sc.id != idGuardEmpty {
		return ""
	}
	var lsn string
	if err := pool.QueryRow(ctx, `select pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		return ""
	}
	return lsn
}

// reportGuardWAL prints the WAL a guard-age scenario wrote per record since
// start (the whole database's: the run is the only writer).
func reportGuardWAL(ctx context.Context, w io.Writer, pool *pgxpool.Pool, sc scenario, start string, records int) {
	if start == "" || records <= 0 {
		return
	}
	var bytes int64
	if err := pool.QueryRow(ctx, `select pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, start).Scan(&bytes); err != nil {
		return
	}
	fmt.Fprintf(w, "bench: %-40s %9.0f bytes of WAL a record\n", sc.name, float64(bytes)/float64(records))
}
