package bench

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/exactly-go/exactly/cmd/exactly/internal/workload"
	"github.com/exactly-go/exactly/internal/runtime/deferred"
	"github.com/exactly-go/exactly/internal/testenv/pgserver"
	"github.com/exactly-go/exactly/outbox"
)

// kindScale is the outbox-mode scenario (Spec.Mode): writer-side effects/s
// and relay throughput of the table outbox, the sharded outbox and the WAL
// relay, side by side.
const kindScale = "scale"

// Outbox modes a scale scenario measures (Spec.Mode).
const (
	modeTable   = "table"
	modeSharded = "sharded4"
	modeWAL     = "wal"
)

// Scale scenario ids (ScenarioIDs).
const (
	idOutbox1   = "outbox1"
	idOutbox4   = "outbox4"
	idOutboxWAL = "outboxwal"
)

// isScale reports whether id is a scale scenario (no "× limit" ratio).
func isScale(id string) bool { return id == idOutbox1 || id == idOutbox4 || id == idOutboxWAL }

// scaleScenarios returns the three outbox-mode scenarios. Each child
// starts its own PostgreSQL with wal_level=logical (so all three run on the
// same settings, and the other scenarios' server is left as it is) and
// uses the bench's broker.
func scaleScenarios(base Spec, records int, run string) []scenario {
	mk := func(id, name, mode string) scenario {
		s := base
		s.Kind, s.Mode, s.Records, s.Events = kindScale, mode, records, "bench-scale-"+id+"-"+run
		return scenario{id, name, s, false}
	}
	return []scenario{
		mk(idOutbox1, "outbox relay, 1 table", modeTable),
		mk(idOutbox4, "outbox relay, 4 shards", modeSharded),
		mk(idOutboxWAL, "outbox WAL relay", modeWAL),
	}
}

// scaleMode is one outbox mode: how writers add an event, and a relay.
type scaleMode struct {
	add func(ctx context.Context, tx pgx.Tx, msg outbox.Message) error
	// relay returns a relay run function and its Close.
	relay func(published func(n int)) (func(context.Context) error, func(), error)
}

// runScale measures spec.Mode on a private PostgreSQL (wal_level=logical,
// synchronous_commit=on): first the writers (spec.Conns connections, each
// transaction adding spec.Batch events through the consumer's transaction
// buffer, as a handler's batch does) with the relay publishing
// concurrently, giving writer-side events/s; then, with the relay stopped,
// the same number of events is written and the relay's drain of that
// backlog is timed: relay throughput. The result's rate is the relay's;
// the writers' is in its note.
func runScale(ctx context.Context, spec Spec, log *slog.Logger) (Result, error) {
	srv, err := pgserver.Start(ctx, pgserver.Options{Logger: log, LogicalReplication: true,
		Settings: map[string]string{"synchronous_commit": "on", "fsync": "on", "max_wal_size": "4GB"}})
	if err != nil {
		return Result{}, fmt.Errorf("starting PostgreSQL with wal_level=logical: %w", err)
	}
	defer srv.Stop()
	url := srv.URL("postgres")
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return Result{}, err
	}
	pcfg.MaxConns = int32(max(spec.Conns, 1) + 6)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return Result{}, fmt.Errorf("connecting: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "create table effects (id bigserial primary key, account bigint not null, amount bigint not null)"); err != nil {
		return Result{}, fmt.Errorf("creating the effects table: %w", err)
	}
	m, err := newScaleMode(ctx, spec, pool, url, log)
	if err != nil {
		return Result{}, err
	}
	// published counts the events acknowledged; reachedAt is when it first
	// reached target (the poll below only waits, at 50 ms steps).
	var published, target, reachedAt atomic.Int64
	startRelay := func() (stop func() error, err error) {
		run, closeRelay, err := m.relay(func(n int) {
			if published.Add(int64(n)) >= target.Load() {
				reachedAt.CompareAndSwap(0, time.Now().UnixNano())
			}
		})
		if err != nil {
			return nil, err
		}
		rctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- run(rctx) }()
		return func() error { cancel(); err := <-errc; closeRelay(); return err }, nil
	}
	awaitPublished := func(want int64) error {
		if err := workload.Poll(ctx, func() (bool, error) { return published.Load() >= want, nil }); err != nil {
			return fmt.Errorf("relay published %d of %d events: %w", published.Load(), want, err)
		}
		return nil
	}

	n := spec.Records
	// Phase 1: writers with the relay running.
	target.Store(int64(n))
	stop, err := startRelay()
	if err != nil {
		return Result{}, err
	}
	wstart := time.Now()
	if err := writeEvents(ctx, spec, pool, m, 0, n); err != nil {
		stop()
		return Result{}, err
	}
	wsec := time.Since(wstart).Seconds()
	if err := awaitPublished(int64(n)); err != nil {
		stop()
		return Result{}, err
	}
	if err := stop(); err != nil {
		return Result{}, err
	}

	// Phase 2: a backlog of n events, then the relay drains it.
	if err := writeEvents(ctx, spec, pool, m, n, n); err != nil {
		return Result{}, err
	}
	target.Store(int64(2 * n))
	reachedAt.Store(0)
	rstart := time.Now()
	stop, err = startRelay()
	if err != nil {
		return Result{}, err
	}
	if err := awaitPublished(int64(2 * n)); err != nil {
		stop()
		return Result{}, err
	}
	rsec := time.Unix(0, reachedAt.Load()).Sub(rstart).Seconds()
	if err := stop(); err != nil {
		return Result{}, err
	}
	res := Result{Records: n, Seconds: rsec, Rate: float64(n) / rsec, P50: -1, P99: -1}
	res.Note = fmt.Sprintf("writers: %.0f events/s (%d events, %d connections, %d events per transaction, relay running); relay drains %d events in %.2fs",
		float64(n)/wsec, n, spec.Conns, spec.Batch, n, rsec)
	return res, nil
}

