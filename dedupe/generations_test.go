package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testenv"
)

// rotator returns a Pruner that seals the current generation at every
// PruneOnce (a span of 1 µs) and keeps sealed generations for retention.
func rotator(t *testing.T, g *dedupe.Guard, pool *pgxpool.Pool, retention time.Duration) *dedupe.Pruner {
	t.Helper()
	p, err := g.NewPruner(pool, dedupe.PrunerConfig{Retention: retention, AllowShortRetention: true, GenerationSpan: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// pruneOnce runs p once and fails the test unless it ran.
func pruneOnce(t *testing.T, p *dedupe.Pruner) int64 {
	t.Helper()
	n, ran, err := p.PruneOnce(context.Background())
	if err != nil || !ran {
		t.Fatalf("PruneOnce: ran=%v err=%v", ran, err)
	}
	return n
}

// claimIn claims keys through each claim path in one transaction each and
// returns the outcomes by path.
func claimIn(t *testing.T, g *dedupe.Guard, pool *pgxpool.Pool, scope string, key string, coords int64) map[string]dedupe.Outcome {
	t.Helper()
	ctx := context.Background()
	out := map[string]dedupe.Outcome{}
	run := func(path string, fn func(tx pgx.Tx) (dedupe.Outcome, error)) {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			o, err := fn(tx)
			out[path] = o
			return errors.Join(err, errRollback) // never commit: each path sees the same state
		}); !errors.Is(err, errRollback) {
			t.Fatalf("%s: %v", path, err)
		}
	}
	run("Claim", func(tx pgx.Tx) (dedupe.Outcome, error) { return g.Claim(ctx, tx, scope, key) })
	run("ClaimBatch", func(tx pgx.Tx) (dedupe.Outcome, error) {
		o, err := g.ClaimBatch(ctx, tx, scope, []string{key, "other-" + key})
		if err != nil {
			return "", err
		}
		return o[0], nil
	})
	rc := dedupe.RecordClaim{Scope: scope, Key: key, Topic: "t", Partition: 0, Offset: coords, Handler: "h"}
	run("ClaimRecords/1", func(tx pgx.Tx) (dedupe.Outcome, error) {
		o, err := g.ClaimRecords(ctx, tx, []dedupe.RecordClaim{rc})
		if err != nil {
			return "", err
		}
		return o[0], nil
	})
	run("ClaimRecords/2", func(tx pgx.Tx) (dedupe.Outcome, error) {
		other := rc
		other.Key, other.Offset = "other-"+key, coords+1000
		o, err := g.ClaimRecords(ctx, tx, []dedupe.RecordClaim{other, rc})
		if err != nil {
			return "", err
		}
		return o[1], nil
	})
	run("QueueClaimNew", func(tx pgx.Tx) (dedupe.Outcome, error) {
		b := &pgx.Batch{}
		var inserted bool
		if err := g.QueueClaimNew(b, rc, &inserted); err != nil {
			return "", err
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return "", err
		}
		if inserted {
			return dedupe.Applied, nil
		}
		o, err := g.ClaimRecords(ctx, tx, []dedupe.RecordClaim{rc})
		if err != nil {
			return "", err
		}
		return o[0], nil
	})
	return out
}

var errRollback = errors.New("roll back")

// wantAll fails unless every path's outcome is want.
func wantAll(t *testing.T, what string, got map[string]dedupe.Outcome, want dedupe.Outcome) {
	t.Helper()
	for path, o := range got {
		if o != want {
			t.Errorf("%s: %s = %s, want %s", what, path, o, want)
		}
	}
}

// A key claimed in one generation is a duplicate in the next ones, through
// every claim path, until its generation is dropped; a new key applies.
// Run with each pgx exec mode.
func TestGenerationBoundaryKeepsOneEffectPerKey(t *testing.T) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			cfg, err := pgxpool.ParseConfig(testenv.DBURL(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			g := dedupe.New()
			if err := g.Migrate(ctx, pool); err != nil {
				t.Fatal(err)
			}
			p := rotator(t, g, pool, time.Hour)
			commit := func(key string, offset int64) {
				t.Helper()
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					o, err := g.ClaimRecords(ctx, tx, []dedupe.RecordClaim{{Scope: "s", Key: key, Topic: "t", Offset: offset, Handler: "h"}})
					if err == nil && o[0] != dedupe.Applied {
						err = fmt.Errorf("claim %s = %s", key, o[0])
					}
					return err
				}); err != nil {
					t.Fatal(err)
				}
			}
			commit("k1", 1)
			pruneOnce(t, p) // k1's generation is sealed
			commit("k2", 2)
			pruneOnce(t, p) // two sealed generations
			for _, k := range []string{"k1", "k2"} {
				wantAll(t, k+" after the boundary", claimIn(t, g, pool, "s", k, 50), dedupe.Duplicate)
			}
			wantAll(t, "k1 in another scope", claimIn(t, g, pool, "s2", "k1", 50), dedupe.Applied)
			wantAll(t, "a new key", claimIn(t, g, pool, "s", "k3", 50), dedupe.Applied)
			found, err := g.Claimed(ctx, pool, "s", []string{"k1", "k2", "k3"})
			if err != nil || !found[0] || !found[1] || found[2] {
				t.Errorf("Claimed = %v, %v; want [true true false]", found, err)
			}
			if _, ok, err := g.Lookup(ctx, pool, "s", "k1"); err != nil || !ok {
				t.Errorf("Lookup k1 = %v, %v", ok, err)
			}
			gens, err := g.Generations(ctx, pool)
			if err != nil || len(gens) != 3 || !gens[2].Until.IsZero() || gens[0].Until.IsZero() || !gens[0].Counted {
				t.Fatalf("Generations = %+v, %v; want two sealed (counted) and the current", gens, err)
			}
			if gens[0].Rows != 1 || gens[1].Rows != 1 {
				t.Errorf("sealed generations hold %d and %d rows, want 1 each", gens[0].Rows, gens[1].Rows)
			}
		})
	}
}

