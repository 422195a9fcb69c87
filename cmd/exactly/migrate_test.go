package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/internal/testenv"
)

// `exactly migrate` run again after the tables' schema was dropped with
// cascade creates them again (the migrations table still records their
// versions) and says so: schema version 0 to the latest.
func TestMigrateCommandRecreatesDroppedTables(t *testing.T) {
	t.Setenv("DATABASE_URL", testenv.DBURL(t))
	args := []string{"-guard-schema", "s", "-outbox-schema", "s"}
	var out bytes.Buffer
	if err := runMigrate(t.Context(), args, &out); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out.String())
	}
	p, err := poolFromDatabaseURL(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Exec(t.Context(), "drop schema s cascade"); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := runMigrate(t.Context(), args, &out); err != nil {
		t.Fatalf("migrate after the drop: %v\n%s", err, out.String())
	}
	for _, want := range []string{`guard table "s"."exactly_guard": migrated from schema version 0 to`, `outbox table "s"."exactly_outbox": migrated from schema version 0 to`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	var n int
	if err := p.QueryRow(t.Context(), "select count(*) from s.exactly_guard, s.exactly_outbox").Scan(&n); err != nil {
		t.Fatalf("re-created tables unusable: %v", err)
	}
}
