package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/dedupe"
)

// Claimed reports, aligned with its keys, which have a guard row in the
// scope (keys normalized as claims are; a key repeated is reported at each
// place), and costs one primary-key probe per key however large the table
// and however the planner sees it: with a thousand keys against twenty
// thousand rows of a never-analyzed table, the plan scans no table and no
// index range (a "key = any($2)" filter there estimated the array to keep
// every row and scanned the whole scope for each lookup, a cost that grew
// with the table and slowed a consumer's pre-transaction calls with it).
func TestClaimedProbesOneRowPerKey(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	if _, err := pool.Exec(ctx, `insert into exactly_guard (scope, key) select 'credit', 'credit:o-' || i from generate_series(1, 20000) i`); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", dedupe.MaxKeyLen+1)
	tx := begin(t, pool)
	if _, err := g.ClaimBatch(ctx, tx, "credit", []string{long}); err != nil {
		t.Fatal(err)
	}
	commit(t, tx)
	got, err := g.Claimed(ctx, pool, "credit", []string{"credit:o-7", "credit:o-0", long, "credit:o-7", "credit:o-20001"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, false, true, true, false}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Claimed = %v, want %v", got, want)
	}
	if got, err := g.Claimed(ctx, pool, "other", []string{"credit:o-7"}); err != nil || got[0] {
		t.Errorf("Claimed in another scope = %v, %v; want not found", got, err)
	}

	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("credit:o-%d", i*37)
	}
	rows, err := pool.Query(ctx, "explain "+dedupe.ClaimedSQL(g), "credit", keys)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line[:min(len(line), 160)])
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if strings.Contains(text, "Seq Scan on exactly_guard") || strings.Contains(text, "Bitmap Heap Scan") ||
		strings.Contains(text, "Hash") || !strings.Contains(text, "exactly_guard_pkey") {
		t.Errorf("Claimed's plan with 1000 keys is not one index probe per key:\n%s", text)
	}
}

// LookupKeys gives, aligned with its keys, the processed_at of each key's
// guard row as Lookup reads it, and the zero time for a key without one; a
// key repeated is reported at each place, and an empty key is refused.
func TestLookupKeysReadsWhenEachKeyWasProcessed(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	if _, err := pool.Exec(ctx, `insert into exactly_guard (scope, key, processed_at) values
('s', 'a', '2026-01-02T03:04:05.123456Z'), ('s', 'b', '2026-06-07T08:09:10Z'), ('other', 'c', now())`); err != nil {
		t.Fatal(err)
	}
	keys := []string{"b", "missing", "a", "c", "b"}
	got, err := g.LookupKeys(ctx, pool, "s", keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(keys) {
		t.Fatalf("LookupKeys returned %d times for %d keys", len(got), len(keys))
	}
	for i, k := range keys {
		want, found, err := g.Lookup(ctx, pool, "s", k)
		if err != nil {
			t.Fatal(err)
		}
		if found != !got[i].IsZero() || !got[i].Equal(want) {
			t.Errorf("key %q (place %d): LookupKeys %v, Lookup %v (found %v)", k, i, got[i], want, found)
		}
	}
	if !got[1].IsZero() || !got[3].IsZero() {
		t.Errorf("a missing key and another scope's key: %v and %v, want zero times", got[1], got[3])
	}
	if _, err := g.LookupKeys(ctx, pool, "s", []string{"a", ""}); !errors.Is(err, dedupe.ErrEmptyKey) {
		t.Errorf("an empty key: %v, want ErrEmptyKey", err)
	}
}
