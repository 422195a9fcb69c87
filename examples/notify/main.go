// Command notify consumes the account-credited events that examples/credit
// emits through its outbox and records one notification per credit, keyed
// by the message-id header, so the relay's republishes are skipped.
//
// It uses only exactly's public API. Configuration comes from the
// environment (see docs/configuration.md); DATABASE_URL and
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
	"github.com/exactly-go/exactly/examples/notify/notify"
)

// eventsTopic is what examples/credit publishes to.
const eventsTopic = "account-credited"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		slog.Error("notify service failed", "error", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	cfg, err := consumer.ConfigFromEnv(ctx)
	if err != nil {
		return err
	}
	if len(cfg.Topics) == 0 {
		cfg.Topics = []string{eventsTopic}
	}
	if cfg.DatabaseURL == "" || len(cfg.Brokers) == 0 {
		return errors.New("set DATABASE_URL and EXACTLY_KAFKA_BROKERS (make up starts both)")
	}
	exp, err := otelexport.Setup(ctx, otelexport.Config{ServiceName: "notify", Prometheus: cfg.MetricsAddr != ""})
	if err != nil {
		return err
	}
	defer exp.Shutdown(context.WithoutCancel(ctx))

	pool, err := consumer.NewPool(ctx, cfg.DatabaseURL, 6) // six partition workers, the relay, the pruner
	if err != nil {
		return err
	}
	defer pool.Close()
	notifications := notify.New("", "")
	if err := notifications.Migrate(ctx, pool); err != nil {
		return err
	}
	opts := []consumer.Option{consumer.Handle(notifications.Handler()),
		consumer.WithTracerProvider(exp.TracerProvider), consumer.WithMeterProvider(exp.MeterProvider)}
	if exp.MetricsHandler != nil {
		opts = append(opts, consumer.WithMetricsHandler(exp.MetricsHandler))
	}
	// The relay beside the consumer publishes this service's dead letters.
	svc, err := consumer.NewService(cfg, pool, opts...)
	if err != nil {
		return err
	}
	if err := svc.Migrate(ctx); err != nil {
		return err
	}
	return svc.Run(ctx)
}
