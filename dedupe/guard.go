package dedupe

import (
	"context"
	"embed"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/runtime/migrate"
	"github.com/exactly-go/exactly/internal/runtime/pgarray"
)

// DefaultTable is the guard table's name when WithTable is not used; it is
// looked up in the connection's search_path.
const DefaultTable = "exactly_guard"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// ErrEmptyKey is returned (wrapped) by the methods that take keys when a key
// is the empty string: an empty key names no operation.
var ErrEmptyKey = errors.New("dedupe: empty key")

// ErrInvalidScope is returned (wrapped) when a scope contains a NUL byte or
// invalid UTF-8, which PostgreSQL text cannot store, or is longer than
// MaxKeyLen bytes.
var ErrInvalidScope = errors.New("dedupe: invalid scope")

// Outcome is how a delivery of a key ended. It is the one outcome type of
// exactly: Claim and ClaimBatch return Applied or Duplicate, and the
// consumer reports every record as one of the three.
type Outcome string

const (
	// Applied means the key was not claimed before: this transaction owns it
	// and must perform the effect. If the transaction rolls back, so does the
	// claim.
	Applied Outcome = "applied"
	// Duplicate means a committed transaction (or this same transaction)
	// already claimed the key: skip the effect.
	Duplicate Outcome = "duplicate"
	// DeadLettered means the record was sent to the dead-letter topic, in
	// the transaction that left its guard row marked dead-lettered.
	DeadLettered Outcome = "dead_lettered"
)

// String returns the outcome's name ("applied", "duplicate",
// "dead_lettered").
func (o Outcome) String() string { return string(o) }

// Querier runs statements; pgx.Tx, *pgx.Conn, *pgxpool.Pool and
// *pgxpool.Conn all satisfy it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Guard claims keys in one guard table. Build it with New; it is immutable
// and safe for concurrent use.
type Guard struct {
	schema, name string
	quoted       string // sanitized, possibly schema-qualified identifier
	outcomes     string // sanitized identifier of the outcome counters table
	sealed       string // sanitized identifier of the sealed generations' view
	gens         string // sanitized identifier of the generations table

	countSQL, outcomesSQL, outcomeRowsSQL, rollupSQL    string
	counterOutcomesSQL, counterRowsSQL, selfCountingSQL string

	claimSQL, claimBatchSQL, releaseSQL, lookupSQL, cutoffSQL, pruneSQL string
	claimedSQL                                                          string

	claimRecordsSQL, claimOneSQL, claimNewSQL, markDeadSQL string
	oldestSQL                                              string
}

// Option configures a Guard.
type Option func(*Guard)

// WithTable sets the guard table: name in schema, or in the search_path when
// schema is "". An empty name keeps DefaultTable. Any characters are allowed;
// the names are quoted, never spliced into SQL.
func WithTable(schema, name string) Option {
	return func(g *Guard) {
		g.schema = schema
		if name != "" {
			g.name = name
		}
	}
}

