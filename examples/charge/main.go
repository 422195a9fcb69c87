// Command charge is the seed's charge_order job as a Kafka service built on
// exactly: it consumes charge commands and charges each order once through
// a payment provider's API, passing "charge:<order id>" as the
// Idempotency-Key and storing the charge id in the charges table in the
// same transaction as the guard row. It also consumes refund commands and
// refunds through the provider's legacy endpoint, which has no idempotency
// keys, with the started/done state machine and a reconcile lookup.
//
// With PAYMENTS_URL unset it starts the fake provider of package payments on
// a loopback port; with DATABASE_URL unset a private PostgreSQL; with
// EXACTLY_KAFKA_BROKERS unset an embedded broker, into which it produces a
// few charge commands, each twice, so that a plain run shows one charge per
// order:
//
//	go run ./examples/charge
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/examples/charge/charge"
	"github.com/exactly-go/exactly/examples/charge/payments"
	"github.com/exactly-go/exactly/internal/tools/service"
)

// demoOrders is how many orders the embedded-broker run charges.
const demoOrders = 5

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		slog.Error("charge service failed", "error", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	svc, err := service.Start(ctx, service.Options{Name: "charge",
		EmbeddedTopics: []string{charge.CommandsTopic, charge.RefundsTopic}})
	if err != nil {
		return err
	}
	defer svc.Close()

	paymentsURL := os.Getenv("PAYMENTS_URL")
	if paymentsURL == "" {
		srv, err := payments.Start()
		if err != nil {
			return err
		}
		defer func() {
			st := srv.Stats()
			slog.Info("fake payment provider", "charges", len(srv.Charges()), "charge_requests", st.ChargeRequests,
				"idempotent_replays", st.Replays, "refunds", len(srv.Refunds()))
			_ = srv.Close()
		}()
		paymentsURL = srv.URL()
		slog.Info("PAYMENTS_URL unset: started the fake payment provider", "url", paymentsURL)
	}

	// The refund handler commits "started" outside its transaction: a
	// separate small pool, so that it never waits for a connection the
	// consumer's workers hold.
	effectsPool, err := pgxpool.New(ctx, svc.Config.DatabaseURL)
	if err != nil {
		return fmt.Errorf("connecting to DATABASE_URL: %w", err)
	}
	defer effectsPool.Close()

	charges := charge.New(&payments.Client{BaseURL: paymentsURL})
	if err := charges.Migrate(ctx, svc.Pool); err != nil {
		return err
	}
	if svc.Env.EmbeddedBroker {
		if err := produceDemo(ctx, svc.Config.Brokers); err != nil {
			return err
		}
		slog.Info("produced demo charge commands", "orders", demoOrders, "copies", 2)
	}
	return svc.Run(ctx,
		consumer.Handle(charges.Handler(), charge.CommandsTopic),
		consumer.Handle(charges.RefundHandler(effectsPool), charge.RefundsTopic))
}

// produceDemo sends every demo order's charge command twice.
func produceDemo(ctx context.Context, brokers []string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	var recs []*kgo.Record
	for i := range demoOrders {
		v, err := json.Marshal(charge.Command{OrderID: "order-" + strconv.Itoa(i+1), Amount: 1000 + int64(i)})
		if err != nil {
			return err
		}
		for range 2 {
			recs = append(recs, &kgo.Record{Topic: charge.CommandsTopic, Value: v})
		}
	}
	return cl.ProduceSync(ctx, recs...).FirstErr()
}
