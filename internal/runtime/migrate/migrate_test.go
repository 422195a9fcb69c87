package migrate_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/internal/runtime/migrate"
	"github.com/exactly-go/exactly/internal/tools/testenv"
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
	done, err := migrate.Apply(ctx, pool, "a", a[:1])
	if err != nil || len(done) != 1 {
		t.Fatalf("Apply v1 = %v, %v", done, err)
	}
	done, err = migrate.Apply(ctx, pool, "a", a)
	if err != nil || len(done) != 1 || done[0].Version != 2 {
		t.Fatalf("Apply v2 = %v, %v", done, err)
	}
	done, err = migrate.Apply(ctx, pool, "a", a)
	if err != nil || len(done) != 0 {
		t.Fatalf("re-Apply = %v, %v; want nothing applied", done, err)
	}
	if done, err := migrate.Apply(ctx, pool, "b", b); err != nil || len(done) != 2 {
		t.Fatalf("Apply b = %v, %v", done, err)
	}
	if v, err := migrate.Version(ctx, pool, "a"); err != nil || v != 2 {
		t.Fatalf("Version after = %d, %v", v, err)
	}
	// An older binary that knows only version 1 leaves version 2 alone.
	if done, err := migrate.Apply(ctx, pool, "a", a[:1]); err != nil || len(done) != 0 {
		t.Fatalf("older Apply = %v, %v", done, err)
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
			done, err := migrate.Apply(ctx, pool, "c", migs)
			if err != nil {
				errs <- err
			}
			applied <- len(done)
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