// newScaleMode builds spec.Mode's outbox on pool (url for the WAL relay's
// replication connection), migrated, and for the WAL mode with its slot
// created, so that later writes are retained for the relay.
func newScaleMode(ctx context.Context, spec Spec, pool *pgxpool.Pool, url string, log *slog.Logger) (scaleMode, error) {
	quiet := log.With("scenario", spec.Mode)
	switch spec.Mode {
	case modeTable:
		ob := outbox.New()
		if err := ob.Migrate(ctx, pool); err != nil {
			return scaleMode{}, err
		}
		return scaleMode{add: ob.Add, relay: func(pub func(int)) (func(context.Context) error, func(), error) {
			r, err := outbox.NewRelay(pool, spec.Brokers, outbox.RelayConfig{Outbox: ob, Logger: quiet,
				Hooks: outbox.RelayHooks{OnPublished: func(n int, _ []time.Duration) { pub(n) }}})
			if err != nil {
				return nil, nil, err
			}
			return r.Run, r.Close, nil
		}}, nil
	case modeSharded:
		s, err := outbox.NewSharded(4)
		if err != nil {
			return scaleMode{}, err
		}
		if err := s.Migrate(ctx, pool); err != nil {
			return scaleMode{}, err
		}
		return scaleMode{add: s.Add, relay: func(pub func(int)) (func(context.Context) error, func(), error) {
			r, err := outbox.NewShardedRelay(pool, spec.Brokers, s, outbox.RelayConfig{Logger: quiet,
				Hooks: outbox.RelayHooks{OnPublished: func(n int, _ []time.Duration) { pub(n) }}})
			if err != nil {
				return nil, nil, err
			}
			return r.Run, r.Close, nil
		}}, nil
	case modeWAL:
		w := outbox.NewWAL()
		m := scaleMode{add: w.Add, relay: func(pub func(int)) (func(context.Context) error, func(), error) {
			r, err := outbox.NewWALRelay(spec.Brokers, outbox.WALRelayConfig{ConnString: url, Logger: quiet,
				Hooks: outbox.WALRelayHooks{OnPublished: pub}})
			if err != nil {
				return nil, nil, err
			}
			return r.Run, r.Close, nil
		}}
		// The slot must exist before the first write it is to relay: run
		// the relay until it streams, once.
		var active atomic.Bool
		r, err := outbox.NewWALRelay(spec.Brokers, outbox.WALRelayConfig{ConnString: url, Logger: quiet,
			Hooks: outbox.WALRelayHooks{OnActive: func(a bool) { active.Store(active.Load() || a) }}})
		if err != nil {
			return scaleMode{}, err
		}
		defer r.Close()
		rctx, cancel := context.WithCancel(ctx)
		g, gctx := errgroup.WithContext(rctx)
		g.Go(func() error { return r.Run(gctx) })
		err = workload.Poll(ctx, func() (bool, error) { return active.Load(), nil })
		cancel()
		if gerr := g.Wait(); gerr != nil && err == nil {
			err = gerr
		}
		if err != nil {
			return scaleMode{}, fmt.Errorf("creating the replication slot: %w", err)
		}
		return m, nil
	}
	return scaleMode{}, fmt.Errorf("unknown outbox mode %q", spec.Mode)
}

// writeEvents commits count events numbered from first, spec.Batch per
// transaction, from spec.Conns writers: each transaction inserts its
// effect rows (one statement) and adds its events through a transaction
// buffer flushed before COMMIT, as an exactly consumer's batch does.
func writeEvents(ctx context.Context, spec Spec, pool *pgxpool.Pool, m scaleMode, first, count int) error {
	batch := max(spec.Batch, 1)
	var next atomic.Int64
	next.Store(int64(first))
	end := int64(first + count)
	g, gctx := errgroup.WithContext(ctx)
	for range max(spec.Conns, 1) {
		g.Go(func() error {
			for {
				from := next.Add(int64(batch)) - int64(batch)
				if from >= end {
					return nil
				}
				to := min(from+int64(batch), end)
				err := pgx.BeginFunc(gctx, pool, func(tx pgx.Tx) error {
					accounts := make([]int64, 0, to-from)
					for i := from; i < to; i++ {
						accounts = append(accounts, i%int64(max(spec.Accounts, 1)))
					}
					if _, err := tx.Exec(gctx, "insert into effects (account, amount) select a, 1 from unnest($1::bigint[]) a", accounts); err != nil {
						return err
					}
					buf := deferred.New(tx)
					bctx := deferred.With(gctx, buf)
					for j, a := range accounts {
						v := strconv.AppendInt([]byte(`{"amount":1,"seq":`), from+int64(j), 10)
						msg := outbox.Message{Topic: spec.Events, Key: strconv.AppendInt(nil, a, 10), Value: append(v, '}')}
						if err := m.add(bctx, tx, msg); err != nil {
							return err
						}
					}
					return buf.Flush(bctx)
				})
				if err != nil {
					return fmt.Errorf("writing events %d..%d: %w", from, to, err)
				}
			}
		})
	}
	return g.Wait()
}
