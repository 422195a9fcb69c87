// Command shipping consumes Protobuf commands framed in the Confluent
// Schema Registry wire format and emits Protobuf events through the
// outbox (see package shipping). Configuration comes from the environment
// (see docs/configuration.md), plus SCHEMA_REGISTRY_URL:
//
//	DATABASE_URL=postgres://… EXACTLY_KAFKA_BROKERS=127.0.0.1:9092 \
//	SCHEMA_REGISTRY_URL=http://127.0.0.1:8081 go run ./examples/shipping
//
// The messages are in shippb/shipping.proto; docs/codecs.md says how the
// codecs behave when the registry or a record is at fault.
package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/examples/shipping/shipping"
	"github.com/exactly-go/exactly/handler/schemaregistry"
	"github.com/exactly-go/exactly/outbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		slog.Error("shipping service failed", "error", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	cfg, err := consumer.ConfigFromEnv(ctx)
	if err != nil {
		return err
	}
	if len(cfg.Topics) == 0 {
		cfg.Topics = []string{shipping.CommandsTopic}
	}
	url := os.Getenv("SCHEMA_REGISTRY_URL")
	if cfg.DatabaseURL == "" || len(cfg.Brokers) == 0 || url == "" {
		return errors.New("set DATABASE_URL, EXACTLY_KAFKA_BROKERS and SCHEMA_REGISTRY_URL")
	}
	reg, err := schemaregistry.Dial(url)
	if err != nil {
		return err
	}
	pool, err := consumer.NewPool(ctx, cfg.DatabaseURL, 6)
	if err != nil {
		return err
	}
	defer pool.Close()
	ob := outbox.New()
	svc := shipping.New(reg, ob)
	if err := svc.Migrate(ctx, pool); err != nil {
		return err
	}
	s, err := consumer.NewService(cfg, pool, consumer.Handle(svc.Handler()), consumer.WithOutbox(ob))
	if err != nil {
		return err
	}
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	return s.Run(ctx)
}
