package migrate_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/runtime/migrate"
)

// A component loads its embedded SQL templates with its configured table
// name, quoted, and applies them; a second run applies nothing.
func ExampleApply() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	name := "example_" + rand.Text()
	// In a component this is an embed.FS holding NNNN_name.sql files.
	files := fstest.MapFS{
		"0001_create.sql": {Data: []byte(`create table {{.Table}} (id bigint primary key)`)},
		"0002_add_at.sql": {Data: []byte(`alter table {{.Table}} add column at timestamptz not null default now()`)},
	}
	migs, err := migrate.Load(files, struct{ Table string }{pgx.Identifier{name}.Sanitize()})
	if err != nil {
		fmt.Println(err)
		return
	}
	component := "example:" + name
	for range 2 {
		res, err := migrate.Apply(ctx, pool, component, migs)
		fmt.Println(len(res.Applied), "applied", err)
	}
	v, err := migrate.Version(ctx, pool, component)
	fmt.Println("version", v, err)
	_, _ = pool.Exec(ctx, "drop table "+pgx.Identifier{name}.Sanitize())
	// Output:
	// 2 applied <nil>
	// 0 applied <nil>
	// version 2 <nil>
}
