package dedupe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/runtime/pgsession"
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

// OldestAge returns the age, by the database clock, of the oldest guard
// row the pruner is due to remove by its age (0 when there is none): the
// oldest row of the current generation and of legacy generations, which
// are pruned row by row, and the newest row of each other sealed
// generation (the time it was sealed), which is dropped whole. A pruner
// that keeps up holds it below its retention. It reads the generations
// table and one end of a processed_at index per pruned table, so it is
// cheap at any size; before migration 0009, the guard table's oldest row.
// It wraps the database error.
func (g *Guard) OldestAge(ctx context.Context, q Querier) (time.Duration, error) {
	legacy, err := g.legacyGens(ctx, q, false)
	var pe *pgconn.PgError
	var query string
	if errors.As(err, &pe) && pe.Code == "42P01" {
		query = `select coalesce((extract(epoch from now() - min(processed_at)) * 1e6)::bigint, 0) from ` + g.quoted
	} else if err != nil {
		return 0, fmt.Errorf("dedupe: oldest row of %s: %w", g.quoted, err)
	} else {
		var mins strings.Builder
		for _, gen := range legacy {
			mins.WriteString(`, (select min(processed_at) from ` + g.ident(gen.Name).Sanitize() + `)`)
		}
		query = fmt.Sprintf(g.oldestSQL, mins.String())
	}
	var us int64
	if err := q.QueryRow(ctx, query).Scan(&us); err != nil {
		return 0, fmt.Errorf("dedupe: oldest row of %s: %w", g.quoted, err)
	}
	return max(time.Duration(us)*time.Microsecond, 0), nil
}

// prune deletes the expired rows of the current generation and of the
// sealed legacy generations (those still carrying rows older than the
// retention one by one), in index-ordered batches. A Pruner's own batches
// each run in a transaction holding the pruners' lock (locked); Prune's
// run alone.
func (g *Guard) prune(ctx context.Context, q Querier, olderThan time.Duration, batchSize int) (int64, error) {
	cutoff, err := g.cutoff(ctx, q, olderThan)
	if err != nil {
		return 0, err
	}
	if batchSize <= 0 {
		batchSize = DefaultPruneBatchSize
	}
	stmts, err := g.pruneStatements(ctx, q, false)
	if err != nil {
		return 0, err
	}
	return g.pruneRows(cutoff, batchSize, stmts, func(sql string) (int64, bool, error) {
		var n int64
		err := q.QueryRow(ctx, sql, cutoff, batchSize).Scan(&n)
		return n, true, err
	})
}

// pruneStatements returns the row-by-row prune statements: the current
// generation's, and one per sealed legacy generation (with all, per sealed
// generation). Before migration 0009 (no generations table) only the
// current one.
func (g *Guard) pruneStatements(ctx context.Context, q Querier, all bool) ([]string, error) {
	legacy, err := g.legacyGens(ctx, q, all)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" {
		return []string{g.pruneSQL}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("dedupe: prune %s: %w", g.quoted, err)
	}
	stmts := []string{g.pruneSQL}
	for _, gen := range legacy {
		stmts = append(stmts, g.pruneRowsSQL(g.ident(gen.Name).Sanitize(), gen.Name))
	}
	return stmts, nil
}

// cutoff is the database's now() minus olderThan.
func (g *Guard) cutoff(ctx context.Context, q Querier, olderThan time.Duration) (time.Time, error) {
	if olderThan < 0 {
		return time.Time{}, fmt.Errorf("dedupe: prune %s: negative age %v: %w", g.quoted, olderThan, ErrInvalidConfig)
	}
	var cutoff time.Time
	if err := q.QueryRow(ctx, g.cutoffSQL, olderThan.Microseconds()).Scan(&cutoff); err != nil {
		return time.Time{}, fmt.Errorf("dedupe: prune %s: compute cutoff: %w", g.quoted, err)
	}
	return cutoff, nil
}

// pruneRows runs the batches of the row-by-row prune through run (which
// reports false when it could not run one), the current generation first.
func (g *Guard) pruneRows(cutoff time.Time, batchSize int, stmts []string, run func(sql string) (int64, bool, error)) (int64, error) {
	var total int64
	for _, sql := range stmts {
		for {
			deleted, ok, err := run(sql)
			total += deleted
			if err != nil {
				return total, fmt.Errorf("dedupe: prune %s: delete rows older than %v: %w", g.quoted, cutoff, err)
			}
			if !ok || deleted < int64(batchSize) {
				break
			}
		}
	}
	return total, nil
}

