package dedupe

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// GenerationsTable returns the identifier of the table that belongs to g
// and lists its generations (see [Generation]): the guard table's name with
// the suffix "_generations", in the same schema. The table is created by
// g.Migrate and maintained by the Pruner.
func (g *Guard) GenerationsTable() pgx.Identifier { return g.sibling("_generations") }

// SealedView returns the identifier of the view that belongs to g and
// reads every sealed generation (one union all branch each, rebuilt by the
// Pruner whenever a generation is sealed, counted or dropped): the guard
// table's name with the suffix "_sealed", in the same schema. Its columns
// are the guard table's, then generation (the sealed table's name) and
// counted (whether its applied rows were moved into the outcome counters).
func (g *Guard) SealedView() pgx.Identifier { return g.sibling("_sealed") }

// Generation is one generation of a guard: a table of guard rows claimed
// while it was the current generation.
type Generation struct {
	// Name is the table's name in the guard's schema; the current
	// generation is the guard table itself.
	Name string
	// Since is when the generation became current; Until when the Pruner
	// sealed it (zero for the current generation). Every row of a sealed
	// generation was claimed by a transaction that started before Until.
	Since, Until time.Time
	// Counted reports that the generation's self-counted applied rows were
	// moved into the outcome counters (readers no longer count its rows).
	Counted bool
	// Legacy marks the table migration 0009 found: the Pruner also deletes
	// its expired rows one by one, until it drops it.
	Legacy bool
	// Rows is the number of rows: exact once Counted or while the table is
	// under 16 MiB, otherwise the database's estimate (its statistics).
	Rows int64
	// Bytes is the table's size with its indexes (pg_total_relation_size).
	Bytes int64
}

// ident returns the identifier of the generation table name.
func (g *Guard) ident(name string) pgx.Identifier {
	if g.schema == "" {
		return pgx.Identifier{name}
	}
	return pgx.Identifier{g.schema, name}
}

// literal quotes s as an SQL string literal (standard_conforming_strings,
// on by default since PostgreSQL 9.1).
func literal(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

// generationsSQL lists the generations with their sizes, oldest first; $1 is
// the guard's schema ("" for the search_path). It reads the catalogs and
// the statistics, never a generation's rows.
const generationsSQL = `select name, since, until, counted, legacy,
	coalesce(row_count, case
		when pg_relation_size(c.oid) <= ` + exactBelow + ` then (xpath('/row/c/text()',
			query_to_xml(format('select count(*) as c from %%s', c.oid::regclass), false, true, '')))[1]::text::bigint
		when pg_stat_get_live_tuples(c.oid) > 0 then pg_stat_get_live_tuples(c.oid)
		else greatest(c.reltuples, 0)::bigint end, 0),
	coalesce(pg_total_relation_size(c.oid), 0)
from %s gen
left join pg_class c on c.oid = to_regclass(case when $1 = '' then quote_ident(gen.name) else quote_ident($1) || '.' || quote_ident(gen.name) end)
order by until is null, since`

// exactBelow is the heap size (bytes, 16 MiB: about 80,000 rows) under
// which Generations counts a generation's rows instead of estimating them:
// a count that costs a few milliseconds, and exact figures for a young
// guard whose statistics lag.
const exactBelow = "16777216"

// Generations lists g's generations, the oldest first and the current one
// last, with their sizes: counted rows for a generation under 16 MiB of
// heap or already counted, the database's statistics otherwise. It costs
// a few catalog reads and at most a 16 MiB read at any guard size. It fails with the wrapped database
// error (42P01 when the table is not migrated to generations).
func (g *Guard) Generations(ctx context.Context, q Querier) ([]Generation, error) {
	rows, err := q.Query(ctx, fmt.Sprintf(generationsSQL, g.gens), g.schema)
	if err != nil {
		return nil, fmt.Errorf("dedupe: listing the generations of %s: %w", g.quoted, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Generation, error) {
		var gen Generation
		var until *time.Time
		err := r.Scan(&gen.Name, &gen.Since, &until, &gen.Counted, &gen.Legacy, &gen.Rows, &gen.Bytes)
		if until != nil {
			gen.Until = *until
		}
		return gen, err
	})
	if err != nil {
		return nil, fmt.Errorf("dedupe: listing the generations of %s: %w", g.quoted, err)
	}
	return out, nil
}

// sealedViewSQL returns the statement that redefines the sealed view over
// gens (name and counted of each sealed generation).
func (g *Guard) sealedViewSQL(gens []Generation) string {
	var b strings.Builder
	b.WriteString(`create or replace view ` + g.sealed + ` as
select null::text as scope, null::text as key, null::text as state, null::text as topic,
    null::integer as kafka_partition, null::bigint as kafka_offset, null::text as trace_id,
    null::text as handler, null::boolean as self_counted, null::timestamptz as processed_at,
    null::text as generation, null::boolean as counted
where false`)
	// counted is read from the generations table by an uncorrelated
	// subquery: a filter on it (not counted) is a one-time filter of its
	// branch, evaluated before the branch reads a row, and the pruner
	// marks a generation counted without redefining the view.
	for _, gen := range gens {
		name := literal(gen.Name)
		b.WriteString("\nunion all select scope, key, state, topic, kafka_partition, kafka_offset, trace_id, handler, self_counted, processed_at, ")
		b.WriteString(name + "::text, (select counted from " + g.gens + " where name = " + name + ") from " + g.ident(gen.Name).Sanitize())
	}
	return b.String()
}

// sealedGensSQL lists the sealed generations, oldest first.
const sealedGensSQL = `select name from %s where until is not null order by since`

// rebuildSealed redefines the sealed view from the generations table, as tx
// sees it.
func (g *Guard) rebuildSealed(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, fmt.Sprintf(sealedGensSQL, g.gens))
	if err != nil {
		return fmt.Errorf("listing sealed generations: %w", err)
	}
	gens, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Generation, error) {
		var gen Generation
		return gen, r.Scan(&gen.Name)
	})
	if err != nil {
		return fmt.Errorf("listing sealed generations: %w", err)
	}
	if _, err := tx.Exec(ctx, g.sealedViewSQL(gens)); err != nil {
		return fmt.Errorf("redefining %s: %w", g.sealed, err)
	}
	return nil
}