// A key dead-lettered in a sealed generation is taken over once by a
// record at other coordinates (in the current generation), stays a
// duplicate for the dead-lettered record itself, and a key applied in a
// sealed generation is never reopened by a mark in the current one.
func TestGenerationBoundaryDeadLetterTakeover(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	p := rotator(t, g, pool, time.Hour)
	dead := dedupe.RecordClaim{Scope: "s", Key: "k", Topic: "t", Partition: 0, Offset: 7, Handler: "h"}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return g.MarkDeadLettered(ctx, tx, dead) }); err != nil {
		t.Fatal(err)
	}
	pruneOnce(t, p)
	wantAll(t, "the dead-lettered record again", map[string]dedupe.Outcome{"ClaimRecords": claimOne(t, g, pool, dead, false)}, dedupe.Duplicate)
	copyAt := dead
	copyAt.Offset = 9
	if o := claimOne(t, g, pool, copyAt, true); o != dedupe.Applied {
		t.Fatalf("a copy at other coordinates = %s, want applied (takeover)", o)
	}
	pruneOnce(t, p)
	again := dead
	again.Offset = 11
	if o := claimOne(t, g, pool, again, false); o != dedupe.Duplicate {
		t.Fatalf("a third copy after the takeover = %s, want duplicate", o)
	}
	// A handler's mark on a key another handler applied in a sealed
	// generation does not let a later record take the key over.
	other := dedupe.RecordClaim{Scope: "s", Key: "k", Topic: "t", Partition: 0, Offset: 20, Handler: "other"}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return g.MarkDeadLettered(ctx, tx, other) }); err != nil {
		t.Fatal(err)
	}
	late := dead
	late.Offset = 30
	if o := claimOne(t, g, pool, late, false); o != dedupe.Duplicate {
		t.Fatalf("a record after another handler's mark = %s, want duplicate", o)
	}
}