// Prune deletes the guard rows claimed more than olderThan ago (by the
// database clock, fixed when Prune starts) from the current generation and
// from legacy generations (see [Generation]), in batches of at most
// batchSize rows, each its own short statement reading the processed_at
// index, until a batch deletes fewer than batchSize rows. It does not seal
// or drop generations (a Pruner does). It returns the number of rows
// deleted, also when it fails part-way. batchSize <= 0 means
// DefaultPruneBatchSize. Prune does not coordinate with other pruners. It
// fails wrapping ErrInvalidConfig for a negative olderThan, or the database
// error.
func (g *Guard) Prune(ctx context.Context, pool *pgxpool.Pool, olderThan time.Duration, batchSize int) (int64, error) {
	return g.prune(ctx, pool, olderThan, batchSize)
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
	// GenerationSpan is how long a generation stays current before the
	// pruner seals it and starts an empty one (default Retention / 2).
	// Claims probe every sealed generation, so a shorter span costs each
	// claim more probes (Retention / GenerationSpan + 1 of them) for a
	// smaller current generation (less WAL per claim) and rows kept
	// closer to the retention (at most Retention + GenerationSpan).
	GenerationSpan time.Duration
	// Logger receives prune results and errors (default slog.Default()).
	Logger *slog.Logger
	// OnPruned, when set, is called after each prune that ran with the
	// number of rows it deleted (for a metric).
	OnPruned func(deleted int64)
}

// Pruner periodically prunes a guard table: it seals the current
// generation when it is older than GenerationSpan, counts each sealed
// generation's applied rows into the outcome counters once, drops the
// sealed generations whose newest row is older than Retention, and deletes
// expired rows of the current and legacy generations in index-ordered
// batches. Across all processes pruning the same table, at most one works
// at any time: each of its transactions first takes a transaction-scoped
// advisory lock keyed by the table name (nothing stays on a pooled
// connection, so it is correct behind a transaction-mode pooler), and a
// prune stops when another pruner holds it.
type Pruner struct {
	g    *Guard
	pool *pgxpool.Pool
	cfg  PrunerConfig

	afterLock   func() // test hook, called while the lock is held
	lockTimeout string // test hook: ddlLockTimeout when ""
}

// manySealedGenerations is the number of sealed generations (retention ÷
// generation span) above which NewPruner warns: every claim probes each
// sealed generation's primary key, so their count is a cost per record.
const manySealedGenerations = 16

