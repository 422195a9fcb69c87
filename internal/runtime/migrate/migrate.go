package migrate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TableName is the name of the table, in the search_path's first schema, that
// records which migrations have been applied.
const TableName = "exactly_schema_migrations"

// lockKey is the text hashed (hashtext) into the transaction-scoped advisory
// lock every migrator takes. One lock for all components: migrations are rare,
// and a single lock also serializes the creation of TableName itself.
const lockKey = "exactly_schema_migrations"

// ErrInvalidMigrations reports a migration list that cannot be applied: a
// version that is not positive, versions out of order or repeated, an empty
// name or SQL text, or a file name Load cannot parse.
var ErrInvalidMigrations = errors.New("invalid migrations")

// Migration is one versioned step of a component's schema.
type Migration struct {
	// Version orders the migrations of one component; positive, strictly
	// increasing, never reused.
	Version int
	// Name describes the step; it is recorded next to the version.
	Name string
	// SQL is the statement text, already rendered (see Load). It may hold
	// several statements separated by semicolons.
	SQL string
}

// Error reports a failure while applying one migration of a component; Err is
// the underlying cause (often a *pgconn.PgError, reachable with errors.As).
type Error struct {
	Component string
	Version   int
	Name      string
	Err       error
}

// Error describes the failed migration and its cause.
func (e *Error) Error() string {
	return fmt.Sprintf("migrate %s: apply version %d (%s): %v", e.Component, e.Version, e.Name, e.Err)
}

// Unwrap returns the underlying cause.
func (e *Error) Unwrap() error { return e.Err }

