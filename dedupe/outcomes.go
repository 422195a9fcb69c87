package dedupe

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// OutcomeTable returns the identifier of the outcome counters table that
// belongs to g: the guard table's name with the suffix "_outcomes", in the
// same schema.
func (g *Guard) OutcomeTable() pgx.Identifier {
	if g.schema == "" {
		return pgx.Identifier{g.name + "_outcomes"}
	}
	return pgx.Identifier{g.schema, g.name + "_outcomes"}
}

// Counts are deliveries by outcome.
type Counts struct {
	Applied, Duplicate, DeadLettered int64
}

// Total is the number of deliveries counted.
func (c Counts) Total() int64 { return c.Applied + c.Duplicate + c.DeadLettered }

// Count adds c to the counters of (scope, topic, partition) inside tx, so the
// counts commit or roll back with the records they count: after any crash
// and redelivery, applied + duplicate + dead-lettered equals the deliveries
// that committed. It appends one row of deltas (no row is updated, so
// concurrent batches never contend); readers sum the rows, and the Pruner
// rolls them up (RollUpOutcomes). Count fails with the wrapped database
// error (tx is then aborted).
func (g *Guard) Count(ctx context.Context, tx pgx.Tx, scope, topic string, partition int32, c Counts) error {
	if c.Total() == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, g.countSQL, scope, topic, partition, c.Applied, c.Duplicate, c.DeadLettered); err != nil {
		return fmt.Errorf("dedupe: counting outcomes of %s/%d in scope %q: %w", topic, partition, scope, err)
	}
	return nil
}

// QueueCount queues on batch the statement Count executes, so that the
// counters cost no round trip of their own. The statement's error, when
// batch is sent, is the database's. Counts of zero queue nothing.
func (g *Guard) QueueCount(batch *pgx.Batch, scope, topic string, partition int32, c Counts) {
	if c.Total() == 0 {
		return
	}
	batch.Queue(g.countSQL, scope, topic, partition, c.Applied, c.Duplicate, c.DeadLettered)
}

// RollUpOutcomes replaces the counter rows of every (scope, topic,
// partition) by one row holding their sums, in one statement: the totals
// read by Outcomes do not change. The Pruner calls it after each prune. It
// fails with the wrapped database error, changing nothing.
func (g *Guard) RollUpOutcomes(ctx context.Context, q Querier) error {
	if _, err := q.Exec(ctx, g.rollupSQL); err != nil {
		return fmt.Errorf("dedupe: rolling up the outcome counters in %s: %w", g.outcomes, err)
	}
	return nil
}

// Outcomes returns the committed counts of scope over every topic and
// partition. It fails with the wrapped database error.
func (g *Guard) Outcomes(ctx context.Context, q Querier, scope string) (Counts, error) {
	var c Counts
	if err := q.QueryRow(ctx, g.outcomesSQL, scope).Scan(&c.Applied, &c.Duplicate, &c.DeadLettered); err != nil {
		return Counts{}, fmt.Errorf("dedupe: reading outcome counts of scope %q: %w", scope, err)
	}
	return c, nil
}