// New returns a Guard configured by opts; by default it uses the table
// "exactly_guard" in the search_path. New never fails.
func New(opts ...Option) *Guard {
	g := &Guard{name: DefaultTable}
	for _, o := range opts {
		o(g)
	}
	g.quoted = g.Table().Sanitize()
	t := g.quoted
	g.outcomes = g.OutcomeTable().Sanitize()
	g.sealed = g.SealedView().Sanitize()
	g.gens = g.GenerationsTable().Sanitize()
	s := g.sealed
	g.countSQL = `insert into ` + g.outcomes + ` (scope, topic, partition, applied, duplicate, dead_lettered)
values ($1, $2, $3, $4, $5, $6)`
	// The rows of each (scope, topic, partition) collapse into one; rows
	// inserted meanwhile are not seen by the delete and stay as they are.
	g.rollupSQL = `with gone as (delete from ` + g.outcomes + ` returning *)
insert into ` + g.outcomes + ` (scope, topic, partition, applied, duplicate, dead_lettered, updated_at)
select scope, topic, partition, sum(applied), sum(duplicate), sum(dead_lettered), max(updated_at)
from gone group by scope, topic, partition`
	// A guard row claimed by ClaimRecords (self_counted) in state applied
	// counts its own delivery; the counter rows hold the rest (see
	// Count). Pruning and releasing such a row move its count into a
	// counter row in the same statement (countGone), unless the releasing
	// transaction claimed it.
	selfCounted := `state = 'applied' and self_counted`
	// Sealed generations count their rows until the Pruner moves their
	// counts into counter rows (counted).
	g.outcomesSQL = `select coalesce(sum(applied), 0)::bigint + (select count(*) from ` + t + ` where scope = $1 and ` + selfCounted + `)
		+ (select count(*) from ` + s + ` where not counted and scope = $1 and ` + selfCounted + `),
	coalesce(sum(duplicate), 0)::bigint, coalesce(sum(dead_lettered), 0)::bigint
from ` + g.outcomes + ` where scope = $1`
	// Before migration 0006 every delivery was in the counter rows.
	g.counterOutcomesSQL = `select coalesce(sum(applied), 0)::bigint, coalesce(sum(duplicate), 0)::bigint, coalesce(sum(dead_lettered), 0)::bigint
from ` + g.outcomes + ` where scope = $1`
	g.counterRowsSQL = `select scope, topic, partition, sum(applied)::bigint, sum(duplicate)::bigint, sum(dead_lettered)::bigint
from ` + g.outcomes + ` group by 1, 2, 3 order by 1, 2, 3`
	g.selfCountingSQL = `select exists (select 1 from pg_attribute where attrelid = to_regclass($1) and attname = 'self_counted' and not attisdropped)`
	g.outcomeRowsSQL = `select scope, topic, partition, sum(applied)::bigint, sum(duplicate)::bigint, sum(dead_lettered)::bigint from (
	select scope, topic, partition, applied, duplicate, dead_lettered from ` + g.outcomes + `
	union all
	select scope, topic, kafka_partition, count(*), 0, 0 from ` + t + ` where ` + selfCounted + ` group by 1, 2, 3
	union all
	select scope, topic, kafka_partition, count(*), 0, 0 from ` + s + ` where not counted and ` + selfCounted + ` group by 1, 2, 3
) c group by 1, 2, 3 order by 1, 2, 3`
	countGone := g.countGone
	// Every claim inserts into the current generation only when no sealed
	// generation holds the key (see docs/design.md, "The guard's
	// generations"): the current generation's primary key serialises
	// concurrent claimers of a key, and a rotation waits for every
	// transaction that inserted into the generation it seals.
	g.claimSQL = `insert into ` + t + ` (scope, key) select $1::text, $2::text
where not exists (select 1 from ` + s + ` s where s.scope = $1 and s.key = $2) on conflict do nothing returning true`
	// Keys repeated in the batch collapse to their first position; the
	// distinct keys are inserted in sorted order, so that concurrent batches
	// with overlapping keys wait for each other instead of deadlocking. The
	// statement returns the (1-based) input position of every key it inserted.
	g.claimBatchSQL = `with input as (
	select k, min(ord) as ord from unnest($2::text[]) with ordinality as u(k, ord) group by k
), ins as (
	insert into ` + t + ` (scope, key) select $1, k from input
	where not exists (select 1 from ` + s + ` s where s.scope = $1 and s.key = input.k) order by k
	on conflict do nothing returning key
)
select input.ord from ins join input on input.k = ins.key`
	// Each record carries its own scope. A key already marked dead-lettered
	// by a record at other coordinates is taken over (the row's lock is
	// taken either way); the same record delivered again stays a duplicate.
	// Scopes, topics and handler names, shared by most records of a batch,
	// are sent once each and referenced by 1-based index; trace ids (hex)
	// are sent joined by commas. Every string array element costs pgx an
	// allocation, so this keeps the claim's cost near one per key.
	// marked is true when the record at (topic, part, off) left a
	// dead-letter mark (DeadLetterKey) in scope, in any generation.
	marked := func(scope, topic, part, off string) string {
		k := `(select case when octet_length(c) <= ` + strconv.Itoa(MaxKeyLen) + `
		then c else '` + hashedPrefix + `' || encode(sha256(convert_to(c, 'UTF8')), 'hex') end
		from (select 'dead-letter:' || ` + topic + ` || '/' || ` + part + ` || '/' || ` + off + `) as x(c))`
		return `(exists (select 1 from ` + t + ` m where m.scope = ` + scope + ` and m.key = ` + k + `)
		or exists (select 1 from ` + s + ` m where m.scope = ` + scope + ` and m.key = ` + k + `))`
	}
	// blocked is true when a sealed generation decides the claim of key in
	// scope by the record at (topic, part, off): it holds the key applied,
	// or dead-lettered by this same record, or dead-lettered by another
	// record while this one was itself dead-lettered (marked). A key that
	// sealed generations hold only dead-lettered by other records is taken
	// over by inserting it into the current generation.
	blocked := func(scope, key, topic, part, off string) string {
		return `exists (select 1 from ` + s + ` s where s.scope = ` + scope + ` and s.key = ` + key + `
		and (s.state <> 'dead_lettered' or (s.topic, s.kafka_partition, s.kafka_offset) is not distinct from (` + topic + `, ` + part + `, ` + off + `)
			or ` + marked(scope, topic, part, off) + `))`
	}
	takeover := `on conflict (scope, key) do update set state = 'applied', self_counted = true, topic = excluded.topic,
	kafka_partition = excluded.kafka_partition, kafka_offset = excluded.kafka_offset,
	trace_id = excluded.trace_id, handler = excluded.handler, processed_at = now()
where g.state = 'dead_lettered' and (g.topic, g.kafka_partition, g.kafka_offset)
	is distinct from (excluded.topic, excluded.kafka_partition, excluded.kafka_offset)
	and not ` + marked("g.scope", "excluded.topic", "excluded.kafka_partition", "excluded.kafka_offset") + `
	and not exists (select 1 from ` + s + ` s where s.scope = g.scope and s.key = g.key and s.state <> 'dead_lettered')`
	// An index array ($2, $5, $10) is empty when its dictionary holds one
	// value, and the partitions ($6) hold one element when they are all
	// the same (a consumer's batch is one partition's): unnest pads the
	// shorter arrays with nulls, which stand for that one value.
	g.claimRecordsSQL = `with input as (
	select distinct on (si, k) si, k, ord, ti, pa, off, tr, hi
	from (
		select coalesce(si, 1) as si, k, coalesce(ti, 1) as ti, coalesce(pa, ($6::int[])[1]) as pa, off, tr, coalesce(hi, 1) as hi, ord
		from unnest($2::int[], $3::text[], $5::int[], $6::int[], $7::bigint[], string_to_array($8, ','), $10::int[])
			with ordinality as u(si, k, ti, pa, off, tr, hi, ord)
	) as u
	order by si, k, ord
), ins as (
	insert into ` + t + ` as g (scope, key, topic, kafka_partition, kafka_offset, trace_id, handler, self_counted)
	select ($1::text[])[si], k, ($4::text[])[ti], pa, off, nullif(tr, ''), ($9::text[])[hi], true from input
	where not ` + blocked("($1::text[])[si]", "k", "($4::text[])[ti]", "pa", "off") + `
	order by 1, 2
	` + takeover + `
	returning scope, key
)
select input.ord from ins join input on ($1::text[])[input.si] = ins.scope and input.k = ins.key`
	// The same claim for a single record, without the arrays: a batch of
	// one record (BatchMaxRecords 1) claims with it. It returns position 1
	// when it inserted (or took over) the row, as claimRecordsSQL does.
	g.claimOneSQL = `insert into ` + t + ` as g (scope, key, topic, kafka_partition, kafka_offset, trace_id, handler, self_counted)
select $1::text, $2::text, $3::text, $4::integer, $5::bigint, nullif($6::text, ''), $7::text, true
where not ` + blocked("$1", "$2", "$3", "$4", "$5") + `
` + takeover + `
returning 1::bigint`
	// claimOneSQL's insert without the takeover (QueueClaimNew): the
	// takeover clause's subqueries cost PostgreSQL their set-up on every
	// execution, whether the key exists or not. A key any sealed
	// generation holds is not inserted (ClaimRecords then decides).
	g.claimNewSQL = `insert into ` + t + ` (scope, key, topic, kafka_partition, kafka_offset, trace_id, handler, self_counted)
select $1::text, $2::text, $3::text, $4::integer, $5::bigint, nullif($6::text, ''), $7::text, true
where not exists (select 1 from ` + s + ` s where s.scope = $1 and s.key = $2)
on conflict (scope, key) do nothing
returning 1::bigint`
	// A keyed record also leaves a mark by its coordinates ($8), so that
	// its redelivery stays a duplicate after a copy at other coordinates
	// took the key's row over.
	// An applied row of another handler is left as it is: only a handler
	// sharing the scope with the one that applied it (a naturally
	// idempotent route beside a guarded one, say) marks such a key, and
	// its mark must not reopen an applied key to a takeover. The row of
	// the handler's own key (claimed in this transaction, or applied
	// earlier) is marked. Marks go into the current generation; a key a
	// sealed generation holds applied stays applied there (claims read
	// it as a duplicate whatever the current generation says).
	g.markDeadSQL = `with coords as (
	insert into ` + t + ` (scope, key, state, topic, kafka_partition, kafka_offset, trace_id, handler)
	select $1::text, $8::text, 'dead_lettered', $3::text, $4::integer, $5::bigint, nullif($6::text, ''), $7::text
	where $3 <> '' and $8 <> $2 and not exists (select 1 from ` + s + ` s where s.scope = $1 and s.key = $8)
	on conflict (scope, key) do nothing
)
insert into ` + t + ` as g (scope, key, state, topic, kafka_partition, kafka_offset, trace_id, handler)
select $1::text, $2::text, 'dead_lettered', $3::text, $4::integer, $5::bigint, nullif($6::text, ''), $7::text
where not exists (select 1 from ` + s + ` s where s.scope = $1 and s.key = $2 and s.state = 'applied' and s.handler is distinct from $7)
on conflict (scope, key) do update set state = 'dead_lettered', self_counted = null, topic = excluded.topic,
	kafka_partition = excluded.kafka_partition, kafka_offset = excluded.kafka_offset,
	trace_id = excluded.trace_id, handler = excluded.handler, processed_at = now()
where g.state <> 'applied' or g.handler is not distinct from excluded.handler`
	// A row claimed (or taken over) by the releasing transaction itself
	// (processed_at is its start, now()) is a delivery that does not
	// commit: its count goes with it.
	g.releaseSQL = countGone(`delete from `+t+` where scope = $1 and key = any($2::text[])`, selfCounted+` and processed_at <> now()`)
	// Lookups read the current generation, then the sealed ones.
	g.lookupSQL = `(select processed_at from ` + t + ` where scope = $1 and key = $2)
union all (select processed_at from ` + s + ` where scope = $1 and key = $2) limit 1`
	// One primary-key probe per key, whatever the planner thinks of the
	// table: "key = any($2)" with a long array on a table without
	// statistics (a young guard table) is estimated to keep every row, and
	// planned as a scan of the whole scope filtered by the array, which
	// grows with the table (a LATERAL subquery with LIMIT cannot become
	// such a scan or a hash join).
	g.claimedSQL = `select u.i, g.processed_at from unnest($2::text[]) with ordinality as u(k, i)
cross join lateral ((select processed_at from ` + t + ` g where g.scope = $1 and g.key = u.k)
	union all (select processed_at from ` + s + ` g where g.scope = $1 and g.key = u.k) limit 1) as g`
	g.cutoffSQL = `select now() - $1::bigint * interval '1 microsecond'`
	// Each min(processed_at) reads one end of a processed_at index; %s
	// is one more per legacy generation (OldestAge).
	g.oldestSQL = `select coalesce((extract(epoch from now() - least((select min(processed_at) from ` + t + `),
	(select min(until) from ` + g.gens + ` where until is not null and not legacy)%s)) * 1e6)::bigint, 0)`
	g.pruneSQL = g.pruneRowsSQL(t, "")
	return g
}