// Load reads the migrations in the root directory of fsys: every file named
// NNNN_name.sql (NNNN a positive decimal version) is parsed as a text/template
// and executed with data. Other files are ignored. The result is sorted by
// version. It fails, wrapping ErrInvalidMigrations, on an unparsable name or a
// repeated version, and with the template error when rendering fails.
func Load(fsys fs.FS, data any) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("migrate: read migrations directory: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		base := strings.TrimSuffix(e.Name(), ".sql")
		num, name, ok := strings.Cut(base, "_")
		version, perr := strconv.Atoi(num)
		if !ok || perr != nil || version <= 0 || name == "" {
			return nil, fmt.Errorf("migrate: file %q is not named NNNN_name.sql: %w", e.Name(), ErrInvalidMigrations)
		}
		text, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("migrate: read %s: %w", e.Name(), err)
		}
		tmpl, err := template.New(e.Name()).Option("missingkey=error").Parse(string(text))
		if err != nil {
			return nil, fmt.Errorf("migrate: parse template %s: %w", e.Name(), err)
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, data); err != nil {
			return nil, fmt.Errorf("migrate: render template %s: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: version, Name: name, SQL: buf.String()})
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	if err := validate(out); err != nil {
		return nil, err
	}
	return out, nil
}

// Latest returns the highest version in migrations, or 0 when it is empty.
func Latest(migrations []Migration) int {
	v := 0
	for _, m := range migrations {
		v = max(v, m.Version)
	}
	return v
}

func validate(migrations []Migration) error {
	prev := 0
	for _, m := range migrations {
		switch {
		case m.Version <= prev:
			return fmt.Errorf("migrate: version %d (%s) is not positive and greater than %d: %w", m.Version, m.Name, prev, ErrInvalidMigrations)
		case m.Name == "":
			return fmt.Errorf("migrate: version %d has no name: %w", m.Version, ErrInvalidMigrations)
		case strings.TrimSpace(m.SQL) == "":
			return fmt.Errorf("migrate: version %d (%s) has no SQL: %w", m.Version, m.Name, ErrInvalidMigrations)
		}
		prev = m.Version
	}
	return nil
}

// Option tunes Apply and Version.
type Option func(*options)

type options struct {
	table pgx.Identifier
}

// WithTable names the component's main table (the one its first migration
// creates). Apply then re-creates a dropped table: when versions are
// recorded for the component but the table does not exist (its schema was
// dropped with cascade, a fixture reset it, part of a database was
// restored), the recorded versions are forgotten and every migration is
// applied again. Version reports 0 for such a component. A table that exists
// but lacks what later migrations added is not detected.
func WithTable(table pgx.Identifier) Option {
	return func(o *options) { o.table = table }
}

// Result is what Apply did.
type Result struct {
	// Applied lists the migrations applied, in version order; empty when
	// the schema was current.
	Applied []Migration
	// Recreated is the version that was recorded for the component when its
	// table (see WithTable) was found missing and the recorded versions
	// were forgotten; 0 when that did not happen.
	Recreated int
}

// Apply brings component's schema up to date: in one transaction it takes the
// migrators' advisory lock (waiting for any concurrent migrator), creates the
// exactly_schema_migrations table if absent, and applies and records every
// migration whose version is not yet recorded for component, in version order.
// With WithTable, a component whose versions are recorded but whose table is
// missing has its records deleted first, in the same transaction, and is
// migrated from scratch (Result.Recreated says so, and a warning naming the
// table goes to slog.Default once it has committed).
//
// migrations must be sorted by strictly increasing positive version, or Apply
// fails wrapping ErrInvalidMigrations. A failing migration returns an *Error
// and rolls everything back; other failures (connection, lock, bookkeeping)
// are returned wrapped with what was being done.
func Apply(ctx context.Context, pool *pgxpool.Pool, component string, migrations []Migration, opts ...Option) (Result, error) {
	var res Result
	if err := validate(migrations); err != nil {
		return res, err
	}
	o := collect(opts)
	tx, err := pool.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("migrate %s: begin transaction: %w", component, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if _, err := tx.Exec(ctx, "select pg_advisory_xact_lock(hashtext($1))", lockKey); err != nil {
		return res, fmt.Errorf("migrate %s: take advisory lock: %w", component, err)
	}
	table := pgx.Identifier{TableName}.Sanitize()
	if _, err := tx.Exec(ctx, `create table if not exists `+table+` (
	component  text        not null,
	version    integer     not null,
	name       text        not null,
	applied_at timestamptz not null default now(),
	primary key (component, version)
)`); err != nil {
		return res, fmt.Errorf("migrate %s: create %s: %w", component, TableName, err)
	}
	applied, err := versions(ctx, tx, component)
	if err != nil {
		return res, err
	}
	if len(applied) > 0 && o.table != nil {
		exists, err := tableExists(ctx, tx, o.table)
		if err != nil {
			return res, fmt.Errorf("migrate %s: %w", component, err)
		}
		if !exists {
			if _, err := tx.Exec(ctx, `delete from `+table+` where component = $1`, component); err != nil {
				return res, fmt.Errorf("migrate %s: forget the versions of missing table %s: %w", component, o.table.Sanitize(), err)
			}
			res.Recreated, applied = applied[len(applied)-1], nil
		}
	}
	for _, m := range migrations {
		if _, ok := slices.BinarySearch(applied, m.Version); ok {
			continue
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			if res.Recreated > 0 {
				err = fmt.Errorf("re-creating missing table %s (version %d was recorded): %w", o.table.Sanitize(), res.Recreated, err)
			}
			return Result{}, &Error{Component: component, Version: m.Version, Name: m.Name, Err: err}
		}
		if _, err := tx.Exec(ctx, `insert into `+table+` (component, version, name) values ($1, $2, $3)`,
			component, m.Version, m.Name); err != nil {
			return Result{}, &Error{Component: component, Version: m.Version, Name: m.Name, Err: fmt.Errorf("record version: %w", err)}
		}
		res.Applied = append(res.Applied, m)
	}
	if err := tx.Commit(ctx); err != nil {
		return Result{}, fmt.Errorf("migrate %s: commit: %w", component, err)
	}
	if res.Recreated > 0 {
		slog.Default().WarnContext(ctx, "table was missing though its schema version was recorded; created it again",
			"component", component, "table", o.table.Sanitize(), "recorded_version", res.Recreated, "version", Latest(migrations))
	}
	return res, nil
}

func collect(opts []Option) options {
	var o options
	for _, f := range opts {
		f(&o)
	}
	return o
}

// tableExists reports whether table resolves to a relation (through the
// search_path when it is not schema-qualified).
func tableExists(ctx context.Context, q Querier, table pgx.Identifier) (bool, error) {
	var exists bool
	if err := q.QueryRow(ctx, "select to_regclass($1) is not null", table.Sanitize()).Scan(&exists); err != nil {
		return false, fmt.Errorf("look up table %s: %w", table.Sanitize(), err)
	}
	return exists, nil
}

// Querier is what Version needs: satisfied by pgx.Tx, *pgx.Conn, *pgxpool.Pool
// and *pgxpool.Conn.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Version returns the highest version recorded for component, or 0 when none
// is (including when the exactly_schema_migrations table does not exist yet)
// and, with WithTable, when the component's table does not exist. It fails
// with the wrapped database error.
func Version(ctx context.Context, q Querier, component string, opts ...Option) (int, error) {
	exists, err := tableExists(ctx, q, pgx.Identifier{TableName})
	if err != nil {
		return 0, fmt.Errorf("migrate %s: %w", component, err)
	}
	if !exists {
		return 0, nil
	}
	if t := collect(opts).table; t != nil {
		if exists, err = tableExists(ctx, q, t); err != nil {
			return 0, fmt.Errorf("migrate %s: %w", component, err)
		}
		if !exists {
			return 0, nil
		}
	}
	vs, err := versions(ctx, q, component)
	if err != nil {
		return 0, err
	}
	if len(vs) == 0 {
		return 0, nil
	}
	return vs[len(vs)-1], nil
}

// versions returns the sorted versions recorded for component.
func versions(ctx context.Context, q Querier, component string) ([]int, error) {
	rows, err := q.Query(ctx, `select version from `+pgx.Identifier{TableName}.Sanitize()+` where component = $1 order by version`, component)
	if err != nil {
		return nil, fmt.Errorf("migrate %s: read applied versions: %w", component, err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("migrate %s: read applied versions: %w", component, err)
	}
	return vs, nil
}
