// Command credit is the credit_account job of *Making Background Jobs
// Idempotent* as a Kafka service built on exactly: it consumes credit
// commands, writes one ledger row per order however often a command is
// delivered, and emits account-credited events through the outbox,
// published by the relay that consumer.Service runs beside the consumer.
//
// It uses only exactly's public API, so it can be copied as the start of a
// service. Configuration comes from the environment (see
// docs/configuration.md); DATABASE_URL and EXACTLY_KAFKA_BROKERS are required (`make up`
// starts both; `go run ./cmd/exactly dev` starts a development broker):
//
//	DATABASE_URL=postgres://… EXACTLY_KAFKA_BROKERS=127.0.0.1:9092 go run ./examples/credit
package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/consumer/otelexport"
	"github.com/exactly-go/exactly/examples/credit/credit"
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
	if cfg.DatabaseURL == "" || len(cfg.Brokers) == 0 {
		return errors.New("set DATABASE_URL and EXACTLY_KAFKA_BROKERS (make up starts both)")
	}
	// Traces and metrics: OTLP per the OTEL_* variables, Prometheus on
	// EXACTLY_METRICS_ADDR; nothing is exported when neither is set.
	exp, err := otelexport.Setup(ctx, otelexport.Config{ServiceName: "credit", Prometheus: cfg.MetricsAddr != ""})
	if err != nil {
		return err
	}
	defer exp.Shutdown(context.WithoutCancel(ctx))
	slog.Info("telemetry", "export", exp.Describe())

	pool, err := consumer.NewPool(ctx, cfg.DatabaseURL, 6) // six partition workers, the relay, the pruner
	if err != nil {
		return err
	}
	defer pool.Close()

	ob := outbox.New()
	credits := credit.New(credit.WithOutbox(ob))
	if err := credits.Migrate(ctx, pool); err != nil { // the ledger table
		return err
	}
	opts := []consumer.Option{
		consumer.Handle(credits.Handler()),
		consumer.WithOutbox(ob),
		consumer.WithTracerProvider(exp.TracerProvider),
		consumer.WithMeterProvider(exp.MeterProvider),
	}
	if exp.MetricsHandler != nil {
		opts = append(opts, consumer.WithMetricsHandler(exp.MetricsHandler))
	}
	svc, err := consumer.NewService(cfg, pool, opts...)
	if err != nil {
		return err
	}
	if err := svc.Migrate(ctx); err != nil { // guard and outbox tables
		return err
	}
	return svc.Run(ctx)
}