// claimOne claims c in its own transaction, committed when commit.
func claimOne(t *testing.T, g *dedupe.Guard, pool *pgxpool.Pool, c dedupe.RecordClaim, commit bool) dedupe.Outcome {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	o, err := g.ClaimRecords(ctx, tx, []dedupe.RecordClaim{c})
	if err != nil {
		t.Fatal(err)
	}
	if commit {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return o[0]
}

// waitForLockWait returns once a backend named app waits for a lock.
func waitForLockWait(t *testing.T, pool *pgxpool.Pool, app string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(context.Background(), `select count(*) from pg_stat_activity where application_name = $1 and wait_event_type = 'Lock'`, app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no backend %q waits for a lock", app)
		}
		time.Sleep(5 * time.Millisecond) // polls the server for the awaited state
	}
}

// A rotation waits for the transaction that claimed a key in the
// generation it seals, and a claim of the same key that arrives meanwhile
// waits behind the rotation and then finds the key in the sealed
// generation: duplicate when the first committed, applied when it rolled
// back. This is the race at a boundary: two claimers of one key on either
// side of a rotation.
func TestRotationWaitsForBatchesInFlight(t *testing.T) {
	for _, commitFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("first_commits=%v", commitFirst), func(t *testing.T) {
			ctx := context.Background()
			g, pool := migrated(t)
			p := rotator(t, g, pool, time.Hour)
			dedupe.SetLockTimeout(p, "60s")
			first, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = first.Rollback(ctx) }()
			if o, err := g.Claim(ctx, first, "s", "k"); err != nil || o != dedupe.Applied {
				t.Fatalf("first claim = %s, %v", o, err)
			}
			rotated := make(chan error, 1)
			go func() { _, _, err := p.PruneOnce(ctx); rotated <- err }()
			waitForLockWait(t, pool, "exactly pruner "+dedupe.DefaultTable)

			second := make(chan dedupe.Outcome, 1)
			secondErr := make(chan error, 1)
			go func() {
				var o dedupe.Outcome
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `select set_config('application_name', 'second claimer', true)`); err != nil {
						return err
					}
					var err error
					o, err = g.Claim(ctx, tx, "s", "k")
					return err
				})
				second <- o
				secondErr <- err
			}()
			waitForLockWait(t, pool, "second claimer")
			if commitFirst {
				err = first.Commit(ctx)
			} else {
				err = first.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := <-rotated; err != nil {
				t.Fatalf("PruneOnce: %v", err)
			}
			o := <-second
			if err := <-secondErr; err != nil {
				t.Fatalf("second claim: %v", err)
			}
			want := dedupe.Applied
			if commitFirst {
				want = dedupe.Duplicate
			}
			if o != want {
				t.Fatalf("second claim across the rotation = %s, want %s", o, want)
			}
			gens, err := g.Generations(ctx, pool)
			if err != nil || len(gens) != 2 {
				t.Fatalf("Generations = %+v, %v; want the sealed and the current", gens, err)
			}
		})
	}
}

