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
//
// A guard row claimed by ClaimRecords counts its own applied delivery for
// as long as it is in state applied (Outcomes and OutcomeRows add those
// rows; pruning or releasing one moves its count into a counter row, but
// releasing one in the transaction that claimed it counts nothing: that
// delivery does not commit), so
// that a batch whose records were all applied writes no counter row. Do not
// Count those deliveries as applied again: count only duplicates, dead
// letters, and applied deliveries claimed otherwise (Claim, ClaimBatch, or
// none).
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
// partition: the counter rows plus the applied guard rows that count
// themselves (see Count), or the counter rows alone on a table not yet
// migrated to 0006. It reads every guard row of scope, so it costs a scan
// of them; it fails with the wrapped database error.
func (g *Guard) Outcomes(ctx context.Context, q Querier, scope string) (Counts, error) {
	self, err := g.selfCounting(ctx, q)
	if err != nil {
		return Counts{}, err
	}
	query := g.counterOutcomesSQL
	if self {
		query = g.outcomesSQL
	}
	var c Counts
	if err := q.QueryRow(ctx, query, scope).Scan(&c.Applied, &c.Duplicate, &c.DeadLettered); err != nil {
		return Counts{}, fmt.Errorf("dedupe: reading outcome counts of scope %q: %w", scope, err)
	}
	return c, nil
}

// OutcomeRow is the committed counts of one (scope, topic, partition).
type OutcomeRow struct {
	Scope     string
	Topic     string
	Partition int32
	Counts
}

// OutcomeRows returns the committed counts of every (scope, topic,
// partition), ordered by them: the counter rows plus the applied guard rows
// that count themselves (see Count), or the counter rows alone on a table
// not yet migrated to 0006. Like Outcomes, it scans the guard table. It
// fails with the wrapped database error.
func (g *Guard) OutcomeRows(ctx context.Context, q Querier) ([]OutcomeRow, error) {
	self, err := g.selfCounting(ctx, q)
	if err != nil {
		return nil, err
	}
	query := g.counterRowsSQL
	if self {
		query = g.outcomeRowsSQL
	}
	rows, err := q.Query(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("dedupe: reading the outcome counts in %s: %w", g.outcomes, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutcomeRow, error) {
		var o OutcomeRow
		err := r.Scan(&o.Scope, &o.Topic, &o.Partition, &o.Applied, &o.Duplicate, &o.DeadLettered)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("dedupe: reading the outcome counts in %s: %w", g.outcomes, err)
	}
	return out, nil
}

// selfCounting reports whether g's table is migrated to the schema in which
// a claimed guard row counts its own applied delivery (0006: the
// self_counted column); before it, the counter rows hold every delivery.
// The readers ask, so that they read a table an older binary migrated
// (during a rolling deploy) without double counting or failing.
func (g *Guard) selfCounting(ctx context.Context, q Querier) (bool, error) {
	var self bool
	if err := q.QueryRow(ctx, g.selfCountingSQL, g.quoted).Scan(&self); err != nil {
		return false, fmt.Errorf("dedupe: looking up the schema of %s: %w", g.quoted, err)
	}
	return self, nil
}
