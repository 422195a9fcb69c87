package dedupe_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactly-go/exactly/dedupe"
)

// seed inserts n guard rows processed age ago.
func seed(t *testing.T, g *dedupe.Guard, q dedupe.Querier, scope string, n int, age time.Duration) {
	t.Helper()
	_, err := q.Exec(context.Background(), `insert into `+g.Table().Sanitize()+` (scope, key, processed_at)
		select $1, 'k' || i, now() - $3::bigint * interval '1 microsecond' from generate_series(1, $2) as i`,
		scope, n, age.Microseconds())
	if err != nil {
		t.Fatal(err)
	}
}

func TestPruneDeletesOnlyExpiredInBatches(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	seed(t, g, pool, "old", 2500, 30*24*time.Hour)
	seed(t, g, pool, "edge", 10, 13*24*time.Hour)
	seed(t, g, pool, "new", 100, 0)
	// Record how many rows each delete statement removes.
	if _, err := pool.Exec(ctx, `
create table prune_log (deleted bigint not null);
create function log_prune() returns trigger language plpgsql as
  $$ begin insert into prune_log select count(*) from gone; return null; end $$;
create trigger log_prune after delete on exactly_guard referencing old table as gone
  for each statement execute function log_prune();`); err != nil {
		t.Fatal(err)
	}
	n, err := g.Prune(ctx, pool, 14*24*time.Hour, 1000)
	if err != nil || n != 2500 {
		t.Fatalf("Prune = %d, %v; want 2500", n, err)
	}
	if c := count(t, pool, `select count(*) from exactly_guard where scope = 'old'`); c != 0 {
		t.Fatalf("%d expired rows left", c)
	}
	if c := count(t, pool, `select count(*) from exactly_guard`); c != 110 {
		t.Fatalf("%d rows left, want 110 unexpired", c)
	}
	var stmts, maxDeleted int
	if err := pool.QueryRow(ctx, `select count(*), max(deleted) from prune_log`).Scan(&stmts, &maxDeleted); err != nil {
		t.Fatal(err)
	}
	if stmts != 3 || maxDeleted != 1000 {
		t.Fatalf("%d delete statements, largest %d rows; want 3 of at most 1000", stmts, maxDeleted)
	}
	// Nothing left to prune.
	if n, err := g.Prune(ctx, pool, 14*24*time.Hour, 1000); err != nil || n != 0 {
		t.Fatalf("second Prune = %d, %v", n, err)
	}
	if _, err := g.Prune(ctx, pool, -time.Hour, 10); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("negative age: %v", err)
	}
}

func TestPrunerRefusesShortRetention(t *testing.T) {
	pool := testDB(t)
	g := dedupe.New()
	_, err := g.NewPruner(pool, dedupe.PrunerConfig{Retention: 24 * time.Hour, RedeliveryHorizon: 72 * time.Hour})
	var re *dedupe.RetentionError
	if !errors.As(err, &re) || re.Retention != 24*time.Hour || re.RedeliveryHorizon != 72*time.Hour {
		t.Fatalf("NewPruner err = %v, want *RetentionError naming both", err)
	}
	// The default horizon (7 days) applies when unset.
	if _, err := g.NewPruner(pool, dedupe.PrunerConfig{Retention: 24 * time.Hour}); !errors.As(err, &re) {
		t.Fatalf("short retention against the default horizon: %v", err)
	}
	if _, err := g.NewPruner(pool, dedupe.PrunerConfig{Retention: time.Hour, AllowShortRetention: true}); err != nil {
		t.Fatalf("explicit override refused: %v", err)
	}
	if _, err := g.NewPruner(pool, dedupe.PrunerConfig{}); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	if _, err := g.NewPruner(pool, dedupe.PrunerConfig{Interval: -1}); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("negative interval: %v", err)
	}
}

func TestOnlyOnePrunerRuns(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	seed(t, g, pool, "old", 10, 30*24*time.Hour)
	p1, err := g.NewPruner(pool, dedupe.PrunerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	p2, err := g.NewPruner(pool, dedupe.PrunerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// A pruner of another table is not excluded.
	other := dedupe.New(dedupe.WithTable("", "other_guard"))
	if err := other.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	p3, err := other.NewPruner(pool, dedupe.PrunerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	locked, proceed := make(chan struct{}), make(chan struct{})
	dedupe.SetAfterLock(p1, func() { close(locked); <-proceed })
	type result struct {
		n   int64
		ran bool
		err error
	}
	p1Done := make(chan result, 1)
	go func() {
		n, ran, err := p1.PruneOnce(ctx)
		p1Done <- result{n, ran, err}
	}()
	<-locked
	if n, ran, err := p2.PruneOnce(ctx); err != nil || ran || n != 0 {
		t.Fatalf("second pruner while the first holds the lock = %d, %v, %v; want skipped", n, ran, err)
	}
	if _, ran, err := p3.PruneOnce(ctx); err != nil || !ran {
		t.Fatalf("pruner of another table = %v, %v; want it to run", ran, err)
	}
	close(proceed)
	if r := <-p1Done; r.err != nil || !r.ran || r.n != 10 {
		t.Fatalf("first pruner = %+v; want 10 deleted", r)
	}
	// The lock is released: the second pruner runs now.
	if _, ran, err := p2.PruneOnce(ctx); err != nil || !ran {
		t.Fatalf("second pruner after release = %v, %v", ran, err)
	}
}

func TestPrunerRunStopsWithContext(t *testing.T) {
	g, pool := migrated(t)
	seed(t, g, pool, "old", 5, 30*24*time.Hour)
	p, err := g.NewPruner(pool, dedupe.PrunerConfig{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ranOnce := make(chan struct{})
	dedupe.SetAfterLock(p, func() { close(ranOnce) })
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	<-ranOnce
	// Run pruned immediately; the hour-long interval has not elapsed.
	for count(t, pool, `select count(*) from exactly_guard`) != 0 {
		if t.Context().Err() != nil {
			t.Fatal("rows were not pruned")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil after cancel", err)
	}
}

// A pruner reports what each prune deleted to OnPruned (the services feed
// the exactly.guard.pruned metric from it).
func TestPrunerReportsDeletedRows(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	seed(t, g, pool, "old", 30, 30*24*time.Hour)
	seed(t, g, pool, "new", 5, 0)
	var reported []int64
	p, err := g.NewPruner(pool, dedupe.PrunerConfig{OnPruned: func(n int64) { reported = append(reported, n) }})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, ran, err := p.PruneOnce(ctx); err != nil || !ran {
			t.Fatalf("PruneOnce: ran=%v err=%v", ran, err)
		}
	}
	if len(reported) != 2 || reported[0] != 30 || reported[1] != 0 {
		t.Fatalf("OnPruned got %v, want [30 0]", reported)
	}
}