// Concurrent claimers of the same keys, in batches, while the pruner
// rotates generations again and again: every key is applied exactly once.
func TestConcurrentDuplicatesAcrossRotations(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	p := rotator(t, g, pool, time.Hour)
	dedupe.SetLockTimeout(p, "60s")
	const workers, keys = 4, 200
	var mu sync.Mutex
	applied := map[string]int{}
	stop := make(chan struct{})
	rotations := make(chan int, 1)
	go func() {
		n := 0
		defer func() { rotations <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, ran, err := p.PruneOnce(ctx); err != nil {
				t.Error(err)
				return
			} else if ran {
				n++
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; i < keys; i += 5 {
				batch := make([]dedupe.RecordClaim, 0, 5)
				for j := i; j < i+5; j++ {
					batch = append(batch, dedupe.RecordClaim{Scope: "s", Key: fmt.Sprintf("k%d", (j+w*37)%keys), Topic: "t", Offset: int64(w*1000 + j), Handler: "h"})
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					out, err := g.ClaimRecords(ctx, tx, batch)
					if err != nil {
						return err
					}
					mu.Lock()
					defer mu.Unlock()
					for k, o := range out {
						if o == dedupe.Applied {
							applied[batch[k].Key]++
						}
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	n := <-rotations
	if n < 2 {
		t.Logf("only %d rotations ran beside the claimers", n)
	}
	for i := range keys {
		if k := fmt.Sprintf("k%d", i); applied[k] != 1 {
			t.Errorf("key %s applied %d times", k, applied[k])
		}
	}
	// The outcome counters count each key once, across every generation.
	c, err := g.Outcomes(ctx, pool, "s")
	if err != nil || c.Applied != keys {
		t.Errorf("Outcomes applied = %d, %v; want %d", c.Applied, err, keys)
	}
}

// Expired generations are dropped whole, their applied counts kept in the
// outcome counters, and OldestAge follows the oldest live generation.
func TestPrunerDropsExpiredGenerations(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	p := rotator(t, g, pool, time.Hour)
	for i := range 3 {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var claims []dedupe.RecordClaim
			for j := range 10 {
				claims = append(claims, dedupe.RecordClaim{Scope: "s", Key: fmt.Sprintf("g%d-%d", i, j), Topic: "t", Offset: int64(i*10 + j), Handler: "h"})
			}
			_, err := g.ClaimRecords(ctx, tx, claims)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		pruneOnce(t, p)
	}
	before, err := g.Outcomes(ctx, pool, "s")
	if err != nil || before.Applied != 30 {
		t.Fatalf("Outcomes = %+v, %v; want 30 applied", before, err)
	}
	// Age the two oldest sealed generations past the retention.
	if _, err := pool.Exec(ctx, `update `+g.GenerationsTable().Sanitize()+` set until = until - interval '2 hours'
		where name in (select name from `+g.GenerationsTable().Sanitize()+` where until is not null order by since limit 2)`); err != nil {
		t.Fatal(err)
	}
	if n := pruneOnce(t, p); n != 20 {
		t.Fatalf("PruneOnce dropped %d rows, want 20 (two generations of 10)", n)
	}
	gens, err := g.Generations(ctx, pool)
	if err != nil || len(gens) != 3 { // the last sealed, one sealed by this prune, the current
		t.Fatalf("Generations = %+v, %v", gens, err)
	}
	var tables int
	if err := pool.QueryRow(ctx, `select count(*) from pg_tables where tablename ~ '^exactly_guard_g[0-9]'`).Scan(&tables); err != nil || tables != 2 {
		t.Fatalf("%d generation tables remain (%v), want 2", tables, err)
	}
	after, err := g.Outcomes(ctx, pool, "s")
	if err != nil || after != before {
		t.Fatalf("Outcomes after dropping = %+v, %v; want %+v", after, err, before)
	}
	// Dropped keys are gone (retention passed); live ones stay duplicates.
	if o := claimOne(t, g, pool, dedupe.RecordClaim{Scope: "s", Key: "g2-0", Topic: "t", Offset: 99, Handler: "h"}, false); o != dedupe.Duplicate {
		t.Errorf("a key of a live generation = %s, want duplicate", o)
	}
	if age, err := g.OldestAge(ctx, pool); err != nil || age <= 0 || age > time.Hour {
		t.Errorf("OldestAge = %v, %v", age, err)
	}
}

// The online upgrade: a guard table filled before generations existed is
// migrated while claimers of the previous version run (their statement:
// an insert into the guard table alone), keeps serving as the current
// generation while this version's claimers take over, is sealed as a
// legacy generation by the first rotation and still decides its keys; no
// key is applied twice across the upgrade.
func TestOnlineUpgradeToGenerations(t *testing.T) {
	ctx := context.Background()
	pool := testDB(t)
	g := dedupe.New()
	if err := dedupe.MigrateTo(ctx, g, pool, 8); err != nil {
		t.Fatal(err)
	}
	const filled = 20000
	if _, err := pool.Exec(ctx, `insert into exactly_guard (scope, key, topic, kafka_partition, kafka_offset, handler, self_counted, processed_at)
		select 's', 'k' || i, 't', 0, i, 'h', true, now() - interval '1 hour' from generate_series(1, $1) as i`, filled); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	applied := map[string]int{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	claims := 0
	var upgraded atomic.Bool // the claimers run this version
	for w := range 3 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Keys from the filled table and new ones, each claimed by
				// every worker.
				key := fmt.Sprintf("k%d", (i*7)%(filled+600)+1)
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var o dedupe.Outcome
					if upgraded.Load() {
						out, err := g.ClaimRecords(ctx, tx, []dedupe.RecordClaim{{Scope: "s", Key: key, Topic: "t", Offset: int64(w*1_000_000 + i), Handler: "h"}})
						if err != nil {
							return err
						}
						o = out[0]
					} else {
						tag, err := tx.Exec(ctx, `insert into exactly_guard (scope, key, topic, kafka_partition, kafka_offset, handler, self_counted)
							values ('s', $1, 't', 0, $2, 'h', true) on conflict do nothing`, key, int64(w*1_000_000+i))
						if err != nil {
							return err
						}
						o = dedupe.Duplicate
						if tag.RowsAffected() == 1 {
							o = dedupe.Applied
						}
					}
					mu.Lock()
					defer mu.Unlock()
					claims++
					if o == dedupe.Applied {
						applied[key]++
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	waitClaims := func(n int) {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			c := claims
			mu.Unlock()
			if c >= n || time.Now().After(deadline) {
				return
			}
		}
	}
	waitClaims(200)
	if err := g.Migrate(ctx, pool); err != nil {
		t.Fatalf("Migrate while claiming: %v", err)
	}
	waitClaims(600)
	upgraded.Store(true) // the rolling deploy ends before the first rotation
	waitClaims(1000)
	p := rotator(t, g, pool, 24*time.Hour)
	dedupe.SetLockTimeout(p, "60s")
	pruneOnce(t, p) // seals the filled table
	pruneOnce(t, p)
	waitClaims(3000)
	close(stop)
	wg.Wait()
	for k, n := range applied {
		if n != 1 {
			t.Errorf("key %s applied %d times", k, n)
		}
		var i int
		if _, err := fmt.Sscanf(k, "k%d", &i); err != nil || i <= filled {
			t.Errorf("key %s of the filled table applied again", k)
		}
	}
	gens, err := g.Generations(ctx, pool)
	if err != nil || len(gens) != 3 || !gens[0].Legacy || gens[0].Rows < filled {
		t.Fatalf("Generations = %+v, %v; want the legacy table sealed first", gens, err)
	}
}

// The application role of docs/database-roles.md (no ownership, no DDL):
// its claims keep working across a rotation the owner's pruner makes (the
// new current generation gets the old one's grants), and its own pruner,
// which may not seal or drop generations, prunes them row by row instead
// of failing.
func TestPrunerAsApplicationRole(t *testing.T) {
	ctx := context.Background()
	g, owner := migrated(t)
	var db string
	if err := owner.QueryRow(ctx, `select current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	role := "app_" + db
	for _, stmt := range []string{
		`create role ` + pgx.Identifier{role}.Sanitize() + ` login`,
		`grant select, insert, update, delete on exactly_guard to ` + pgx.Identifier{role}.Sanitize(),
		`grant select, insert, delete on exactly_guard_outcomes to ` + pgx.Identifier{role}.Sanitize(),
		`grant select on exactly_guard_sealed, exactly_guard_generations to ` + pgx.Identifier{role}.Sanitize(),
	} {
		if _, err := owner.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = owner.Exec(context.Background(), `drop owned by `+pgx.Identifier{role}.Sanitize())
		_, _ = owner.Exec(context.Background(), `drop role `+pgx.Identifier{role}.Sanitize())
	})
	cfg := owner.Config()
	cfg.ConnConfig.User = role
	app, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.Close)
	if o := claimOne(t, g, app, dedupe.RecordClaim{Scope: "s", Key: "k1", Topic: "t", Offset: 1, Handler: "h"}, true); o != dedupe.Applied {
		t.Fatalf("claim as the application role = %s", o)
	}
	pruneOnce(t, rotator(t, g, owner, time.Hour)) // the owner seals k1's generation
	if o := claimOne(t, g, app, dedupe.RecordClaim{Scope: "s", Key: "k1", Topic: "t", Offset: 2, Handler: "h"}, false); o != dedupe.Duplicate {
		t.Fatalf("k1 after the owner's rotation = %s, want duplicate", o)
	}
	if o := claimOne(t, g, app, dedupe.RecordClaim{Scope: "s", Key: "k2", Topic: "t", Offset: 3, Handler: "h"}, true); o != dedupe.Applied {
		t.Fatalf("a new key in the new current generation = %s, want applied", o)
	}
	// Rows of the sealed and of the current generation, aged past a
	// retention of an hour: the application role's pruner deletes them.
	for _, gen := range []string{"", "sealed"} {
		q := `update exactly_guard set processed_at = now() - interval '2 hours'`
		if gen != "" {
			gens, err := g.Generations(ctx, owner)
			if err != nil {
				t.Fatal(err)
			}
			q = `update ` + pgx.Identifier{gens[0].Name}.Sanitize() + ` set processed_at = now() - interval '2 hours'`
		}
		if _, err := owner.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	n := pruneOnce(t, rotator(t, g, app, time.Hour))
	if n != 2 {
		t.Fatalf("the application role's pruner deleted %d rows, want 2", n)
	}
}

// Counting a sealed generation takes no lock a reader of the sealed view
// holds (it redefines nothing): it completes while a transaction that read
// the view is still open, where a redefinition would wait for it.
func TestCountingASealedGenerationWaitsForNoReader(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	claimOne(t, g, pool, dedupe.RecordClaim{Scope: "s", Key: "k", Topic: "t", Offset: 1, Handler: "h"}, true)
	pruneOnce(t, rotator(t, g, pool, time.Hour))
	gens := g.GenerationsTable().Sanitize()
	// As if sealed but not yet counted (its count moved out again).
	if _, err := pool.Exec(ctx, `update `+gens+` set counted = false, row_count = null where until is not null`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `delete from exactly_guard_outcomes`); err != nil {
		t.Fatal(err)
	}
	reader, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reader.Rollback(ctx) }()
	var n int
	if err := reader.QueryRow(ctx, `select count(*) from exactly_guard_sealed`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("reader: %d rows, %v", n, err)
	}
	p, err := g.NewPruner(pool, dedupe.PrunerConfig{Retention: time.Hour, AllowShortRetention: true, GenerationSpan: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	dedupe.SetLockTimeout(p, "200ms")
	pruneOnce(t, p)
	list, err := g.Generations(ctx, pool)
	if err != nil || len(list) != 2 || !list[0].Counted || list[0].Rows != 1 {
		t.Fatalf("Generations = %+v, %v; want the sealed one counted (1 row) while a reader holds the view", list, err)
	}
	if c, err := g.Outcomes(ctx, reader, "s"); err != nil || c.Applied != 1 {
		t.Errorf("Outcomes in the reader's transaction = %+v, %v; want 1 applied", c, err)
	}
}