// generationName is the name of the generation sealed at stamp (UTC,
// YYYYMMDDtHHMMSSffffff): the guard table's name, truncated so that the
// whole fits PostgreSQL's 63-byte identifiers, and "_g" and stamp.
func (g *Guard) generationName(stamp string) string {
	suffix := "_g" + stamp
	base := g.name
	if n := 63 - len(suffix); len(base) > n {
		base = base[:n]
		for len(base) > 0 && !utfStart(base[len(base)-1:]) {
			base = base[:len(base)-1]
		}
	}
	return base + suffix
}

// utfStart reports whether b's first byte starts a UTF-8 sequence.
func utfStart(b string) bool { return b[0]&0xC0 != 0x80 }

// rotateDueSQL reads the current generation: whether it has been current
// for at least $2 microseconds, and a stamp naming it when sealed now.
const rotateDueSQL = `select now() - since >= $2::bigint * interval '1 microsecond',
	to_char(now() at time zone 'UTC', 'YYYYMMDD"t"HH24MISSUS') from %s where name = $1 and until is null`

// rotate seals the current generation when it has been current for at
// least span: in one transaction it locks the guard table (waiting for
// every transaction that claimed in it), renames it to a sealed
// generation, creates an empty guard table like it, and redefines the
// sealed view. Claims that wait for the lock then insert into the new
// table and find the sealed rows through the view. It reports whether it
// rotated.
func (g *Guard) rotate(ctx context.Context, tx pgx.Tx, span time.Duration) (bool, error) {
	var due bool
	var stamp string
	err := tx.QueryRow(ctx, fmt.Sprintf(rotateDueSQL, g.gens), g.name, span.Microseconds()).Scan(&due, &stamp)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !due) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading the current generation: %w", err)
	}
	name := g.generationName(stamp)
	sealed := g.ident(name).Sanitize()
	for _, stmt := range []string{
		`lock table ` + g.quoted + ` in access exclusive mode`,
		`alter table ` + g.quoted + ` rename to ` + pgx.Identifier{name}.Sanitize(),
		`create table ` + g.quoted + ` (like ` + sealed + ` including all)`,
	} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return false, fmt.Errorf("sealing the current generation as %s: %w", sealed, err)
		}
	}
	if err := copyGrants(ctx, tx, sealed, g.quoted); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`update %s set name = $2, until = now() where name = $1 and until is null`, g.gens), g.name, name); err != nil {
		return false, fmt.Errorf("recording generation %s: %w", sealed, err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`insert into %s (name, since) values ($1, now())`, g.gens), g.name); err != nil {
		return false, fmt.Errorf("recording the new current generation: %w", err)
	}
	return true, g.rebuildSealed(ctx, tx)
}

// grantsSQL lists the privileges granted on table $1 to roles other than
// its owner: privilege, grantee ("" for PUBLIC), grantable.
const grantsSQL = `select a.privilege_type, coalesce(pg_get_userbyid(nullif(a.grantee, 0)), ''), a.is_grantable
from pg_class c cross join lateral aclexplode(c.relacl) as a
where c.oid = $1::regclass and a.grantee <> c.relowner`

// privileges are the table privileges copyGrants copies.
var privileges = map[string]bool{"SELECT": true, "INSERT": true, "UPDATE": true, "DELETE": true,
	"TRUNCATE": true, "REFERENCES": true, "TRIGGER": true}

