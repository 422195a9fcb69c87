package status

// Every statement and every column name this package depends on is here, so
// that schema changes are adjusted in one place. Columns that later
// migrations add are probed with columnsOf and used only when present.

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
)

// Guard table columns added by guard migration 0004 (filled at claim time).
const (
	colGuardState     = "state" // 'applied' | 'dead_lettered'
	colGuardTopic     = "topic"
	colGuardPartition = "kafka_partition"
	colGuardOffset    = "kafka_offset"
	colGuardTraceID   = "trace_id"
	colGuardHandler   = "handler"

	guardStateDeadLettered = "dead_lettered"
)

// colOutboxParked is the outbox column (outbox migration 0002) that marks a
// parked row: non-null when the relay gave up on the row's (topic, key).
const colOutboxParked = "parked_at"

// colOutboxParkReason (same migration) says why the relay parked the row.
const colOutboxParkReason = "park_reason"

// statementTimeoutSQL bounds every statement of a status read.
const statementTimeoutSQL = `set local statement_timeout = '30s'`

// columnsSQL lists the live columns of the table named by $1 (a sanitized
// identifier); no rows when the table does not exist.
const columnsSQL = `select attname from pg_attribute
where attrelid = to_regclass($1) and attnum > 0 and not attisdropped`

// columnsOf returns the set of column names of table, empty when the table
// does not exist.
func columnsOf(ctx context.Context, tx pgx.Tx, table pgx.Identifier) (map[string]bool, error) {
	rows, err := tx.Query(ctx, columnsSQL, table.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("listing the columns of %s: %w", table.Sanitize(), err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing the columns of %s: %w", table.Sanitize(), err)
	}
	set := make(map[string]bool, len(names))
	for _, n := range names {
		set[n] = true
	}
	return set, nil
}

// guardSummarySQL: rows, and the age of the oldest row in microseconds by
// the database's clock (0 when empty); a guard table not migrated to
// generations (dedupe migration 0009) only.
func guardSummarySQL(t pgx.Identifier) string {
	return `select count(*), coalesce((extract(epoch from now() - min(processed_at)) * 1e6)::bigint, 0) from ` + t.Sanitize()
}

// guardSummary reads the guard's rows and the age of its oldest row. With
// generations (dedupe migration 0009) the rows are the database's
// estimate, summed over the generations (statistics, never a count), and
// the age reads one end of each generation's processed_at index: both
// cost the same at any size. Before it, a count of the table.
func guardSummary(ctx context.Context, tx pgx.Tx, g *dedupe.Guard) (rows int64, oldest time.Duration, err error) {
	var gens bool
	if err := tx.QueryRow(ctx, tableExistsSQL, g.GenerationsTable().Sanitize()).Scan(&gens); err != nil {
		return 0, 0, err
	}
	if !gens {
		var micros int64
		err := tx.QueryRow(ctx, guardSummarySQL(g.Table())).Scan(&rows, &micros)
		return rows, time.Duration(micros) * time.Microsecond, err
	}
	list, err := g.Generations(ctx, tx)
	if err != nil {
		return 0, 0, err
	}
	for _, gen := range list {
		rows += gen.Rows
	}
	oldest, err = g.OldestAge(ctx, tx)
	return rows, oldest, err
}

// maxSuffixPages bounds a Kafka-key match (guardRowSQL's bySuffix) with
// generations: it reads the newest pages of the current generation only,
// 32 MiB of heap (about 190,000 rows), by a TID range scan.
const maxSuffixPages = 4096

// suffixStartSQL is the first page a Kafka-key match reads of table $1.
const suffixStartSQL = `select '(' || greatest(pg_relation_size($1::regclass) / current_setting('block_size')::bigint - $2, 0) || ',0)'`

// outboxSummarySQL: pending rows (held ones included), the oldest pending
// row's age in microseconds, parked rows and held rows (pending rows the
// relay skips because a row of their topic and key is parked); 0 for the
// last two without the parked column.
func outboxSummarySQL(t pgx.Identifier, parked bool) string {
	if !parked {
		return `select count(*), coalesce((extract(epoch from now() - min(created_at)) * 1e6)::bigint, 0), 0::bigint, 0::bigint from ` + t.Sanitize()
	}
	p := pgx.Identifier{colOutboxParked}.Sanitize()
	return `select count(*) filter (where o.` + p + ` is null),
	coalesce((extract(epoch from now() - min(o.created_at) filter (where o.` + p + ` is null)) * 1e6)::bigint, 0),
	count(*) filter (where o.` + p + ` is not null),
	count(*) filter (where o.` + p + ` is null and ` + heldSQL(t) + `) from ` + t.Sanitize() + ` o`
}

// heldSQL is true for an outbox row o that has a parked row of its topic
// and key: the relay skips it (outbox's publishable condition).
func heldSQL(t pgx.Identifier) string {
	p := pgx.Identifier{colOutboxParked}.Sanitize()
	return `exists (select from ` + t.Sanitize() + ` h where h.` + p + ` is not null and h.topic = o.topic and h.key = o.key)`
}

// outboxRowsSQL lists up to $1 outbox rows, parked first, then held, then
// oldest first: id, topic, key, headers (jsonb), created_at, parked, park reason
// (empty when none), size (key and value bytes, as the relay counts them),
// held behind it (for a parked row: the pending rows of its topic and
// key), and held (a pending row behind a parked one). With key set, only
// rows whose Kafka key equals $2.
func outboxRowsSQL(t pgx.Identifier, parked, byKey bool) string {
	size := `coalesce(length(o.key), 0) + coalesce(length(o.value), 0)`
	cols := `false, '', ` + size + `, 0::bigint, false`
	order := "o.id"
	if parked {
		p := pgx.Identifier{colOutboxParked}.Sanitize()
		reason := pgx.Identifier{colOutboxParkReason}.Sanitize()
		cols = `o.` + p + ` is not null, coalesce(o.` + reason + `, ''), ` + size + `,
	case when o.` + p + ` is not null then (select count(*) from ` + t.Sanitize() + ` b where b.` + p + ` is null and b.topic = o.topic and b.key = o.key) else 0 end,
	o.` + p + ` is null and ` + heldSQL(t)
		order = `6 desc, 10 desc, o.id` // parked, then held, then by id
	}
	where := ""
	if byKey {
		where = " where o.key = $2"
	}
	return `select o.id, o.topic, o.key, o.headers, o.created_at, ` + cols + ` from ` + t.Sanitize() + ` o` + where +
		` order by ` + order + ` limit $1`
}

// guardRowSQL selects the guard rows for key $1 (in scope $2 when byScope):
// scope, key, processed_at, then the optional columns present, cast to
// text, in the order of the returned column names. With bySuffix it selects
// the rows whose key ends in $1 instead (a scan of the table), at most
// maxSuffixRows of them.
//
// With sealed (the sealed generations' view, dedupe migration 0009), a
// guard-key match reads every generation (a primary-key probe each), and a
// Kafka-key match reads the current generation from page $3 (a TID, see
// suffixStartSQL; $2, or $3 with byScope) on, where its newest rows are.
func guardRowSQL(t pgx.Identifier, present map[string]bool, byScope, bySuffix bool, sealed pgx.Identifier) (string, []string) {
	sel := `select scope, key, processed_at`
	var cols []string
	for _, c := range guardOptional() {
		if present[c] {
			sel += `, ` + pgx.Identifier{c}.Sanitize() + `::text`
			cols = append(cols, c)
		}
	}
	from := t.Sanitize()
	with := ""
	if sealed != nil && !bySuffix {
		all := `scope, key, processed_at, state, topic, kafka_partition, kafka_offset, trace_id, handler`
		gens := `(select ` + all + ` from ` + t.Sanitize() + ` union all select ` + all + ` from ` + sealed.Sanitize() + `)`
		from = gens + ` as g`
		if !byScope {
			// A key without its scope: the scopes, one primary-key descent
			// each (a loose index scan), then a probe of (scope, key) per
			// scope and generation, instead of a scan for the key.
			with = `with recursive sc(s) as (
	select min(scope) from ` + gens + ` as a
	union all
	select (select min(scope) from ` + gens + ` as b where b.scope > sc.s) from sc where sc.s is not null
) `
			from += ` where scope in (select s from sc where s is not null) and`
		} else {
			from += ` where`
		}
	} else {
		from += ` where`
	}
	sel = with + sel
	switch {
	case bySuffix && sealed != nil:
		tid := "$2"
		if byScope {
			tid = "$3"
		}
		sel += ` from ` + from + ` ctid >= ` + tid + `::tid and right(key, length($1)) = $1`
	case bySuffix:
		sel += ` from ` + from + ` right(key, length($1)) = $1`
	default:
		sel += ` from ` + from + ` key = $1`
	}
	if byScope {
		sel += ` and scope = $2`
	}
	sel += ` order by scope, key`
	if bySuffix {
		sel += fmt.Sprintf(` limit %d`, maxSuffixRows)
	}
	return sel, cols
}

// maxSuffixRows bounds the guard rows a Kafka-key match lists.
const maxSuffixRows = 100

// guardOptional lists the guard columns of migration 0004, in select order.
func guardOptional() []string {
	return []string{colGuardState, colGuardTopic, colGuardPartition, colGuardOffset, colGuardTraceID, colGuardHandler}
}

// heldRowsSQL lists the held records of table t (dedupe.Guard.HeldTable,
// guard migration 0008), those held longest first, up to $1 (with byKey,
// only those whose key is $2 or ends in ":" and $2, a Kafka key's guard
// keys; with byScope, also only scope $3): group, topic, partition,
// offset, scope, key, handler, attempts, last error, microseconds held and
// until the retry (negative: due), and the count of all rows matched.
func heldRowsSQL(t pgx.Identifier, byKey, byScope bool) string {
	where := ""
	if byKey {
		where = ` where (key = $2 or right(key, length($2) + 1) = ':' || $2)`
		if byScope {
			where += ` and scope = $3`
		}
	}
	return `select consumer_group, topic, partition, record_offset, scope, key, handler, attempts, last_error,
	(extract(epoch from now() - held_since) * 1e6)::bigint, (extract(epoch from retry_at - now()) * 1e6)::bigint,
	count(*) over ()
from ` + t.Sanitize() + where + ` order by held_since, consumer_group, topic, partition, record_offset limit $1`
}

// pausedRowsSQL lists the paused partitions of table t
// (dedupe.Guard.PausedTable, guard migration 0008): group, topic,
// partition, reason, lowest unfinished offset, handler, microseconds
// paused.
func pausedRowsSQL(t pgx.Identifier) string {
	return `select consumer_group, topic, partition, reason, lowest_unfinished, handler,
	(extract(epoch from now() - paused_since) * 1e6)::bigint
from ` + t.Sanitize() + ` order by consumer_group, topic, partition`
}

// tableExistsSQL is true when the table named by $1 (a sanitized
// identifier) exists.
const tableExistsSQL = `select to_regclass($1) is not null`