// countGone wraps deleted, a delete statement, into one that moves the
// applied count of every deleted row for which counted is true into a
// counter row (scope, topic, partition), and returns the rows deleted.
func (g *Guard) countGone(deleted, counted string) string {
	return `with gone as (` + deleted + ` returning scope, topic, kafka_partition, ` + counted + ` as counted),
counted as (
	insert into ` + g.outcomes + ` (scope, topic, partition, applied)
	select scope, topic, kafka_partition, count(*) from gone where counted group by 1, 2, 3
)
select count(*) from gone`
}

// pruneRowsSQL deletes up to $2 rows of table (a sanitized identifier)
// processed before $1, oldest first: the order makes it a scan of the
// processed_at index whatever the statistics say (without it, a planner
// that believes most rows expired reads the whole table to find the last
// few). The rows of a sealed generation (named sealed; "" for the current
// one) move no count once it was counted, which the statement reads from
// the generations table itself: a count that committed while it waited for
// its lock is seen.
func (g *Guard) pruneRowsSQL(table string, sealed string) string {
	counted := `state = 'applied' and self_counted`
	if sealed != "" {
		counted += ` and not coalesce((select counted from ` + g.gens + ` where name = ` + literal(sealed) + `), false)`
	}
	return g.countGone(`delete from `+table+` where ctid = any(array(select ctid from `+table+` where processed_at < $1 order by processed_at limit $2))`, counted)
}

