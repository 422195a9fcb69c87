package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/tools/broker"
	"github.com/exactly-go/exactly/outbox"
)

// Example adds a message inside a transaction and lets a relay publish it
// after the commit. It needs DATABASE_URL (set by the test harness) and uses
// an embedded Kafka broker.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	kafka, err := broker.Start(ctx, broker.Options{Partitions: 1, Topics: []string{"payments"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer kafka.Close()

	// A table of its own, so the example leaves nothing behind.
	schema := fmt.Sprintf("example_%d", time.Now().UnixNano())
	defer pool.Exec(context.WithoutCancel(ctx), "drop schema "+pgx.Identifier{schema}.Sanitize()+" cascade")
	ob := outbox.New(outbox.WithTable(schema, "outbox"))
	if err := ob.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}

	// The handler's transaction: its own writes, then the message.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		type charged struct {
			Order  string `json:"order"`
			Amount int    `json:"amount"`
		}
		return outbox.AddJSON(ctx, ob, tx, "payments", []byte("order-8812"), charged{"order-8812", 1200})
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	relay, err := outbox.NewRelay(pool, kafka.Addrs(), outbox.RelayConfig{
		Outbox: ob,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer relay.Close()
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error)
	go func() { relayDone <- relay.Run(relayCtx) }()
	defer func() { stopRelay(); <-relayDone }()

	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.Addrs()...), kgo.ConsumeTopics("payments"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			fmt.Println("nothing published")
			return
		}
		if recs := fetches.Records(); len(recs) > 0 {
			r := recs[0]
			_, hasID := headerOf(r, outbox.HeaderMessageID)
			fmt.Printf("%s %s %s message-id:%v\n", r.Topic, r.Key, r.Value, hasID)
			return
		}
	}
	// Output: payments order-8812 {"order":"order-8812","amount":1200} message-id:true
}

func headerOf(r *kgo.Record, name string) ([]byte, bool) {
	for _, h := range r.Headers {
		if h.Key == name {
			return h.Value, true
		}
	}
	return nil, false
}

// ExampleDeadLetters wires dead letters into a consumer: records that cannot
// be decoded or keep failing go to "<topic>.dlq" through the outbox, in the
// transaction that lets their offset advance.
func ExampleDeadLetters() {
	var cfg consumer.Config // usually consumer.ConfigFromEnv
	var pool *pgxpool.Pool
	_ = func() (*consumer.Consumer, error) {
		return consumer.New(cfg, pool,
			consumer.WithDeadLetters(outbox.DeadLetters(nil, outbox.DefaultDeadLetterSuffix)))
	}
}

// ExampleReplay re-publishes one key's dead letters from the last day.
func ExampleReplay() {
	run := func(ctx context.Context, brokers []string) {
		res, err := outbox.Replay(ctx, brokers, outbox.ReplayOptions{
			Topic: "orders.dlq",
			Key:   []byte("order-8812"),
			Since: time.Now().Add(-24 * time.Hour),
		})
		if err != nil {
			fmt.Println("replay:", err)
		}
		fmt.Printf("replayed %d of %d\n", res.Replayed, res.Read)
	}
	_ = run
}
