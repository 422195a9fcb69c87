// Command notify consumes the account-credited events that examples/credit
// emits through its outbox and records one notification per credit, keyed
// by the message-id header, so the relay's republishes are skipped.
//
// Configuration comes from the environment (see the README's table); with
// DATABASE_URL or EXACTLY_KAFKA_BROKERS unset it starts embedded ones.
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/examples/credit/credit"
	"github.com/exactly-go/exactly/examples/notify/notify"
	"github.com/exactly-go/exactly/internal/tools/service"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		slog.Error("notify service failed", "error", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	svc, err := service.Start(ctx, service.Options{Name: "notify", DefaultTopics: []string{credit.EventsTopic}})
	if err != nil {
		return err
	}
	defer svc.Close()
	notifications := notify.New("", "")
	if err := notifications.Migrate(ctx, svc.Pool); err != nil {
		return err
	}
	// The relay beside the consumer publishes this service's dead letters.
	return svc.Run(ctx, consumer.Handle(notifications.Handler()))
}
