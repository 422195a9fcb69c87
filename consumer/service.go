package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/runtime/migrate"
	"github.com/exactly-go/exactly/internal/runtime/telemetry"
	"github.com/exactly-go/exactly/outbox"
)

// Service runs everything a service that embeds exactly needs, from one
// [Config]: the consumer, the outbox relay (with the consumer's SASL and
// TLS settings), the guard pruner (retention from Config.GuardRetention)
// and, optionally, a metrics endpoint that also serves the health probes
// /healthz and /readyz ([Service.Ready]). Build it with [NewService], create
// its tables with [Service.Migrate] (or `exactly migrate`), and run it with
// [Service.Run]. River's Client, which runs its maintenance services beside
// its workers, is the model.
//
// Pool sizing, the one rule: give the pool one connection per partition
// this instance works on at once, up to [PartitionConns], plus two (the
// relay's and the pruner's). [PoolConns] computes it; [NewPool] applies it
// within the server's connection budget. A partition worker holds a
// connection only for its batch's transaction, so partitions past
// PartitionConns share the pool's connections.
type Service struct {
	cfg      Config
	pool     *pgxpool.Pool
	consumer *Consumer
	guard    *dedupe.Guard
	outbox   *outbox.Outbox
	log      *slog.Logger
	metrics  http.Handler
}

// PartitionConns is the most connections the pool-sizing rule
// ([PoolConns]) gives partition workers. A partition worker holds a
// connection only for its batch's transaction, and a database serves only
// so many transactions at once: past a few per core, more connections
// queue inside PostgreSQL instead of in the pool, and cost it memory and
// lock contention. Measured with `exactly bench -only partitions` (one
// process, PostgreSQL on 2 cores), 16 connections gave the best rate or
// within noise of it at 64 and 256 partitions, where one connection per
// partition was 1.5 to 2.3 times slower (docs/configuration.md, "Poolers
// and connection limits"). A database server with more cores may serve
// more: set pool_max_conns in the URL.
const PartitionConns = 16

// PoolConns is the pool size [Service] needs for an instance that works on
// up to partitions partitions at once: one connection per partition worker
// up to [PartitionConns], one for the outbox relay and one for the guard
// pruner. Set it as pgxpool.Config.MaxConns (pgxpool's default, 4 or the
// number of CPUs, makes workers wait), or let [NewPool] do it.
func PoolConns(partitions int) int32 { return int32(min(max(partitions, 1), PartitionConns)) + 2 }

// NewService checks the configuration and the handlers and builds a
// service: the consumer as [New] builds it (same options), dead letters
// going through the service's outbox unless [WithDeadLetters] says
// otherwise, and the relay and pruner. It fails like [New], and when the
// relay or the pruner cannot be built from cfg (a *dedupe.RetentionError
// for a retention shorter than the redelivery horizon). It fails with a
// [*ConfigError] naming Config.MetricsAddr (EXACTLY_METRICS_ADDR) when the
// metrics endpoint is half configured: an address without
// [WithMetricsHandler] (nothing would be served there) or the handler
// without an address. It connects to nothing.
func NewService(cfg Config, pool *pgxpool.Pool, opts ...Option) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	cfg = cfg.withDefaults()
	var probe Consumer
	for _, o := range opts {
		o(&probe)
	}
	ob := probe.outbox
	if ob == nil {
		ob = outbox.New()
		// The consumer knows the service's outbox, so that its batches
		// wake this relay in-process after COMMIT.
		opts = append([]Option{WithOutbox(ob)}, opts...)
	}
	if err := checkMetrics(cfg.MetricsAddr, probe.metricsHandler); err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	if probe.deadLetter == nil {
		// First, so that a WithDeadLetters in opts still wins.
		opts = append([]Option{WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix))}, opts...)
	}
	c, err := New(cfg, pool, opts...)
	if err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, pool: pool, consumer: c, guard: c.guard, outbox: ob, log: c.log, metrics: probe.metricsHandler}
	return s, nil
}

// checkMetrics returns a [*ConfigError] when the metrics endpoint is half
// configured: an address without a handler would serve nothing (the core
// has no handler of its own, so as not to link Prometheus), a handler
// without an address would never be served.
func checkMetrics(addr string, h http.Handler) error {
	switch {
	case addr != "" && h == nil:
		return &ConfigError{Problems: []FieldError{{Field: "Config.MetricsAddr", Reason: fmt.Sprintf(
			"is %q (EXACTLY_METRICS_ADDR) but no metrics handler was given, so nothing would be served there: "+
				"pass consumer.WithMetricsHandler(h), h being otelexport.Setup's MetricsHandler (otelexport.Config.Prometheus: true), "+
				"or unset EXACTLY_METRICS_ADDR", addr)}}}
	case addr == "" && h != nil:
		return &ConfigError{Problems: []FieldError{{Field: "Config.MetricsAddr", Reason: "must be set (EXACTLY_METRICS_ADDR) with WithMetricsHandler: it is the address the handler is served on"}}}
	}
	return nil
}

