package consumer_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv/broker"
)

// A consumer with one typed handler. The same credit command arrives three
// times; the ledger gets one row, and the other two deliveries are counted
// as duplicates in the same transactions.
func Example() {
	ctx := context.Background()
	pool := exampleDatabase(ctx, "example_consumer") // your pgxpool.New(ctx, cfg.DatabaseURL)
	defer pool.Close()
	b, err := broker.Start(ctx, broker.Options{Partitions: 3, Topics: []string{"credit-commands"}}) // your Kafka
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	if err := dedupe.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `create table ledger(account bigint, amount bigint)`); err != nil {
		log.Fatal(err)
	}
	credit := handler.New("credit",
		handler.FromPayload(func(c Credit) string { return dedupe.Key("credit", c.OrderID) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[Credit]) error {
			_, err := tx.Exec(ctx, `insert into ledger(account, amount) values ($1, $2)`, msg.Value.Account, msg.Value.Amount)
			return err
		})

	cfg, err := consumer.ConfigFromEnv(ctx) // EXACTLY_* and DATABASE_URL
	if err != nil {
		log.Fatal(err)
	}
	cfg.Brokers, cfg.Group, cfg.Topics = b.Addrs(), "credit-service", []string{"credit-commands"}
	outcomes := make(chan string, 3)
	c, err := consumer.New(cfg, pool, consumer.Handle(credit),
		consumer.WithHooks(consumer.Hooks{OnOutcome: func(_ context.Context, d consumer.OutcomeData) {
			outcomes <- string(d.Outcome)
		}}),
		consumer.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()

	// The same command, three times, on three partitions.
	prod, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		log.Fatal(err)
	}
	for p := int32(0); p < 3; p++ {
		rec := &kgo.Record{Topic: "credit-commands", Partition: p, Value: []byte(`{"order_id":"order-8812","account":7,"amount":100}`)}
		if err := prod.ProduceSync(ctx, rec).FirstErr(); err != nil {
			log.Fatal(err)
		}
	}
	prod.Close()

	// Wait for the three outcomes, then stop: Run finishes in-flight work,
	// commits offsets and leaves the group.
	for i := 0; i < 3; i++ {
		select {
		case <-outcomes:
		case <-time.After(30 * time.Second):
			log.Fatal("timed out waiting for the deliveries")
		}
	}
	stop()
	counts, err := dedupe.New().Outcomes(ctx, pool, "credit") // committed with the records
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("applied=%d duplicate=%d\n", counts.Applied, counts.Duplicate)
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	var rows int
	if err := pool.QueryRow(ctx, `select count(*) from ledger`).Scan(&rows); err != nil {
		log.Fatal(err)
	}
	fmt.Println("ledger rows:", rows)
	// Output:
	// applied=1 duplicate=2
	// ledger rows: 1
}

// exampleDatabase creates a fresh database on the server of DATABASE_URL
// (set by TestMain) and connects to it.
func exampleDatabase(ctx context.Context, name string) *pgxpool.Pool {
	admin, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close(ctx)
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := admin.Exec(ctx, `drop database if exists `+ident+` with (force)`); err != nil {
		log.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `create database `+ident); err != nil {
		log.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	return pool
}