// Table returns the guard table's identifier: {schema, name}, or {name} when
// no schema is configured. Use its Sanitize method to put it into SQL.
func (g *Guard) Table() pgx.Identifier {
	if g.schema == "" {
		return pgx.Identifier{g.name}
	}
	return pgx.Identifier{g.schema, g.name}
}

// ScopesTable returns the identifier of the table that belongs to g and
// records which scope each handler of a consumer group uses on a topic (the
// consumer's start-up check against a handler renamed without its scope):
// the guard table's name with the suffix "_scopes", in the same schema. The
// table is created by g.Migrate.
func (g *Guard) ScopesTable() pgx.Identifier {
	if g.schema == "" {
		return pgx.Identifier{g.name + "_scopes"}
	}
	return pgx.Identifier{g.schema, g.name + "_scopes"}
}

// HeldTable returns the identifier of the table that belongs to g and
// lists the records a consumer holds after a failed attempt, until their
// retry succeeds or dead-letters them (what `exactly status` and `exactly
// inspect` show as held): the guard table's name with the suffix "_held",
// in the same schema. The table is created by g.Migrate; the consumer
// writes it best effort, so it may lag behind the process.
func (g *Guard) HeldTable() pgx.Identifier {
	return g.sibling("_held")
}

// PausedTable returns the identifier of the table that belongs to g and
// lists the partitions whose fetching a consumer paused for key
// concurrency's bounds (consumer.Config.KeyConcurrency held records, or
// consumer.Config.MaxOffsetGap): the guard table's name with the suffix "_paused",
// in the same schema. The table is created by g.Migrate; the consumer
// writes it best effort, as HeldTable.
func (g *Guard) PausedTable() pgx.Identifier {
	return g.sibling("_paused")
}

