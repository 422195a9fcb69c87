package dedupe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Pruning defaults, used for zero fields of PrunerConfig.
const (
	DefaultRetention         = 14 * 24 * time.Hour
	DefaultRedeliveryHorizon = 7 * 24 * time.Hour
	DefaultPruneInterval     = time.Minute
	DefaultPruneBatchSize    = 1000
)

// ErrInvalidConfig is returned (wrapped) for a negative duration or batch
// size given to Prune or NewPruner.
var ErrInvalidConfig = errors.New("dedupe: invalid configuration")

// RetentionError is returned by NewPruner when Retention is shorter than
// RedeliveryHorizon and AllowShortRetention is not set: a key pruned before
// its last possible redelivery (retries, dead-letter replays) would run again.
type RetentionError struct {
	Retention         time.Duration
	RedeliveryHorizon time.Duration
}

// Error names both durations and the override.
func (e *RetentionError) Error() string {
	return fmt.Sprintf("dedupe: retention %v is shorter than the redelivery horizon %v: "+
		"a record replayed after its guard row was pruned would be applied again "+
		"(raise the retention, or set AllowShortRetention to accept that)", e.Retention, e.RedeliveryHorizon)
}

// Prune deletes the guard rows claimed more than olderThan ago (by the
// database clock, fixed when Prune starts), in batches of at most batchSize
// rows, each its own short statement, until a batch deletes fewer than
// batchSize rows. It returns the number of rows deleted, also when it fails
// part-way. batchSize <= 0 means DefaultPruneBatchSize. Prune does not
// coordinate with other pruners (a Pruner does). It fails wrapping
// ErrInvalidConfig for a negative olderThan, or the database error.
func (g *Guard) Prune(ctx context.Context, pool *pgxpool.Pool, olderThan time.Duration, batchSize int) (int64, error) {
	return g.prune(ctx, pool, olderThan, batchSize)
}

// OldestAge returns how long ago the oldest guard row was written, by the
// database clock (0 when the table is empty). It reads one end of the
// processed_at index, so it is cheap at any table size; a pruner that keeps
// up holds it near its retention. It wraps the database error.
func (g *Guard) OldestAge(ctx context.Context, q Querier) (time.Duration, error) {
	var us int64
	if err := q.QueryRow(ctx, `select coalesce((extract(epoch from now() - min(processed_at)) * 1e6)::bigint, 0) from `+g.quoted).Scan(&us); err != nil {
		return 0, fmt.Errorf("dedupe: oldest row of %s: %w", g.quoted, err)
	}
	return max(time.Duration(us)*time.Microsecond, 0), nil
}

func (g *Guard) prune(ctx context.Context, q Querier, olderThan time.Duration, batchSize int) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("dedupe: prune %s: negative age %v: %w", g.quoted, olderThan, ErrInvalidConfig)
	}
	if batchSize <= 0 {
		batchSize = DefaultPruneBatchSize
	}
	var cutoff time.Time
	if err := q.QueryRow(ctx, g.cutoffSQL, olderThan.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("dedupe: prune %s: compute cutoff: %w", g.quoted, err)
	}
	var total int64
	for {
		var deleted int64
		if err := q.QueryRow(ctx, g.pruneSQL, cutoff, batchSize).Scan(&deleted); err != nil {
			return total, fmt.Errorf("dedupe: prune %s: delete rows older than %v: %w", g.quoted, cutoff, err)
		}
		total += deleted
		if deleted < int64(batchSize) {
			return total, nil
		}
	}
}

// PrunerConfig configures a Pruner. Zero fields take the defaults.
type PrunerConfig struct {
	// Retention is how long guard rows are kept (default 14 days).
	Retention time.Duration
	// RedeliveryHorizon is the longest time after which a record can still
	// be delivered again: retries plus the dead-letter replay window
	// (default 7 days). Retention must not be shorter.
	RedeliveryHorizon time.Duration
	// AllowShortRetention accepts a Retention shorter than
	// RedeliveryHorizon, knowingly risking re-application of late replays.
	AllowShortRetention bool
	// Interval is the time between prunes in Run (default 1 minute).
	Interval time.Duration
	// BatchSize bounds the rows one delete statement removes (default 1000).
	BatchSize int
	// Logger receives prune results and errors (default slog.Default()).
	Logger *slog.Logger
	// OnPruned, when set, is called after each prune that ran with the
	// number of rows it deleted (for a metric).
	OnPruned func(deleted int64)
}

