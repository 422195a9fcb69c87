package status

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
)

// outcomeEstimateAbove is the number of guard rows that may still count
// themselves (those of the current generation and of the sealed
// generations the Pruner has not counted yet, by the database's
// statistics) above which status estimates each scope's applied guard rows
// instead of counting them: the count (dedupe's OutcomeRows) reads every
// such row, about 290 ms a million rows, while the estimate reads the
// catalogs and the planner's statistics at any size.
const outcomeEstimateAbove = 1_000_000

// uncountedRows returns the database's estimate of g's guard rows that may
// still count themselves, with self false when g's table is not migrated
// to self-counting rows (dedupe migration 0006: the counter rows hold
// every delivery and nothing needs estimating). gens lists the tables the
// rows are in.
func uncountedRows(ctx context.Context, tx pgx.Tx, g *dedupe.Guard) (rows int64, gens []pgx.Identifier, self bool, err error) {
	cols, err := columnsOf(ctx, tx, g.Table())
	if err != nil || !cols["self_counted"] {
		return 0, nil, false, err
	}
	var generations bool
	if err := tx.QueryRow(ctx, tableExistsSQL, g.GenerationsTable().Sanitize()).Scan(&generations); err != nil {
		return 0, nil, false, fmt.Errorf("looking up the generations of %s: %w", g.Table().Sanitize(), err)
	}
	if !generations {
		if err := tx.QueryRow(ctx, reltuplesSQL, g.Table().Sanitize()).Scan(&rows); err != nil {
			return 0, nil, false, fmt.Errorf("reading the estimated rows of %s: %w", g.Table().Sanitize(), err)
		}
		return rows, []pgx.Identifier{g.Table()}, true, nil
	}
	list, err := g.Generations(ctx, tx)
	if err != nil {
		return 0, nil, false, err
	}
	for _, gen := range list {
		if gen.Counted {
			continue
		}
		rows += gen.Rows
		id := slices.Clone(g.GenerationsTable())
		id[len(id)-1] = gen.Name
		gens = append(gens, id)
	}
	return rows, gens, true, nil
}

// reltuplesSQL is the planner's row estimate of the table named by $1 (a
// sanitized identifier), 0 when it has none yet.
const reltuplesSQL = `select coalesce((select greatest(reltuples, 0)::bigint from pg_class where oid = to_regclass($1)), 0)`

// counterOutcomesSQL sums the counter rows of outcome table t by scope,
// with a zero row for every scope of scopes table st (nil before dedupe
// migration 0007) that has no counter row: the scopes whose deliveries
// only counted themselves so far.
func counterOutcomesSQL(t, st pgx.Identifier) string {
	scopes := ""
	if st != nil {
		scopes = ` union all select scope, 0, 0, 0 from ` + st.Sanitize()
	}
	return `select scope, sum(applied)::bigint, sum(duplicate)::bigint, sum(dead_lettered)::bigint from (
	select scope, applied, duplicate, dead_lettered from ` + t.Sanitize() + scopes + `) c group by 1 order by 1`
}

// estimatedOutcomes returns each scope's counts with Estimated set: the
// counter rows' sums (exact) plus, in Applied, the planner's estimate of
// the scope's self-counting applied rows in tables. The scopes are those
// of the counter rows and of the scopes table (every scope a consumer
// started with). It reads those two small tables and runs one EXPLAIN per
// scope and table, never reading a guard row.
func estimatedOutcomes(ctx context.Context, tx pgx.Tx, g *dedupe.Guard, tables []pgx.Identifier) ([]Outcomes, error) {
	var st pgx.Identifier
	var exists bool
	if err := tx.QueryRow(ctx, tableExistsSQL, g.ScopesTable().Sanitize()).Scan(&exists); err != nil {
		return nil, fmt.Errorf("looking up %s: %w", g.ScopesTable().Sanitize(), err)
	}
	if exists {
		st = g.ScopesTable()
	}
	rows, err := tx.Query(ctx, counterOutcomesSQL(g.OutcomeTable(), st))
	if err != nil {
		return nil, fmt.Errorf("reading the counter rows of %s: %w", g.OutcomeTable().Sanitize(), err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Outcomes, error) {
		o := Outcomes{Estimated: true}
		err := r.Scan(&o.Scope, &o.Applied, &o.Duplicate, &o.DeadLettered)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading the counter rows of %s: %w", g.OutcomeTable().Sanitize(), err)
	}
	for i := range out {
		for _, t := range tables {
			n, err := planRows(ctx, tx, `select 1 from `+t.Sanitize()+` where scope = $1 and state = 'applied' and self_counted`, out[i].Scope)
			if err != nil {
				return nil, fmt.Errorf("estimating the applied rows of scope %q in %s: %w", out[i].Scope, t.Sanitize(), err)
			}
			out[i].Applied += n
		}
	}
	return out, nil
}

// planRows returns the planner's estimate of the rows query returns.
func planRows(ctx context.Context, tx pgx.Tx, query string, args ...any) (int64, error) {
	var plan []byte
	if err := tx.QueryRow(ctx, `explain (format json) `+query, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...).Scan(&plan); err != nil {
		return 0, err
	}
	var p []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		}
	}
	if err := json.Unmarshal(plan, &p); err != nil || len(p) == 0 {
		return 0, fmt.Errorf("decoding the plan %q: %v", plan, err)
	}
	return int64(p[0].Plan.Rows), nil
}