// sibling is the identifier of the table named the guard table's name and
// suffix, in its schema.
func (g *Guard) sibling(suffix string) pgx.Identifier {
	if g.schema == "" {
		return pgx.Identifier{g.name + suffix}
	}
	return pgx.Identifier{g.schema, g.name + suffix}
}

// component names this guard's schema in the migrations table.
func (g *Guard) component() string { return "dedupe:" + g.quoted }

func (g *Guard) migrations() ([]migrate.Migration, error) {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("dedupe: open embedded migrations: %w", err)
	}
	data := struct {
		Schema, Table, Outcomes, Effects, Scopes, Held, Paused string
		Generations, Sealed, TableName                         string
	}{Table: g.quoted, Outcomes: g.outcomes,
		Effects: g.EffectsTable().Sanitize(), Scopes: g.ScopesTable().Sanitize(),
		Held: g.HeldTable().Sanitize(), Paused: g.PausedTable().Sanitize(),
		Generations: g.gens, Sealed: g.sealed, TableName: literal(g.name)}
	if g.schema != "" {
		data.Schema = pgx.Identifier{g.schema}.Sanitize()
	}
	migs, err := migrate.Load(sub, data)
	if err != nil {
		return nil, fmt.Errorf("dedupe: load migrations: %w", err)
	}
	return migs, nil
}

// Migrate creates or upgrades the default guard table ("exactly_guard" in the
// search_path). See Guard.Migrate.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return New().Migrate(ctx, pool)
}

