package migrate_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/internal/runtime/migrate"
	"github.com/exactly-go/exactly/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func files() fstest.MapFS {
	return fstest.MapFS{
		"0001_create.sql": {Data: []byte(`create table {{.Table}} (id int primary key);`)},
		"0002_add_col.sql": {Data: []byte(`alter table {{.Table}} add column note text;
insert into {{.Table}} values (1, 'x');`)},
		"README.md": {Data: []byte("ignored")},
	}
}

func TestLoad(t *testing.T) {
	migs, err := migrate.Load(files(), map[string]string{"Table": pgx.Identifier{"s", `we"ird`}.Sanitize()})
	if err != nil {
		t.Fatal(err)
	}
	if len(migs) != 2 || migs[0].Version != 1 || migs[1].Name != "add_col" || migrate.Latest(migs) != 2 {
		t.Fatalf("Load = %+v", migs)
	}
	if want := `create table "s"."we""ird" (id int primary key);`; migs[0].SQL != want {
		t.Fatalf("rendered %q, want %q", migs[0].SQL, want)
	}
	for name, fsys := range map[string]fstest.MapFS{
		"bad name":  {"create.sql": {Data: []byte("select 1")}},
		"zero":      {"0000_x.sql": {Data: []byte("select 1")}},
		"duplicate": {"1_a.sql": {Data: []byte("select 1")}, "01_b.sql": {Data: []byte("select 1")}},
	} {
		if _, err := migrate.Load(fsys, nil); !errors.Is(err, migrate.ErrInvalidMigrations) {
			t.Errorf("%s: err = %v, want ErrInvalidMigrations", name, err)
		}
	}
	if _, err := migrate.Load(files(), map[string]string{}); err == nil {
		t.Error("missing template key accepted")
	}
}

func TestApplyIsIdempotentAndPerComponent(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	a, _ := migrate.Load(files(), map[string]string{"Table": pgx.Identifier{"a"}.Sanitize()})
	b, _ := migrate.Load(files(), map[string]string{"Table": pgx.Identifier{"b"}.Sanitize()})

	if v, err := migrate.Version(ctx, pool, "a"); err != nil || v != 0 {
		t.Fatalf("Version before = %d, %v", v, err)
	}
	res, err := migrate.Apply(ctx, pool, "a", a[:1])
	if done := res.Applied; err != nil || len(done) != 1 {
		t.Fatalf("Apply v1 = %v, %v", done, err)
	}
	res, err = migrate.Apply(ctx, pool, "a", a)
	if done := res.Applied; err != nil || len(done) != 1 || done[0].Version != 2 {
		t.Fatalf("Apply v2 = %v, %v", done, err)
	}
	res, err = migrate.Apply(ctx, pool, "a", a)
	if err != nil || len(res.Applied) != 0 || res.Recreated != 0 {
		t.Fatalf("re-Apply = %+v, %v; want nothing applied", res, err)
	}
	if res, err := migrate.Apply(ctx, pool, "b", b); err != nil || len(res.Applied) != 2 {
		t.Fatalf("Apply b = %+v, %v", res, err)
	}
	if v, err := migrate.Version(ctx, pool, "a"); err != nil || v != 2 {
		t.Fatalf("Version after = %d, %v", v, err)
	}
	// An older binary that knows only version 1 leaves version 2 alone.
	if res, err := migrate.Apply(ctx, pool, "a", a[:1]); err != nil || len(res.Applied) != 0 {
		t.Fatalf("older Apply = %+v, %v", res, err)
	}
}

func TestApplyConcurrentMigratorsSerialize(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	migs, _ := migrate.Load(files(), map[string]string{"Table": "t"})
	var wg sync.WaitGroup
	applied := make(chan int, 10)
	errs := make(chan error, 10)
	for range 10 {
		wg.Go(func() {
			res, err := migrate.Apply(ctx, pool, "c", migs)
			if err != nil {
				errs <- err
			}
			applied <- len(res.Applied)
		})
	}
	wg.Wait()
	close(applied)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := 0
	for n := range applied {
		total += n
	}
	if total != 2 {
		t.Fatalf("%d migrations applied in total, want 2", total)
	}
}

func TestApplyFailureRollsBackEverything(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	migs := []migrate.Migration{
		{Version: 1, Name: "ok", SQL: "create table t1 (id int)"},
		{Version: 2, Name: "broken", SQL: "create table t1 (id int)"},
	}
	_, err := migrate.Apply(ctx, pool, "x", migs)
	var me *migrate.Error
	var pe *pgconn.PgError
	if !errors.As(err, &me) || me.Version != 2 || !errors.As(err, &pe) || pe.Code != "42P07" {
		t.Fatalf("err = %v, want *migrate.Error for version 2 wrapping duplicate_table", err)
	}
	var exists bool
	if err := pool.QueryRow(ctx, "select to_regclass('t1') is not null").Scan(&exists); err != nil || exists {
		t.Fatalf("t1 exists after a failed run: %v, %v", exists, err)
	}
	if v, err := migrate.Version(ctx, pool, "x"); err != nil || v != 0 {
		t.Fatalf("Version = %d, %v; want 0", v, err)
	}
	if _, err := migrate.Apply(ctx, pool, "x", []migrate.Migration{migs[1], migs[0]}); !errors.Is(err, migrate.ErrInvalidMigrations) {
		t.Fatalf("unordered: %v", err)
	}
}