// NewPruner returns a Pruner of g's table using pool. It fails with a
// *RetentionError when cfg.Retention is shorter than cfg.RedeliveryHorizon
// (after defaults) unless cfg.AllowShortRetention, and wrapping
// ErrInvalidConfig for negative values or a nil pool. It logs a warning
// when Retention ÷ GenerationSpan exceeds 16: each claim probes every
// sealed generation, so a short span costs every record.
func (g *Guard) NewPruner(pool *pgxpool.Pool, cfg PrunerConfig) (*Pruner, error) {
	if pool == nil {
		return nil, fmt.Errorf("dedupe: new pruner: nil pool: %w", ErrInvalidConfig)
	}
	if cfg.Retention < 0 || cfg.RedeliveryHorizon < 0 || cfg.Interval < 0 || cfg.BatchSize < 0 || cfg.GenerationSpan < 0 {
		return nil, fmt.Errorf("dedupe: new pruner: negative retention, horizon, interval, batch size or generation span: %w", ErrInvalidConfig)
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
	if cfg.GenerationSpan == 0 {
		cfg.GenerationSpan = cfg.Retention / 2
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Retention < cfg.RedeliveryHorizon && !cfg.AllowShortRetention {
		return nil, &RetentionError{Retention: cfg.Retention, RedeliveryHorizon: cfg.RedeliveryHorizon}
	}
	if n := cfg.Retention / cfg.GenerationSpan; n > manySealedGenerations {
		cfg.Logger.Warn("dedupe: the generation span keeps many sealed generations, and every claim probes each of them",
			"table", g.quoted, "retention", cfg.Retention, "generation_span", cfg.GenerationSpan,
			"sealed_generations", int64(n), "advised_at_most", manySealedGenerations)
	}
	return &Pruner{g: g, pool: pool, cfg: cfg}, nil
}

// lockSQL names the transaction ($1) in application_name and tries the
// pruners' transaction-scoped advisory lock, in the two-key space: the
// first key namespaces the pruners, the second is the table. The lock and
// the setting end with the transaction.
const lockSQL = `select set_config('application_name', $1, true), set_config('lock_timeout', $2, true),
	pg_try_advisory_xact_lock(hashtext('exactly.dedupe.prune'), hashtext($3))`

// ddlLockTimeout bounds the wait of a rotation or a drop for the
// transactions that use the generation: claims queue behind a waiting
// rotation, so it gives up (and retries at the next prune) rather than
// hold them longer.
const ddlLockTimeout = "2s"

// ddlTimeout is the Pruner's lock timeout for rotations, counts and drops:
// ddlLockTimeout unless a test set another.
func (p *Pruner) ddlTimeout() string {
	if p.lockTimeout != "" {
		return p.lockTimeout
	}
	return ddlLockTimeout
}

// locked runs fn in a transaction that holds the pruners' lock, and
// reports false (without running fn) when another pruner holds it.
func (p *Pruner) locked(ctx context.Context, lockTimeout string, fn func(tx pgx.Tx) error) (bool, error) {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var name, timeout string
	var ok bool
	if err := tx.QueryRow(ctx, lockSQL, pgsession.AppName("pruner", p.g.name), lockTimeout, p.g.quoted).Scan(&name, &timeout, &ok); err != nil {
		return false, fmt.Errorf("try advisory lock: %w", err)
	}
	if !ok {
		return false, nil
	}
	if err := fn(tx); err != nil {
		return true, err
	}
	if err := tx.Commit(ctx); err != nil {
		return true, fmt.Errorf("commit: %w", err)
	}
	return true, nil
}

// PruneOnce prunes once if no other Pruner of the same table is pruning:
// it seals the current generation when it is due, counts the sealed
// generations not yet counted, drops the expired ones, deletes the expired
// rows of the current and legacy generations, and rolls up the outcome
// counters (RollUpOutcomes), each step in its own transaction holding the
// pruners' lock. deleted counts the rows of dropped generations and the
// rows deleted. ran is false (and deleted 0) when another pruner holds the
// lock. A rotation or drop that cannot lock its table within 2 s is left
// to the next prune. It fails with the wrapped database error, returning
// the rows deleted before the failure.
func (p *Pruner) PruneOnce(ctx context.Context) (deleted int64, ran bool, err error) {
	defer func() {
		if ran && p.cfg.OnPruned != nil {
			p.cfg.OnPruned(deleted)
		}
	}()
	fail := func(what string, err error) error {
		return fmt.Errorf("dedupe: prune %s: %s: %w", p.g.quoted, what, err)
	}
	gens, owner := true, true
	ran, err = p.locked(ctx, p.ddlTimeout(), func(tx pgx.Tx) error {
		if p.afterLock != nil {
			p.afterLock()
		}
		_, err := p.g.rotate(ctx, tx, p.cfg.GenerationSpan)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42P01" {
			gens = false // not migrated to generations (0009)
			return nil
		}
		return err
	})
	if isLockTimeout(err) {
		p.cfg.Logger.WarnContext(ctx, "dedupe: sealing the current generation waited too long for its lock; next prune", "table", p.g.quoted)
		err = nil
	}
	if isNotOwner(err) {
		// Sealing, counting and dropping generations are DDL: without the
		// owner's privileges, prune every generation row by row.
		p.cfg.Logger.WarnContext(ctx, "dedupe: the pruner's role does not own the guard's tables: generations are pruned row by row (run `exactly prune` as the owner to seal and drop them)",
			"table", p.g.quoted, "err", err)
		gens, owner, err = false, false, nil
	}
	if err != nil || !ran {
		return 0, ran, errIf(err, func(e error) error { return fail("sealing the current generation", e) })
	}
	cutoff, err := p.g.cutoff(ctx, p.pool, p.cfg.Retention)
	if err != nil {
		return 0, true, err
	}
	for gens {
		var more bool
		ok, err := p.locked(ctx, p.ddlTimeout(), func(tx pgx.Tx) error {
			var err error
			more, err = p.g.foldOne(ctx, tx)
			return err
		})
		if isLockTimeout(err) || isNotOwner(err) {
			p.cfg.Logger.WarnContext(ctx, "dedupe: could not count a sealed generation; next prune", "table", p.g.quoted, "err", err)
			break
		}
		if err != nil {
			return deleted, true, fail("counting a sealed generation", err)
		}
		if !ok || !more {
			break
		}
	}
	for gens {
		var rows int64
		var more bool
		ok, err := p.locked(ctx, p.ddlTimeout(), func(tx pgx.Tx) error {
			var err error
			rows, more, err = p.g.dropOne(ctx, tx, cutoff)
			return err
		})
		if isLockTimeout(err) || isNotOwner(err) {
			p.cfg.Logger.WarnContext(ctx, "dedupe: could not drop an expired generation; next prune", "table", p.g.quoted, "err", err)
			break
		}
		if err != nil {
			return deleted, true, fail("dropping an expired generation", err)
		}
		if !ok || !more {
			break
		}
		deleted += rows
	}
	stmts, err := p.g.pruneStatements(ctx, p.pool, !owner)
	if err != nil {
		return deleted, true, err
	}
	n, err := p.g.pruneRows(cutoff, p.cfg.BatchSize, stmts, func(sql string) (int64, bool, error) {
		var n int64
		ok, err := p.locked(ctx, "0", func(tx pgx.Tx) error { return tx.QueryRow(ctx, sql, cutoff, p.cfg.BatchSize).Scan(&n) })
		return n, ok, err
	})
	deleted += n
	if err != nil {
		return deleted, true, err
	}
	if _, err := p.locked(ctx, "0", func(tx pgx.Tx) error { return p.g.RollUpOutcomes(ctx, tx) }); err != nil {
		return deleted, true, err
	}
	return deleted, true, nil
}

// errIf returns nil for a nil err, and wrap(err) otherwise.
func errIf(err error, wrap func(error) error) error {
	if err == nil {
		return nil
	}
	return wrap(err)
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
