// Command wallet consumes deposit and transfer commands from one topic,
// wallet-commands, choosing the handler by each record's "type" header
// (package wallet). It uses only exactly's public API. Configuration comes
// from the environment (see docs/configuration.md); DATABASE_URL and
// EXACTLY_KAFKA_BROKERS are required.
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
	"github.com/exactly-go/exactly/examples/wallet/wallet"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		slog.Error("wallet service failed", "error", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	cfg, err := consumer.ConfigFromEnv(ctx)
	if err != nil {
		return err
	}
	if cfg.DatabaseURL == "" || len(cfg.Brokers) == 0 {
		return errors.New("set DATABASE_URL and EXACTLY_KAFKA_BROKERS (`go run ./cmd/exactly dev` starts both and prints them)")
	}
	// Traces go to OTEL_EXPORTER_OTLP_ENDPOINT and metrics are served on
	// EXACTLY_METRICS_ADDR; nothing is exported when neither is set.
	exp, err := otelexport.Setup(ctx, otelexport.Config{ServiceName: "wallet", Prometheus: cfg.MetricsAddr != ""})
	if err != nil {
		return err
	}
	defer exp.Shutdown(context.WithoutCancel(ctx))

	pool, err := consumer.NewPool(ctx, cfg.DatabaseURL, 6)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := wallet.Migrate(ctx, pool); err != nil {
		return err
	}
	opts := []consumer.Option{consumer.Handle(wallet.Router(), wallet.CommandsTopic),
		consumer.WithTracerProvider(exp.TracerProvider), consumer.WithMeterProvider(exp.MeterProvider)}
	if exp.MetricsHandler != nil {
		opts = append(opts, consumer.WithMetricsHandler(exp.MetricsHandler))
	}
	svc, err := consumer.NewService(cfg, pool, opts...)
	if err != nil {
		return err
	}
	if err := svc.Migrate(ctx); err != nil {
		return err
	}
	return svc.Run(ctx)
}