// Pruner periodically prunes a guard table. Across all processes pruning
// the same table, at most one prunes at any time: each prune first takes a
// session advisory lock, keyed by the table name, on a dedicated connection.
type Pruner struct {
	g    *Guard
	pool *pgxpool.Pool
	cfg  PrunerConfig

	afterLock func() // test hook, called while the lock is held
}

// NewPruner returns a Pruner of g's table using pool. It fails with a
// *RetentionError when cfg.Retention is shorter than cfg.RedeliveryHorizon
// (after defaults) unless cfg.AllowShortRetention, and wrapping
// ErrInvalidConfig for negative values or a nil pool.
func (g *Guard) NewPruner(pool *pgxpool.Pool, cfg PrunerConfig) (*Pruner, error) {
	if pool == nil {
		return nil, fmt.Errorf("dedupe: new pruner: nil pool: %w", ErrInvalidConfig)
	}
	if cfg.Retention < 0 || cfg.RedeliveryHorizon < 0 || cfg.Interval < 0 || cfg.BatchSize < 0 {
		return nil, fmt.Errorf("dedupe: new pruner: negative retention, horizon, interval or batch size: %w", ErrInvalidConfig)
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.RedeliveryHorizon == 0 {
		cfg.RedeliveryHorizon = DefaultRedeliveryHorizon
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultPruneInterval
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultPruneBatchSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Retention < cfg.RedeliveryHorizon && !cfg.AllowShortRetention {
		return nil, &RetentionError{Retention: cfg.Retention, RedeliveryHorizon: cfg.RedeliveryHorizon}
	}
	return &Pruner{g: g, pool: pool, cfg: cfg}, nil
}

// lockSQL and unlockSQL use the two-key advisory lock space: the first key
// namespaces the pruners, the second is the table.
const (
	lockSQL   = `select pg_try_advisory_lock(hashtext('exactly.dedupe.prune'), hashtext($1))`
	unlockSQL = `select pg_advisory_unlock(hashtext('exactly.dedupe.prune'), hashtext($1))`
)

// PruneOnce prunes once if no other Pruner of the same table is pruning,
// then rolls up the outcome counters (RollUpOutcomes):
// ran is false (and deleted 0) when another holds the lock. It fails with the
// wrapped database error, returning the rows deleted before the failure.
func (p *Pruner) PruneOnce(ctx context.Context) (deleted int64, ran bool, err error) {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("dedupe: prune %s: acquire connection: %w", p.g.quoted, err)
	}
	var locked bool
	if err := conn.QueryRow(ctx, lockSQL, p.g.quoted).Scan(&locked); err != nil {
		conn.Release()
		return 0, false, fmt.Errorf("dedupe: prune %s: try advisory lock: %w", p.g.quoted, err)
	}
	if !locked {
		conn.Release()
		return 0, false, nil
	}
	defer func() {
		// The lock is held by the session: if it cannot be released, the
		// connection must not go back to the pool holding it.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		var unlocked bool
		if uerr := conn.QueryRow(uctx, unlockSQL, p.g.quoted).Scan(&unlocked); uerr != nil || !unlocked {
			_ = conn.Hijack().Close(uctx)
			if err == nil && uerr != nil {
				err = fmt.Errorf("dedupe: prune %s: release advisory lock (connection closed): %w", p.g.quoted, uerr)
			} else if err == nil {
				err = fmt.Errorf("dedupe: prune %s: the advisory lock was not held when releasing it (connection closed)", p.g.quoted)
			}
			return
		}
		conn.Release()
	}()
	if p.afterLock != nil {
		p.afterLock()
	}
	deleted, err = p.g.prune(ctx, conn, p.cfg.Retention, p.cfg.BatchSize)
	if err == nil {
		err = p.g.RollUpOutcomes(ctx, conn)
	}
	if p.cfg.OnPruned != nil {
		p.cfg.OnPruned(deleted)
	}
	return deleted, true, err
}

// Run prunes immediately and then every Interval until ctx is done, and then
// returns nil. A failed prune is logged and retried at the next tick, so a
// database outage does not stop Run.
func (p *Pruner) Run(ctx context.Context) error {
	log := p.cfg.Logger.With("table", p.g.quoted)
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		deleted, ran, err := p.PruneOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			log.ErrorContext(ctx, "dedupe: prune failed", "err", err, "deleted", deleted)
		case ran:
			log.DebugContext(ctx, "dedupe: pruned guard table", "deleted", deleted, "retention", p.cfg.Retention)
		default:
			log.DebugContext(ctx, "dedupe: another pruner holds the lock; skipped")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
