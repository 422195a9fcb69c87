// Command credit is the seed's credit_account job as a Kafka service built
// on exactly: it consumes credit commands, writes one ledger row per order
// however often a command is delivered, and emits account-credited events
// through the outbox, published by the relay it runs beside the consumer.
//
// Configuration comes from the environment (see the README's table). With
// DATABASE_URL unset it starts a private PostgreSQL, and with
// EXACTLY_KAFKA_BROKERS unset an embedded broker, so it runs anywhere:
//
//	go run ./examples/credit
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/examples/credit/credit"
	"github.com/exactly-go/exactly/internal/devenv"
	"github.com/exactly-go/exactly/internal/telemetry"
	"github.com/exactly-go/exactly/outbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		slog.Error("credit service failed", "error", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	cfg, err := consumer.ConfigFromEnv(ctx)
	if err != nil {
		return err
	}
	if len(cfg.Topics) == 0 {
		cfg.Topics = []string{credit.CommandsTopic}
	}
	env, err := devenv.Start(ctx, devenv.Options{DatabaseURL: cfg.DatabaseURL, Brokers: cfg.Brokers, Partitions: 6})
	if err != nil {
		return err
	}
	defer env.Close()
	cfg.DatabaseURL, cfg.Brokers = env.DatabaseURL, env.Brokers

	// Traces and metrics: OTLP per the OTEL_* variables, Prometheus on
	// EXACTLY_METRICS_ADDR; nothing is exported when neither is set.
	tel, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "credit", MetricsAddr: cfg.MetricsAddr})
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.WithoutCancel(ctx))
	slog.Info("telemetry", "export", tel.Describe())

	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("connecting to DATABASE_URL: %w", err)
	}
	defer pool.Close()

	svc := credit.New()
	if err := svc.Migrate(ctx, pool); err != nil {
		return err
	}
	ob := outbox.New()
	c, err := consumer.New(cfg, pool,
		consumer.Handle(svc.Handler()),
		consumer.WithTracerProvider(tel.TracerProvider), consumer.WithMeterProvider(tel.MeterProvider),
		consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)),
	)
	if err != nil {
		return err
	}
	kopts, err := cfg.KafkaOptions() // SASL and TLS, as the consumer uses them
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(pool, cfg.Brokers, outbox.RelayConfig{Outbox: ob, KafkaOptions: kopts,
		TracerProvider: tel.TracerProvider, MeterProvider: tel.MeterProvider})
	if err != nil {
		return err
	}
	defer relay.Close()

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return c.Run(ctx) })
	g.Go(func() error { return relay.Run(ctx) })
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