// Migrate creates or upgrades g's table (and its schema, if configured and
// absent). It is idempotent and safe to run from several instances at once:
// migrators serialize on an advisory lock and a migrated schema is left
// unchanged. A guard table dropped after it was migrated together with its
// outcome counters and effects tables (its schema dropped with cascade) is
// created again from scratch, with a warning on slog.Default, although
// exactly_schema_migrations still records its versions. The guard table
// dropped alone is not: Migrate then fails (42P07) naming the companion
// table that still exists, to be dropped or the guard table restored; and a
// companion table dropped alone is not detected. It fails with the wrapped
// database error, leaving the schema as it was.
func (g *Guard) Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	migs, err := g.migrations()
	if err != nil {
		return err
	}
	if _, err := migrate.Apply(ctx, pool, g.component(), migs, migrate.WithTable(g.Table())); err != nil {
		return fmt.Errorf("dedupe: migrate %s: %w", g.quoted, err)
	}
	return nil
}

// SchemaVersion reports the guard table's schema version recorded in the
// database (0 when never migrated, and when the table does not exist
// whatever is recorded) and the latest version this package knows; current
// < latest means Migrate has work to do. It fails with the wrapped database
// error.
func (g *Guard) SchemaVersion(ctx context.Context, q Querier) (current, latest int, err error) {
	migs, err := g.migrations()
	if err != nil {
		return 0, 0, err
	}
	current, err = migrate.Version(ctx, q, g.component(), migrate.WithTable(g.Table()))
	if err != nil {
		return 0, 0, fmt.Errorf("dedupe: schema version of %s: %w", g.quoted, err)
	}
	return current, migrate.Latest(migs), nil
}

// ValidateScope reports whether scope can name keys in a guard table: at
// most MaxKeyLen bytes of valid UTF-8 without NUL. It fails wrapping
// ErrInvalidScope. Unlike keys, scopes are never hashed.
func ValidateScope(scope string) error { return checkScope(scope) }

func checkScope(scope string) error {
	if len(scope) > MaxKeyLen || strings.IndexByte(scope, 0) >= 0 || !utf8.ValidString(scope) {
		return fmt.Errorf("%w: %q", ErrInvalidScope, scope)
	}
	return nil
}

// Claim claims key in scope inside tx, the transaction that performs the
// key's effect. It returns Applied when tx now owns the key (do the work, and
// the claim commits or rolls back with it) and Duplicate when a committed
// transaction, or tx itself, claimed it before. If another open transaction
// holds the key, Claim blocks until it ends: Duplicate if it committed,
// Applied if it rolled back. Across a rotation of the guard's generations
// (see Pruner) this holds for transactions at READ COMMITTED, PostgreSQL's
// default: a REPEATABLE READ snapshot taken before a rotation does not see
// the claims committed just before it.
//
// The key is normalized with NormalizeKey. Claim fails wrapping ErrEmptyKey
// for an empty key, ErrInvalidScope for an unstorable scope, and wrapping the
// database error otherwise (after which tx is aborted and must be rolled back;
// serialization failures and deadlocks are worth retrying).
func (g *Guard) Claim(ctx context.Context, tx pgx.Tx, scope, key string) (Outcome, error) {
	if key == "" {
		return "", fmt.Errorf("dedupe: claim in scope %q: %w", scope, ErrEmptyKey)
	}
	if err := checkScope(scope); err != nil {
		return "", fmt.Errorf("dedupe: claim: %w", err)
	}
	var inserted bool
	err := tx.QueryRow(ctx, g.claimSQL, scope, NormalizeKey(key)).Scan(&inserted)
	switch {
	case err == nil:
		return Applied, nil
	case errors.Is(err, pgx.ErrNoRows):
		return Duplicate, nil
	default:
		return "", fmt.Errorf("dedupe: claim %q in scope %q: %w", key, scope, err)
	}
}

// normalizeKeys returns keys normalized, reusing the input slice when every
// key is already in normal form. It fails wrapping ErrEmptyKey.
func normalizeKeys(keys []string) ([]string, error) {
	out, copied := keys, false
	for i, k := range keys {
		if k == "" {
			return nil, fmt.Errorf("key at index %d: %w", i, ErrEmptyKey)
		}
		n := NormalizeKey(k)
		if len(n) == len(k) && n == k {
			continue
		}
		if !copied {
			out, copied = make([]string, len(keys)), true
			copy(out, keys)
		}
		out[i] = n
	}
	return out, nil
}

