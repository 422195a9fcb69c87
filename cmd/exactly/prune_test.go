package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/internal/testenv"
)

// `exactly prune` deletes the guard rows older than -retention and says how
// many; a retention shorter than the redelivery horizon is refused, naming
// the flag that overrides it, and deletes nothing; with that flag it runs.
func TestPruneCommand(t *testing.T) {
	t.Setenv("DATABASE_URL", testenv.DBURL(t))
	var out bytes.Buffer
	if err := runMigrate(t.Context(), nil, &out); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out.String())
	}
	p, err := poolFromDatabaseURL(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Three rows 30 days old, two 10 days old, one new.
	if _, err := p.Exec(t.Context(), `insert into exactly_guard (scope, key, processed_at)
		select 'credit', 'k' || i, now() - case when i <= 3 then interval '30 days' when i <= 5 then interval '10 days' else interval '0' end
		from generate_series(1, 6) as i`); err != nil {
		t.Fatal(err)
	}
	rows := func() int {
		var n int
		if err := p.QueryRow(t.Context(), `select count(*) from exactly_guard`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	out.Reset()
	if err := runPrune(t.Context(), nil, &out); err != nil {
		t.Fatalf("prune: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "deleted 3 rows older than 336h") || rows() != 3 {
		t.Fatalf("prune with the default retention: %q, %d rows left; want 3 deleted (older than 14 days), 3 left", out.String(), rows())
	}

	out.Reset()
	err = runPrune(t.Context(), []string{"-retention", "24h"}, &out)
	if err == nil || !strings.Contains(err.Error(), "-allow-short-retention") || rows() != 3 {
		t.Fatalf("prune -retention 24h: %v, %d rows left; want a refusal naming -allow-short-retention and nothing deleted", err, rows())
	}

	out.Reset()
	if err := runPrune(t.Context(), []string{"-retention", "24h", "-allow-short-retention"}, &out); err != nil {
		t.Fatalf("prune -retention 24h -allow-short-retention: %v", err)
	}
	if !strings.Contains(out.String(), "deleted 2 rows older than 24h") || rows() != 1 {
		t.Fatalf("prune -retention 24h -allow-short-retention: %q, %d rows left; want 2 deleted, 1 left", out.String(), rows())
	}
}