// A component whose table was dropped (here with its schema, cascade) while
// its versions stay recorded is migrated from scratch when Apply is told its
// table: the table is usable again and Result.Recreated names the version
// that was recorded. Version reports 0 meanwhile. Without WithTable the
// recorded versions are trusted (the old behaviour: nothing applied).
func TestApplyRecreatesDroppedTable(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	table := pgx.Identifier{"s", "t"}
	migs := []migrate.Migration{
		{Version: 1, Name: "create", SQL: "create schema if not exists s; create table s.t (id int primary key)"},
		{Version: 2, Name: "add_note", SQL: "alter table s.t add column note text"},
	}
	if res, err := migrate.Apply(ctx, pool, "s", migs, migrate.WithTable(table)); err != nil || len(res.Applied) != 2 || res.Recreated != 0 {
		t.Fatalf("first Apply = %+v, %v", res, err)
	}
	if _, err := pool.Exec(ctx, "drop schema s cascade"); err != nil {
		t.Fatal(err)
	}
	if v, err := migrate.Version(ctx, pool, "s"); err != nil || v != 2 {
		t.Fatalf("Version without the table = %d, %v; want the recorded 2", v, err)
	}
	if v, err := migrate.Version(ctx, pool, "s", migrate.WithTable(table)); err != nil || v != 0 {
		t.Fatalf("Version of the dropped table = %d, %v; want 0", v, err)
	}
	if res, err := migrate.Apply(ctx, pool, "s", migs); err != nil || len(res.Applied) != 0 {
		t.Fatalf("Apply without WithTable = %+v, %v; want nothing applied", res, err)
	}
	// The re-creation is said on slog.Default (no test here runs in
	// parallel, so swapping it is safe).
	var logged bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	res, err := migrate.Apply(ctx, pool, "s", migs, migrate.WithTable(table))
	slog.SetDefault(prev)
	if err != nil || len(res.Applied) != 2 || res.Recreated != 2 {
		t.Fatalf("Apply after the drop = %+v, %v; want both versions applied again, Recreated 2", res, err)
	}
	if l := logged.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, `table="\"s\".\"t\""`) || !strings.Contains(l, "recorded_version=2") {
		t.Errorf("re-creating the table logged %q, want a warning naming the table and the recorded version", l)
	}
	if _, err := pool.Exec(ctx, "insert into s.t (id, note) values (1, 'x')"); err != nil {
		t.Fatalf("re-created table unusable: %v", err)
	}
	if v, err := migrate.Version(ctx, pool, "s", migrate.WithTable(table)); err != nil || v != 2 {
		t.Fatalf("Version after re-creation = %d, %v; want 2", v, err)
	}
	var rows int
	if err := pool.QueryRow(ctx, "select count(*) from exactly_schema_migrations where component = 's'").Scan(&rows); err != nil || rows != 2 {
		t.Fatalf("ledger rows for s = %d, %v; want 2 (no duplicates)", rows, err)
	}
	if res, err := migrate.Apply(ctx, pool, "s", migs, migrate.WithTable(table)); err != nil || len(res.Applied) != 0 || res.Recreated != 0 {
		t.Fatalf("Apply with the table present = %+v, %v; want a no-op", res, err)
	}
}

// When re-creating fails (the main table is gone but another object of the
// component is still there), everything rolls back, the recorded versions
// included, and the error says the table was being re-created.
func TestApplyRecreateFailureKeepsLedger(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	migs := []migrate.Migration{
		{Version: 1, Name: "create", SQL: "create table main (id int)"},
		{Version: 2, Name: "side", SQL: "create table side (id int)"},
	}
	if _, err := migrate.Apply(ctx, pool, "p", migs, migrate.WithTable(pgx.Identifier{"main"})); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "drop table main"); err != nil {
		t.Fatal(err)
	}
	_, err := migrate.Apply(ctx, pool, "p", migs, migrate.WithTable(pgx.Identifier{"main"}))
	var me *migrate.Error
	var pe *pgconn.PgError
	if !errors.As(err, &me) || me.Version != 2 || !errors.As(err, &pe) || pe.Code != "42P07" ||
		!strings.Contains(err.Error(), `re-creating missing table "main" (version 2 was recorded)`) {
		t.Fatalf("err = %v, want a *migrate.Error for version 2 saying the table was being re-created", err)
	}
	if v, err := migrate.Version(ctx, pool, "p"); err != nil || v != 2 {
		t.Fatalf("recorded version after the failed re-creation = %d, %v; want 2 (rolled back)", v, err)
	}
}
