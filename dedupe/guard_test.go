package dedupe_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
)

func migrated(t *testing.T, opts ...dedupe.Option) (*dedupe.Guard, *pgxpool.Pool) {
	t.Helper()
	pool := testDB(t)
	g := dedupe.New(opts...)
	if err := g.Migrate(context.Background(), pool); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := pool.Exec(context.Background(), `create table ledger (key text not null, amount int not null)`); err != nil {
		t.Fatal(err)
	}
	return g, pool
}

func begin(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func count(t *testing.T, q dedupe.Querier, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := q.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestOutcomeString(t *testing.T) {
	if dedupe.Applied.String() != "applied" || dedupe.Duplicate.String() != "duplicate" {
		t.Fatalf("got %q %q", dedupe.Applied, dedupe.Duplicate)
	}
}

func TestMigrateTwiceIsNoOp(t *testing.T) {
	ctx := context.Background()
	pool := testDB(t)
	g := dedupe.New()
	cur, latest, err := g.SchemaVersion(ctx, pool)
	if err != nil || cur != 0 || latest < 1 {
		t.Fatalf("SchemaVersion before = %d, %d, %v", cur, latest, err)
	}
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := g.Migrate(ctx, pool); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if n := count(t, pool, `select count(*) from exactly_schema_migrations`); n != latest {
		t.Fatalf("%d migration rows, want %d", n, latest)
	}
	if n := count(t, pool, `select count(*) from pg_indexes where tablename = 'exactly_guard'`); n != 2 {
		t.Fatalf("%d indexes on the guard table, want 2 (pkey, processed_at)", n)
	}
	cur, _, err = g.SchemaVersion(ctx, pool)
	if err != nil || cur != latest {
		t.Fatalf("SchemaVersion after = %d, %v; want %d", cur, err, latest)
	}
}

func TestMigrateConcurrently(t *testing.T) {
	ctx := context.Background()
	pool := testDB(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			// Two tables, migrated independently, at the same time.
			errs <- dedupe.New(dedupe.WithTable("", []string{"g_a", "g_b"}[i%2])).Migrate(ctx, pool)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Two components, each at its latest version (one row per version).
	if n := count(t, pool, `select count(distinct component) from exactly_schema_migrations`); n != 2 {
		t.Fatalf("%d migrated components, want 2", n)
	}
	if n := count(t, pool, `select count(*) from exactly_schema_migrations where version = 2`); n != 2 {
		t.Fatalf("%d components at version 2, want 2", n)
	}
}

func TestWeirdTableName(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t, dedupe.WithTable("s", `weird-Name"; drop table ledger; --`))
	if got := g.Table(); len(got) != 2 || got[0] != "s" {
		t.Fatalf("Table() = %v", got)
	}
	other := dedupe.New(dedupe.WithTable("s", "weird-Name"))
	if err := other.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for _, gg := range []*dedupe.Guard{g, other} {
		tx := begin(t, pool)
		if o, err := gg.Claim(ctx, tx, "sc", "k"); err != nil || o != dedupe.Applied {
			t.Fatalf("Claim on %v = %v, %v", gg.Table(), o, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, pool, `select count(*) from s."weird-Name"`); n != 1 {
		t.Fatalf("%d rows in s.\"weird-Name\"", n)
	}
	if n := count(t, pool, `select count(*) from ledger`); n != 0 {
		t.Fatal("ledger should still exist and be empty")
	}
}

// N deliveries of one key at once: exactly one applies its effect.
func TestConcurrentClaimsOneEffect(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	const n = 16
	outcomes := make(chan dedupe.Outcome, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				o, err := g.Claim(ctx, tx, "billing", dedupe.Key("credit", "order-8812"))
				if err != nil {
					return err
				}
				if o == dedupe.Applied {
					if _, err := tx.Exec(ctx, `insert into ledger values ($1, 100)`, "order-8812"); err != nil {
						return err
					}
				}
				outcomes <- o
				return nil
			})
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(outcomes)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := map[dedupe.Outcome]int{}
	for o := range outcomes {
		got[o]++
	}
	if got[dedupe.Applied] != 1 || got[dedupe.Duplicate] != n-1 {
		t.Fatalf("outcomes %v, want 1 applied and %d duplicate", got, n-1)
	}
	if c := count(t, pool, `select count(*) from ledger`); c != 1 {
		t.Fatalf("%d ledger rows, want 1", c)
	}
}

// waitBlocked waits until a backend is waiting on a lock held by holder's
// transaction. It polls pg_locks, not the clock.
func waitBlocked(t *testing.T, pool *pgxpool.Pool, holder pgx.Tx) {
	t.Helper()
	var pid uint32
	if err := holder.QueryRow(context.Background(), `select pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	for {
		if count(t, pool, `select count(*) from pg_stat_activity where $1 = any(pg_blocking_pids(pid))`, pid) > 0 {
			return
		}
		if t.Context().Err() != nil {
			t.Fatal("test ended before a claim blocked")
		}
	}
}

func TestSecondClaimWaitsForFirst(t *testing.T) {
	for _, commit := range []bool{false, true} {
		t.Run(map[bool]string{false: "rollback", true: "commit"}[commit], func(t *testing.T) {
			ctx := context.Background()
			g, pool := migrated(t)
			first := begin(t, pool)
			if o, err := g.Claim(ctx, first, "s", "k"); err != nil || o != dedupe.Applied {
				t.Fatalf("first Claim = %v, %v", o, err)
			}
			second := begin(t, pool)
			type result struct {
				o   dedupe.Outcome
				err error
			}
			done := make(chan result, 1)
			go func() {
				o, err := g.Claim(ctx, second, "s", "k")
				done <- result{o, err}
			}()
			waitBlocked(t, pool, first)
			select {
			case r := <-done:
				t.Fatalf("second Claim returned %v, %v while the first was open", r.o, r.err)
			default:
			}
			want := dedupe.Applied
			if commit {
				want = dedupe.Duplicate
				if err := first.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			} else if err := first.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil || r.o != want {
				t.Fatalf("second Claim = %v, %v; want %v", r.o, r.err, want)
			}
		})
	}
}

func TestClaimBatch(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	tx := begin(t, pool)
	if o, err := g.Claim(ctx, tx, "s", "b"); err != nil || o != dedupe.Applied {
		t.Fatal(o, err)
	}
	long := strings.Repeat("x", 5000)
	keys := []string{"c", "a", "b", "a", long, "d\x00", "c", long}
	got, err := g.ClaimBatch(ctx, tx, "s", keys)
	if err != nil {
		t.Fatal(err)
	}
	A, D := dedupe.Applied, dedupe.Duplicate
	want := []dedupe.Outcome{A, A, D, D, A, A, D, D}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("ClaimBatch(%q) = %v, want %v", keys, got, want)
		}
	}
	if keys[5] != "d\x00" {
		t.Fatal("ClaimBatch modified the caller's slice")
	}
	// Same scope, other keys: a second batch in the same tx sees the first.
	got, err = g.ClaimBatch(ctx, tx, "s", []string{"e", "a"})
	if err != nil || got[0] != A || got[1] != D {
		t.Fatalf("second batch = %v, %v", got, err)
	}
	// Another scope is independent.
	got, err = g.ClaimBatch(ctx, tx, "other", []string{"a"})
	if err != nil || got[0] != A {
		t.Fatalf("other scope = %v, %v", got, err)
	}
	if got, err := g.ClaimBatch(ctx, tx, "s", nil); err != nil || got != nil {
		t.Fatalf("empty batch = %v, %v", got, err)
	}
	if _, err := g.ClaimBatch(ctx, tx, "s", []string{"z", ""}); !errors.Is(err, dedupe.ErrEmptyKey) {
		t.Fatalf("empty key in batch: err = %v", err)
	}
}

// Two transactions claim overlapping keys in opposite orders: with sorted
// insertion one waits for the other instead of deadlocking.
func TestClaimBatchNoDeadlock(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	keys := make([]string, 200)
	for i := range keys {
		keys[i] = dedupe.Key("k", i)
	}
	rev := make([]string, len(keys))
	for i, k := range keys {
		rev[len(keys)-1-i] = k
	}
	for round := range 5 {
		scope := dedupe.Key("round", round)
		txA, txB := begin(t, pool), begin(t, pool)
		// A holds the first half (in forward order); B, in reverse order,
		// must block on A's keys, not deadlock with A's second batch.
		if _, err := g.ClaimBatch(ctx, txA, scope, keys[:100]); err != nil {
			t.Fatal(err)
		}
		bDone := make(chan error, 1)
		var bOut []dedupe.Outcome
		go func() {
			var err error
			bOut, err = g.ClaimBatch(ctx, txB, scope, rev)
			if err == nil {
				err = txB.Commit(ctx)
			}
			bDone <- err
		}()
		waitBlocked(t, pool, txA)
		aOut, err := g.ClaimBatch(ctx, txA, scope, rev[:150])
		if err != nil {
			t.Fatalf("round %d: A's second batch: %v", round, err)
		}
		if err := txA.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-bDone; err != nil {
			t.Fatalf("round %d: B: %v", round, err)
		}
		applied := 0
		for _, o := range append(aOut, bOut...) {
			if o == dedupe.Applied {
				applied++
			}
		}
		// A applied keys[0:100] in its first batch, then its second batch
		// (keys 50..199) applied the ones B had not taken; overall every key
		// is applied exactly once.
		if applied != len(keys)-100 {
			t.Fatalf("round %d: %d applied in A's second batch and B, want %d", round, applied, len(keys)-100)
		}
		if n := count(t, pool, `select count(*) from exactly_guard where scope = $1`, scope); n != len(keys) {
			t.Fatalf("round %d: %d guard rows", round, n)
		}
	}
}

func TestReleaseAndLookup(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	bad := "order\x00\xff" + strings.Repeat("z", 300)
	tx := begin(t, pool)
	if _, err := g.ClaimBatch(ctx, tx, "s", []string{"a", "b", bad}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	at, found, err := g.Lookup(ctx, pool, "s", bad)
	if err != nil || !found || time.Since(at) > time.Hour || time.Until(at) > time.Hour {
		t.Fatalf("Lookup = %v, %v, %v", at, found, err)
	}
	if _, found, err := g.Lookup(ctx, pool, "other", "a"); err != nil || found {
		t.Fatalf("Lookup in other scope = %v, %v", found, err)
	}

	// A duplicate claim reports the earlier processing time.
	tx = begin(t, pool)
	if o, err := g.Claim(ctx, tx, "s", bad); err != nil || o != dedupe.Duplicate {
		t.Fatalf("Claim of bad key again = %v, %v", o, err)
	}
	if at2, _, _ := g.Lookup(ctx, tx, "s", bad); !at2.Equal(at) {
		t.Fatalf("Lookup in tx = %v, want %v", at2, at)
	}
	if err := g.Release(ctx, tx, "s", "a", bad, "never-claimed"); err != nil {
		t.Fatal(err)
	}
	if err := g.Release(ctx, tx, "s"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tx = begin(t, pool)
	got, err := g.ClaimBatch(ctx, tx, "s", []string{"a", "b", bad})
	if err != nil || got[0] != dedupe.Applied || got[1] != dedupe.Duplicate || got[2] != dedupe.Applied {
		t.Fatalf("after Release: %v, %v", got, err)
	}
}

func TestReleaseRolledBackWithSavepoint(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	tx := begin(t, pool)
	if _, err := g.ClaimBatch(ctx, tx, "s", []string{"ok", "poison"}); err != nil {
		t.Fatal(err)
	}
	// The poison record's effect fails and is dead-lettered: release its key.
	if err := g.Release(ctx, tx, "s", "poison"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `select count(*) from exactly_guard where key = 'poison'`); n != 0 {
		t.Fatal("poison key still claimed")
	}
}

func TestInvalidInput(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	tx := begin(t, pool)
	if _, err := g.Claim(ctx, tx, "s", ""); !errors.Is(err, dedupe.ErrEmptyKey) {
		t.Fatalf("Claim empty key: %v", err)
	}
	if _, _, err := g.Lookup(ctx, tx, "s", ""); !errors.Is(err, dedupe.ErrEmptyKey) {
		t.Fatalf("Lookup empty key: %v", err)
	}
	if err := g.Release(ctx, tx, "s", ""); !errors.Is(err, dedupe.ErrEmptyKey) {
		t.Fatalf("Release empty key: %v", err)
	}
	if _, err := g.Claim(ctx, tx, "s\x00", "k"); !errors.Is(err, dedupe.ErrInvalidScope) {
		t.Fatalf("Claim NUL scope: %v", err)
	}
	// The transaction is still usable: nothing was sent.
	if o, err := g.Claim(ctx, tx, "s", "k"); err != nil || o != dedupe.Applied {
		t.Fatalf("Claim after refused input = %v, %v", o, err)
	}
}

func BenchmarkClaimBatch(b *testing.B) {
	ctx := context.Background()
	pool := testDB(b)
	g := dedupe.New()
	if err := g.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 100)
	for j := range keys {
		keys[j] = dedupe.Key("k", j)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		tx, err := pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		// A new scope per iteration, so every key applies.
		if _, err := g.ClaimBatch(ctx, tx, strconv.Itoa(i), keys); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// A guard table whose schema was dropped with cascade (a fixture reset, an
// operator restoring part of a database) while exactly_schema_migrations
// still records its versions is created again by Migrate, and usable: keys
// claim, outcomes count. SchemaVersion reports 0 while it is missing.
func TestMigrateRecreatesDroppedTable(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t, dedupe.WithTable("s", "exactly_guard"))
	claim := func() dedupe.Outcome {
		t.Helper()
		tx := begin(t, pool)
		out, err := g.Claim(ctx, tx, "sc", "k")
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if out := claim(); out != dedupe.Applied {
		t.Fatalf("first claim = %v", out)
	}
	if _, err := pool.Exec(ctx, `drop schema s cascade`); err != nil {
		t.Fatal(err)
	}
	cur, latest, err := g.SchemaVersion(ctx, pool)
	if err != nil || cur != 0 {
		t.Fatalf("SchemaVersion of the dropped table = %d, %v; want 0", cur, err)
	}
	if err := g.Migrate(ctx, pool); err != nil {
		t.Fatalf("Migrate after the drop: %v", err)
	}
	if cur, _, err := g.SchemaVersion(ctx, pool); err != nil || cur != latest {
		t.Fatalf("SchemaVersion after Migrate = %d, %v; want %d", cur, err, latest)
	}
	if out := claim(); out != dedupe.Applied {
		t.Fatalf("claim in the re-created table = %v, want applied (the old rows went with the table)", out)
	}
	if out := claim(); out != dedupe.Duplicate {
		t.Fatalf("second claim = %v, want duplicate", out)
	}
	tx := begin(t, pool)
	if err := g.Count(ctx, tx, "sc", "topic", 0, dedupe.Counts{Applied: 1}); err != nil {
		t.Fatalf("Count in the re-created outcomes table: %v", err)
	}
	if n := count(t, pool, `select count(*) from exactly_schema_migrations where component = 'dedupe:"s"."exactly_guard"'`); n != latest {
		t.Fatalf("%d versions recorded, want %d (each once)", n, latest)
	}
}