// ClaimBatch claims many keys of one scope inside tx in a single statement.
// The result is aligned with keys: result[i] is the outcome of keys[i]. A key
// repeated within keys is Applied at most at its first occurrence and
// Duplicate at the later ones. Keys are inserted in sorted order, so two
// transactions claiming overlapping keys in any order block on each other
// rather than deadlock; as with Claim, a key held by another open transaction
// makes ClaimBatch wait for it.
//
// A key marked dead-lettered is a Duplicate here; ClaimRecords, which knows
// the records' coordinates, lets another record take such a mark over.
//
// Keys are normalized with NormalizeKey. An empty keys slice returns nil
// without a round trip. ClaimBatch fails, without claiming anything, wrapping
// ErrEmptyKey (naming the index) or ErrInvalidScope, and wraps the database
// error otherwise (tx is then aborted).
func (g *Guard) ClaimBatch(ctx context.Context, tx pgx.Tx, scope string, keys []string) ([]Outcome, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	if err := checkScope(scope); err != nil {
		return nil, fmt.Errorf("dedupe: claim batch: %w", err)
	}
	norm, err := normalizeKeys(keys)
	if err != nil {
		return nil, fmt.Errorf("dedupe: claim batch in scope %q: %w", scope, err)
	}
	rows, err := tx.Query(ctx, g.claimBatchSQL, scope, pgarray.Text(norm))
	if err != nil {
		return nil, fmt.Errorf("dedupe: claim batch of %d keys in scope %q: %w", len(keys), scope, err)
	}
	out := make([]Outcome, len(keys))
	err = readClaimed(rows, out)
	if err != nil {
		return nil, fmt.Errorf("dedupe: claim batch of %d keys in scope %q: %w", len(keys), scope, err)
	}
	return out, nil
}

// readClaimed reads the 1-based input positions a claim statement returned
// for the keys it inserted (Applied); the others of n are Duplicate. It
// closes rows.
func readClaimed(rows pgx.Rows, out []Outcome) error {
	defer rows.Close()
	n := len(out)
	for i := range out {
		out[i] = Duplicate
	}
	// Decode the positions from the raw values: rows.Scan would allocate per
	// row on this hot path.
	for rows.Next() {
		ord, err := rawInt8(rows.RawValues()[0], rows.FieldDescriptions()[0].Format)
		if err == nil && (ord < 1 || ord > int64(n)) {
			err = fmt.Errorf("position %d out of range", ord)
		}
		if err != nil {
			return fmt.Errorf("read result: %w", err)
		}
		out[ord-1] = Applied
	}
	return rows.Err()
}

// Release deletes the guard rows of keys in scope inside tx, so the keys are
// unclaimed again once tx commits: use it when a record of a batch fails and
// its effect is rolled back (to a savepoint). To record that a record was
// dead-lettered, keep its row with MarkDeadLettered instead, so that a
// redelivery is a duplicate rather than a second dead letter. A row
// ClaimRecords claimed in an earlier transaction keeps its applied count (in
// a counter row); one claimed by tx itself (its processed_at is tx's start)
// counts nothing, as its delivery does not commit. Release deletes rows of
// the current generation only: a key claimed in a generation the Pruner
// has sealed stays claimed until that generation is dropped. Releasing a key
// that is not claimed is not an error; no keys is a no-op. Keys are
// normalized with NormalizeKey. Release fails wrapping ErrEmptyKey,
// ErrInvalidScope, or the database error.
func (g *Guard) Release(ctx context.Context, tx pgx.Tx, scope string, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	if err := checkScope(scope); err != nil {
		return fmt.Errorf("dedupe: release: %w", err)
	}
	norm, err := normalizeKeys(keys)
	if err != nil {
		return fmt.Errorf("dedupe: release in scope %q: %w", scope, err)
	}
	var released int64
	if err := tx.QueryRow(ctx, g.releaseSQL, scope, norm).Scan(&released); err != nil {
		return fmt.Errorf("dedupe: release %d keys in scope %q: %w", len(keys), scope, err)
	}
	return nil
}

