// Command charge is the charge_order job of *Making Background Jobs
// Idempotent* as a Kafka service built on
// exactly: it consumes charge commands and charges each order once through
// a payment provider's API, passing "charge:<order id>" as the
// Idempotency-Key and storing the charge id in the charges table in the
// same transaction as the guard row. It also consumes refund commands and
// refunds through the provider's legacy endpoint, which has no idempotency
// keys, with the started/done state machine and a reconcile lookup.
//
// With PAYMENTS_URL unset it starts the fake provider of package payments on
// a loopback port. DATABASE_URL and EXACTLY_KAFKA_BROKERS are required; with
// -produce-demo it first produces a few charge commands, each twice, so that
// a run shows one charge per order:
//
//	go run ./examples/charge -produce-demo
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/consumer/otelexport"
	"github.com/exactly-go/exactly/examples/charge/charge"
	"github.com/exactly-go/exactly/examples/charge/payments"
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
	produce := flag.Bool("produce-demo", false, "produce a few charge commands, each twice, before consuming")
	flag.Parse()
	cfg, err := consumer.ConfigFromEnv(ctx)
	if err != nil {
		return err
	}
	if cfg.DatabaseURL == "" || len(cfg.Brokers) == 0 {
		return errors.New("set DATABASE_URL and EXACTLY_KAFKA_BROKERS (`go run ./cmd/exactly dev` starts both and prints them)")
	}
	exp, err := otelexport.Setup(ctx, otelexport.Config{ServiceName: "charge", Prometheus: cfg.MetricsAddr != ""})
	if err != nil {
		return err
	}
	defer exp.Shutdown(context.WithoutCancel(ctx))
	pool, err := consumer.NewPool(ctx, cfg.DatabaseURL, 12) // six partition workers for each of its two topics, the relay, the pruner
	if err != nil {
		return err
	}
	defer pool.Close()

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
	effectsPool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("connecting to DATABASE_URL: %w", err)
	}
	defer effectsPool.Close()

	charges := charge.New(&payments.Client{BaseURL: paymentsURL})
	if err := charges.Migrate(ctx, pool); err != nil {
		return err
	}
	opts := []consumer.Option{
		consumer.Handle(charges.Handler(), charge.CommandsTopic),
		consumer.Handle(charges.RefundHandler(effectsPool), charge.RefundsTopic),
		consumer.WithTracerProvider(exp.TracerProvider), consumer.WithMeterProvider(exp.MeterProvider),
	}
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
	if *produce {
		kopts, err := cfg.KafkaOptions()
		if err != nil {
			return err
		}
		if err := produceDemo(ctx, cfg.Brokers, kopts); err != nil {
			return err
		}
		slog.Info("produced demo charge commands", "orders", demoOrders, "copies", 2)
	}
	return svc.Run(ctx)
}

// produceDemo sends every demo order's charge command twice.
func produceDemo(ctx context.Context, brokers []string, kopts []kgo.Opt) error {
	// A fresh broker (`exactly dev`) has no topics yet: the client asks
	// for the commands topic to be created rather than wait for it.
	cl, err := kgo.NewClient(append(kopts, kgo.SeedBrokers(brokers...), kgo.AllowAutoTopicCreation())...)
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