// copyGrants grants on table to what from has been granted (CREATE TABLE
// … LIKE copies no privileges): the application role keeps its access to
// the new current generation.
func copyGrants(ctx context.Context, tx pgx.Tx, from, to string) error {
	rows, err := tx.Query(ctx, grantsSQL, from)
	if err != nil {
		return fmt.Errorf("reading the grants on %s: %w", from, err)
	}
	type grant struct {
		priv, grantee string
		option        bool
	}
	grants, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (grant, error) {
		var gr grant
		return gr, r.Scan(&gr.priv, &gr.grantee, &gr.option)
	})
	if err != nil {
		return fmt.Errorf("reading the grants on %s: %w", from, err)
	}
	for _, gr := range grants {
		if !privileges[gr.priv] {
			continue
		}
		who := "public"
		if gr.grantee != "" {
			who = pgx.Identifier{gr.grantee}.Sanitize()
		}
		stmt := `grant ` + strings.ToLower(gr.priv) + ` on ` + to + ` to ` + who
		if gr.option {
			stmt += ` with grant option`
		}
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("granting on %s what %s grants: %w", to, from, err)
		}
	}
	return nil
}

// isNotOwner reports whether err is PostgreSQL's insufficient privilege
// (42501): sealing, counting and dropping generations need the owner of
// the guard's tables.
func isNotOwner(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42501"
}

// foldOne moves the self-counted applied rows of the oldest sealed
// generation not yet counted into the outcome counters, records its row
// count and marks it counted, in one transaction without DDL (the view
// reads counted from the generations table): one sequential read of that
// generation, once in its life. It reports whether there was one.
func (g *Guard) foldOne(ctx context.Context, tx pgx.Tx) (bool, error) {
	var name string
	err := tx.QueryRow(ctx, fmt.Sprintf(`select name from %s where until is not null and not counted order by since limit 1`, g.gens)).Scan(&name)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("finding a generation to count: %w", err)
	}
	t := g.ident(name).Sanitize()
	// Share mode: claims read the generation meanwhile; the row-by-row
	// prune of a legacy generation, which deletes from it, waits.
	if _, err := tx.Exec(ctx, `lock table `+t+` in share mode`); err != nil {
		return false, fmt.Errorf("locking generation %s: %w", t, err)
	}
	var total int64
	err = tx.QueryRow(ctx, `with c as (
	select scope, topic, kafka_partition, count(*) filter (where state = 'applied' and self_counted) as n, count(*) as total
	from `+t+` group by 1, 2, 3
), ins as (
	insert into `+g.outcomes+` (scope, topic, partition, applied)
	select scope, topic, kafka_partition, n from c where n > 0
)
select coalesce(sum(total), 0)::bigint from c`).Scan(&total)
	if err != nil {
		return false, fmt.Errorf("counting generation %s: %w", t, err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`update %s set counted = true, row_count = $2 where name = $1`, g.gens), name, total); err != nil {
		return false, fmt.Errorf("recording generation %s counted: %w", t, err)
	}
	return true, nil
}

// dropOne drops the oldest sealed generation sealed before cutoff (all its
// rows are older), once counted, and returns its rows; ok is false when
// there is none.
func (g *Guard) dropOne(ctx context.Context, tx pgx.Tx, cutoff time.Time) (rows int64, ok bool, err error) {
	var name string
	err = tx.QueryRow(ctx, fmt.Sprintf(`delete from %s where name = (
	select name from %[1]s where until is not null and counted and until < $1 order by since limit 1
) returning name, coalesce(row_count, 0)`, g.gens), cutoff).Scan(&name, &rows)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("finding an expired generation: %w", err)
	}
	if err := g.rebuildSealed(ctx, tx); err != nil {
		return 0, false, err
	}
	t := g.ident(name).Sanitize()
	if _, err := tx.Exec(ctx, `drop table if exists `+t); err != nil {
		return 0, false, fmt.Errorf("dropping generation %s: %w", t, err)
	}
	return rows, true, nil
}

// legacyGens lists the sealed legacy generations (pruned row by row until
// dropped), or every sealed generation with all.
func (g *Guard) legacyGens(ctx context.Context, q Querier, all bool) ([]Generation, error) {
	rows, err := q.Query(ctx, fmt.Sprintf(`select name, counted from %s where until is not null and (legacy or $1) order by since`, g.gens), all)
	if err != nil {
		return nil, fmt.Errorf("listing legacy generations: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Generation, error) {
		var gen Generation
		return gen, r.Scan(&gen.Name, &gen.Counted)
	})
}

// isLockTimeout reports whether err is PostgreSQL's lock_timeout (55P03).
func isLockTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}
