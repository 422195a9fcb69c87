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
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/examples/credit/credit"
	"github.com/exactly-go/exactly/internal/tools/service"
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
	// Configuration, embedded defaults, telemetry, pool and outbox.
	svc, err := service.Start(ctx, service.Options{Name: "credit", DefaultTopics: []string{credit.CommandsTopic}})
	if err != nil {
		return err
	}
	defer svc.Close()

	credits := credit.New(credit.WithOutbox(svc.Outbox))
	if err := credits.Migrate(ctx, svc.Pool); err != nil { // ledger and guard tables
		return err
	}
	// The consumer runs the handler (guard row, ledger row and the
	// account-credited outbox row in one transaction); the relay beside it
	// publishes the outbox.
	return svc.Run(ctx, consumer.Handle(credits.Handler()))
}
