// Package service is the bootstrap the example services share: the
// configuration from the environment with the embedded defaults filled in
// (internal/devenv), telemetry from the OTEL_* variables, a database pool,
// the outbox with its relay, and running the consumer and the relay side by
// side until the context ends. What is specific to a service (its tables,
// its handlers) stays in its own main.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/runtime/telemetry"
	"github.com/exactly-go/exactly/internal/tools/devenv"
	"github.com/exactly-go/exactly/outbox"
)

// Options name a service and its topics.
type Options struct {
	// Name is the service name of its traces and metrics.
	Name string
	// DefaultTopics are consumed when EXACTLY_TOPICS is unset.
	DefaultTopics []string
	// EmbeddedTopics are created on the embedded broker (when
	// EXACTLY_KAFKA_BROKERS is unset), with 6 partitions.
	EmbeddedTopics []string
}

// Service is a started bootstrap. Close it when done.
type Service struct {
	// Config is the consumer configuration, DatabaseURL and Brokers filled
	// in with the embedded ones when unset.
	Config consumer.Config
	// Env tells what was started for the service.
	Env *devenv.Env
	// Pool is the service's database pool.
	Pool *pgxpool.Pool
	// Telemetry holds the tracer and meter providers.
	Telemetry *telemetry.Telemetry
	// Outbox is the service's outbox (migrated): its events and its dead
	// letters.
	Outbox *outbox.Outbox

	closers []func()
}

// Start reads the configuration (failing with the variable's name on a bad
// value), starts what is not configured, sets up telemetry, connects and
// migrates the outbox. Whatever it started is stopped again when it fails.
func Start(ctx context.Context, opts Options) (s *Service, err error) {
	s = &Service{}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.Config, err = consumer.ConfigFromEnv(ctx); err != nil {
		return nil, err
	}
	if len(s.Config.Topics) == 0 {
		s.Config.Topics = opts.DefaultTopics
	}
	s.Env, err = devenv.Start(ctx, devenv.Options{DatabaseURL: s.Config.DatabaseURL, Brokers: s.Config.Brokers,
		Partitions: 6, Topics: opts.EmbeddedTopics})
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func() { _ = s.Env.Close() })
	s.Config.DatabaseURL, s.Config.Brokers = s.Env.DatabaseURL, s.Env.Brokers

	// Traces and metrics: OTLP per the OTEL_* variables, Prometheus on
	// EXACTLY_METRICS_ADDR; nothing is exported when neither is set.
	if s.Telemetry, err = telemetry.Setup(ctx, telemetry.Config{ServiceName: opts.Name, MetricsAddr: s.Config.MetricsAddr}); err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func() { _ = s.Telemetry.Shutdown(context.WithoutCancel(ctx)) })
	slog.Info("telemetry", "service", opts.Name, "export", s.Telemetry.Describe())

	pcfg, err := pgxpool.ParseConfig(s.Config.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("parsing DATABASE_URL: %w", err)
	}
	// One connection per partition worker (6 partitions here) plus the
	// relay's and the pruner's, unless DATABASE_URL sets pool_max_conns:
	// pgxpool's default (4 on two cores) would make workers wait.
	if !strings.Contains(s.Config.DatabaseURL, "pool_max_conns") {
		pcfg.MaxConns = max(pcfg.MaxConns, 10)
	}
	if s.Pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return nil, fmt.Errorf("connecting to DATABASE_URL: %w", err)
	}
	s.closers = append(s.closers, s.Pool.Close)
	s.Outbox = outbox.New()
	if err := s.Outbox.Migrate(ctx, s.Pool); err != nil {
		return nil, err
	}
	return s, nil
}

// Close stops what Start started, in reverse order.
func (s *Service) Close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// Run builds the consumer with the handlers in opts (and the service's
// telemetry and dead letters), and runs it beside the outbox relay and the
// guard pruner until ctx ends or one fails. It fails when the consumer or the relay cannot be
// built, and with the first error of either.
func (s *Service) Run(ctx context.Context, opts ...consumer.Option) error {
	copts := append([]consumer.Option{
		consumer.WithTracerProvider(s.Telemetry.TracerProvider),
		consumer.WithMeterProvider(s.Telemetry.MeterProvider),
		consumer.WithDeadLetters(outbox.DeadLetters(s.Outbox, s.Config.DeadLetterSuffix)),
	}, opts...)
	c, err := consumer.New(s.Config, s.Pool, copts...)
	if err != nil {
		return err
	}
	kopts, err := s.Config.KafkaOptions() // SASL and TLS, as the consumer uses them
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(s.Pool, s.Config.Brokers, outbox.RelayConfig{Outbox: s.Outbox, KafkaOptions: kopts,
		TracerProvider: s.Telemetry.TracerProvider, MeterProvider: s.Telemetry.MeterProvider})
	if err != nil {
		return err
	}
	defer relay.Close()
	// Guard retention: one pruner active per table across all instances.
	schema, table := consumer.SplitTable(s.Config.GuardTable)
	guard := dedupe.New(dedupe.WithTable(schema, table))
	pruned, err := telemetry.GuardPruned(s.Telemetry.MeterProvider, guard.Table().Sanitize())
	if err != nil {
		return err
	}
	pruner, err := guard.NewPruner(s.Pool, dedupe.PrunerConfig{
		Retention: s.Config.GuardRetention, RedeliveryHorizon: s.Config.RedeliveryHorizon,
		AllowShortRetention: s.Config.AllowShortRetention, OnPruned: pruned,
	})
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return c.Run(ctx) })
	g.Go(func() error { return relay.Run(ctx) })
	g.Go(func() error { return pruner.Run(ctx) })
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// KafkaOptions are the client options a producer of the service uses (SASL
// and TLS from the configuration, and tracing).
func (s *Service) KafkaOptions() ([]kgo.Opt, error) {
	kopts, err := s.Config.KafkaOptions()
	if err != nil {
		return nil, err
	}
	return append(kopts, telemetry.KafkaTracing(s.Telemetry.TracerProvider, s.Telemetry.MeterProvider)), nil
}