// Outbox returns the outbox the service relays and dead-letters through
// ([WithOutbox], or the default table).
func (s *Service) Outbox() *outbox.Outbox { return s.outbox }

// Guard returns the guard the service claims keys in (Config.GuardTable, or
// [WithGuard]).
func (s *Service) Guard() *dedupe.Guard { return s.guard }

// Migrate creates or upgrades the service's own tables, the guard table and
// the outbox table it is configured with (not the defaults), and returns
// the first error, wrapped with the table's name. It is safe to run from
// several instances at once. Handlers' own tables are the application's.
func (s *Service) Migrate(ctx context.Context) error {
	if err := s.guard.Migrate(ctx, s.pool); err != nil {
		return fmt.Errorf("consumer: migrating guard table %s: %w", s.guard.Table().Sanitize(), err)
	}
	if err := s.outbox.Migrate(ctx, s.pool); err != nil {
		return fmt.Errorf("consumer: migrating outbox table %s: %w", s.outbox.Table().Sanitize(), err)
	}
	return nil
}

// SchemaError reports a table of the consumer or the service that is
// missing or whose schema is older than this version of exactly needs. Run
// [Service.Migrate], the table's Migrate method (dedupe.Guard.Migrate,
// outbox.Outbox.Migrate) or `exactly migrate` first.
type SchemaError struct {
	// Table is the quoted table name.
	Table string
	// Current is the schema version recorded for it (0: never migrated, or
	// the table is missing); Latest is the version this build needs (0 when
	// the role may not read the migrations table). Current > Latest means a
	// newer build migrated the table: this one refuses to run on it.
	Current, Latest int
	// Missing is true when the table does not exist at all.
	Missing bool
}

// Error says what is wrong and what to run.
func (e *SchemaError) Error() string {
	if e.Missing {
		return fmt.Sprintf("table %s does not exist: run migrate first (Service.Migrate, the table's Migrate method or `exactly migrate`)", e.Table)
	}
	if e.Current > e.Latest {
		return fmt.Sprintf("table %s is at schema version %d, newer than this build knows (%d): a newer version of exactly migrated it, and this build would use it without what the newer schema requires (from guard version 9, checking the sealed generations before a claim): run the newer version",
			e.Table, e.Current, e.Latest)
	}
	return fmt.Sprintf("table %s is at schema version %d, this build needs %d: run migrate first (Service.Migrate, the table's Migrate method or `exactly migrate`)",
		e.Table, e.Current, e.Latest)
}

// CheckSchema fails with a [*SchemaError] when the guard or the outbox
// table is missing, behind, or ahead of this build (migrated by a newer
// one), and with a wrapped database error when it
// cannot tell. [Service.Run] calls it first, so a service never starts
// against tables it cannot use.
func (s *Service) CheckSchema(ctx context.Context) error {
	if err := s.consumer.checkSchema(ctx); err != nil {
		return err
	}
	return checkTable(ctx, s.pool, s.outbox.Table(), func() (int, int, error) { return s.outbox.SchemaVersion(ctx, s.pool) })
}

// checkTable fails with a [*SchemaError] when table does not exist or
// version reports it behind, and with a wrapped database error when it
// cannot tell. The recorded version is compared only when the role can read
// the migrations table: a least-privileged application role (see
// docs/database-roles.md) needs no grant on it, and its check is then only
// that the table exists.
func checkTable(ctx context.Context, pool *pgxpool.Pool, table pgx.Identifier, version func() (current, latest int, err error)) error {
	name := table.Sanitize()
	var exists, ledger, readable bool
	if err := pool.QueryRow(ctx, `select to_regclass($1) is not null, to_regclass($2) is not null,
	coalesce(has_table_privilege(to_regclass($2), 'select'), false)`,
		name, pgx.Identifier{migrate.TableName}.Sanitize()).Scan(&exists, &ledger, &readable); err != nil {
		return fmt.Errorf("consumer: looking up table %s: %w", name, err)
	}
	var cur, latest int
	if readable || !ledger { // without a migrations table, version reads nothing
		var err error
		if cur, latest, err = version(); err != nil {
			return fmt.Errorf("consumer: checking the schema of %s: %w", name, err)
		}
	}
	if !exists {
		return &SchemaError{Table: name, Current: 0, Latest: latest, Missing: true}
	}
	if readable && cur != latest {
		return &SchemaError{Table: name, Current: cur, Latest: latest}
	}
	return nil
}