// Lookup reports when key was claimed in scope, as seen by q (a transaction
// sees its own uncommitted claims), so a duplicate can be traced to the
// earlier processing it matched. found is false when no row exists (never
// claimed, released, or pruned). The key is normalized with NormalizeKey.
// Lookup fails wrapping ErrEmptyKey, ErrInvalidScope or the database error.
func (g *Guard) Lookup(ctx context.Context, q Querier, scope, key string) (processedAt time.Time, found bool, err error) {
	if key == "" {
		return time.Time{}, false, fmt.Errorf("dedupe: lookup in scope %q: %w", scope, ErrEmptyKey)
	}
	if err := checkScope(scope); err != nil {
		return time.Time{}, false, fmt.Errorf("dedupe: lookup: %w", err)
	}
	err = q.QueryRow(ctx, g.lookupSQL, scope, NormalizeKey(key)).Scan(&processedAt)
	switch {
	case err == nil:
		return processedAt, true, nil
	case errors.Is(err, pgx.ErrNoRows):
		return time.Time{}, false, nil
	default:
		return time.Time{}, false, fmt.Errorf("dedupe: lookup %q in scope %q: %w", key, scope, err)
	}
}

// Claimed reports, for each of keys, whether a guard row exists for it in
// scope as q sees it (claimed and committed, or dead-lettered), in one
// statement. The consumer asks it outside any transaction, before the
// pre-transaction calls of handler.WithCall, to skip the calls of records
// that are duplicates. The result is aligned with keys; keys are
// normalized with NormalizeKey. Claimed fails wrapping ErrEmptyKey,
// ErrInvalidScope or the database error.
func (g *Guard) Claimed(ctx context.Context, q Querier, scope string, keys []string) ([]bool, error) {
	at, err := g.lookupKeys(ctx, q, "claimed", scope, keys)
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(keys))
	for i, t := range at {
		out[i] = !t.IsZero()
	}
	return out, nil
}

// LookupKeys is [Guard.Lookup] for many keys of one scope, in one
// statement: for each of keys (the result is aligned with them), when its
// guard row was processed, or the zero time when it has none. It probes
// the guard's primary key once per key, so its cost does not grow with
// the table. The consumer reads the duplicates of a batch with it, for
// their "exactly.duplicate" span events. The keys are normalized with
// NormalizeKey. LookupKeys fails wrapping ErrEmptyKey, ErrInvalidScope or
// the database error.
func (g *Guard) LookupKeys(ctx context.Context, q Querier, scope string, keys []string) ([]time.Time, error) {
	return g.lookupKeys(ctx, q, "lookup keys", scope, keys)
}

// lookupKeys runs claimedSQL for keys; op names the caller in errors.
func (g *Guard) lookupKeys(ctx context.Context, q Querier, op, scope string, keys []string) ([]time.Time, error) {
	if err := checkScope(scope); err != nil {
		return nil, fmt.Errorf("dedupe: %s: %w", op, err)
	}
	norm, err := normalizeKeys(keys)
	if err != nil {
		return nil, fmt.Errorf("dedupe: %s in scope %q: %w", op, scope, err)
	}
	out := make([]time.Time, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	rows, err := q.Query(ctx, g.claimedSQL, scope, pgarray.Text(norm))
	if err != nil {
		return nil, fmt.Errorf("dedupe: %s, %d keys in scope %q: %w", op, len(keys), scope, err)
	}
	var i int64
	var at time.Time
	_, err = pgx.ForEachRow(rows, []any{&i, &at}, func() error {
		if i < 1 || i > int64(len(out)) {
			return fmt.Errorf("row for key number %d of %d", i, len(out))
		}
		out[i-1] = at
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dedupe: %s, %d keys in scope %q: %w", op, len(keys), scope, err)
	}
	return out, nil
}

// rawInt8 decodes a bigint column value sent in format (0 text, 1 binary).
func rawInt8(v []byte, format int16) (int64, error) {
	if format == pgx.BinaryFormatCode {
		if len(v) != 8 {
			return 0, fmt.Errorf("bigint of %d bytes", len(v))
		}
		return int64(binary.BigEndian.Uint64(v)), nil
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("decode bigint: %w", err)
	}
	return n, nil
}