// Run checks the schema ([Service.CheckSchema]), then runs the consumer,
// the relay, the pruner and the metrics endpoint (/metrics, /healthz,
// /readyz on Config.MetricsAddr) until ctx is cancelled or
// one of them fails; it returns nil after a cancellation and the first
// failure otherwise. Run may be called once.
//
// Shutdown runs in this order: the consumer stops fetching, finishes its
// in-flight transactions and commits their offsets; then the relay keeps
// publishing until the outbox is empty or Config.ShutdownTimeout passed;
// then the relay, the pruner and the metrics endpoint stop and the relay's
// client is closed. The pool is the caller's: close it after Run returns.
func (s *Service) Run(ctx context.Context) error {
	if err := s.CheckSchema(ctx); err != nil {
		return err
	}
	// The consumer's client options: SASL and TLS from the configuration,
	// then WithKafkaOptions.
	relay, err := outbox.NewRelay(s.pool, s.cfg.Brokers, outbox.RelayConfig{
		Outbox: s.outbox, KafkaOptions: s.consumer.kopts, Logger: s.log,
		TracerProvider: s.consumer.tp, MeterProvider: s.consumer.mp,
		ListenConnString: s.cfg.ListenDatabaseURL,
		Fence:            s.cfg.RelayFence,
	})
	if err != nil {
		return fmt.Errorf("consumer: building the outbox relay: %w", err)
	}
	defer relay.Close()
	pruned, err := telemetry.GuardPruned(s.consumer.mp, s.guard.Table().Sanitize())
	if err != nil {
		return fmt.Errorf("consumer: creating the pruner's metric: %w", err)
	}
	pruner, err := s.guard.NewPruner(s.pool, dedupe.PrunerConfig{
		Retention: s.cfg.GuardRetention, RedeliveryHorizon: s.cfg.RedeliveryHorizon, GenerationSpan: s.cfg.GuardGenerationSpan,
		AllowShortRetention: s.cfg.AllowShortRetention, OnPruned: pruned, Logger: s.log,
	})
	if err != nil {
		return fmt.Errorf("consumer: building the guard pruner: %w", err)
	}
	retention := s.cfg.GuardRetention
	if retention == 0 {
		retention = dedupe.DefaultRetention
	}
	guardAge, err := telemetry.ObserveGuard(s.consumer.mp, s.guard.Table().Sanitize(), retention, func(ctx context.Context) (time.Duration, error) {
		return s.guard.OldestAge(ctx, s.pool)
	})
	if err != nil {
		return fmt.Errorf("consumer: creating the guard table's metrics: %w", err)
	}
	defer func() { _ = guardAge.Unregister() }()
	dbUp, err := telemetry.ObserveDatabaseUp(s.consumer.mp, s.pool.Ping)
	if err != nil {
		return fmt.Errorf("consumer: creating the database's metric: %w", err)
	}
	defer func() { _ = dbUp.Unregister() }()
	var srv *http.Server
	var ln net.Listener
	if s.metrics != nil {
		if ln, err = net.Listen("tcp", s.cfg.MetricsAddr); err != nil {
			return fmt.Errorf("consumer: metrics endpoint on Config.MetricsAddr %q: %w", s.cfg.MetricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", s.metrics)
		s.healthHandlers(mux)
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		s.log.Info("serving metrics and health", "url", "http://"+ln.Addr().String()+"/metrics",
			"liveness", "http://"+ln.Addr().String()+"/healthz", "readiness", "http://"+ln.Addr().String()+"/readyz")
	}

	// The background services outlive the consumer's context: they stop
	// only after the consumer committed, and the relay only after it had
	// its chance to publish what the last transactions wrote.
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	consumerCtx, stopConsumer := context.WithCancel(ctx)
	defer stopConsumer()
	var g sync.WaitGroup
	var first error
	fail := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	errs := make(chan error, 3)
	g.Go(func() {
		if err := relay.Run(bg); err != nil {
			errs <- fmt.Errorf("consumer: outbox relay: %w", err)
		}
	})
	g.Go(func() {
		if err := pruner.Run(bg); err != nil && !errors.Is(err, context.Canceled) {
			errs <- fmt.Errorf("consumer: guard pruner: %w", err)
		}
	})
	if srv != nil {
		g.Go(func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errs <- fmt.Errorf("consumer: metrics endpoint: %w", err)
			}
		})
	}
	consumerDone := make(chan error, 1)
	go func() { consumerDone <- s.consumer.Run(consumerCtx) }()

	var consumerErr error
	select {
	case consumerErr = <-consumerDone:
	case err := <-errs:
		fail(err)
		stopConsumer()
		consumerErr = <-consumerDone
	}
	fail(consumerErr)
	if first == nil {
		s.drain(ctx)
	}
	stopBG()
	if srv != nil {
		_ = srv.Close()
	}
	g.Wait()
	close(errs)
	for err := range errs {
		fail(err)
	}
	return first
}

// drain waits, up to Config.ShutdownTimeout, until the outbox's backlog
// (the rows the relay will publish; parked rows wait for an operator) is
// empty, so the relay publishes what the consumer's last transactions
// wrote before it is stopped. Another instance's relay may be the active
// one; the wait is then simply bounded by the timeout.
func (s *Service) drain(ctx context.Context) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		n, _, err := s.outbox.Backlog(dctx, s.pool)
		if err == nil && n == 0 {
			return
		}
		select {
		case <-dctx.Done():
			s.log.Warn("shutdown: outbox rows left for the next relay", "rows", n, "timeout", s.cfg.ShutdownTimeout)
			return
		case <-t.C:
		}
	}
}
