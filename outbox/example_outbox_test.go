package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv/broker"
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
		return ob.AddJSON(ctx, tx, "payments", []byte("order-8812"), charged{"order-8812", 1200})
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

// ExampleDeadLetters dead-letters a record the way a consumer does
// (consumer.WithDeadLetters(outbox.DeadLetters(ob, ""))): in the record's
// transaction, through the outbox, to "<topic>.dlq" with headers saying why
// (the connection-string password in the error is redacted). It needs
// DATABASE_URL (set by the test harness) and uses an embedded Kafka broker.
func ExampleDeadLetters() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, ob, addrs, cleanup, err := exampleSetup(ctx, "orders.dlq")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cleanup()
	deadLetter := outbox.DeadLetters(ob, "")
	rec := handler.Record{Topic: "orders", Partition: 3, Offset: 42, Key: []byte("order-8812"), Value: []byte("\xff not json")}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return deadLetter(ctx, tx, rec, "credit", 1, errors.New("decoding: invalid character; db postgres://app:s3cret@db/x"))
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	relay, err := outbox.NewRelay(pool, addrs, outbox.RelayConfig{Outbox: ob, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer relay.Close()
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error)
	go func() { relayDone <- relay.Run(relayCtx) }()
	defer func() { stopRelay(); <-relayDone }()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics("orders.dlq"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			fmt.Println("nothing dead-lettered")
			return
		}
		for _, r := range fetches.Records() {
			for _, h := range []string{outbox.HeaderError, outbox.HeaderOriginalTopic, outbox.HeaderOriginalOffset} {
				v, _ := headerOf(r, h)
				fmt.Printf("%s: %s\n", h, v)
			}
			return
		}
	}
	// Output:
	// exactly-error: decoding: invalid character; db postgres://app:xxxxx@db/x
	// exactly-original-topic: orders
	// exactly-original-offset: 42
}

// ExampleReplay re-publishes one key's dead letters to their original topic;
// a truncated dead letter is refused. It uses an embedded Kafka broker.
func ExampleReplay() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kafka, err := broker.Start(ctx, broker.Options{Partitions: 1, Topics: []string{"orders", "orders.dlq"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer kafka.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.Addrs()...))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	dead := func(key, value string, truncated bool) *kgo.Record {
		r := &kgo.Record{Topic: "orders.dlq", Key: []byte(key), Value: []byte(value), Headers: []kgo.RecordHeader{
			{Key: outbox.HeaderMessageID, Value: []byte("id-" + value)},
			{Key: outbox.HeaderOriginalTopic, Value: []byte("orders")},
			{Key: outbox.HeaderError, Value: []byte("boom")},
		}}
		if truncated {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: outbox.HeaderTruncated, Value: []byte("true")})
		}
		return r
	}
	if err := cl.ProduceSync(ctx, dead("order-8812", "v1", false), dead("order-1", "v2", false), dead("order-8812", "v3", true)).FirstErr(); err != nil {
		fmt.Println(err)
		return
	}
	res, err := outbox.Replay(ctx, kafka.Addrs(), outbox.ReplayOptions{
		Topic: "orders.dlq",
		Key:   []byte("order-8812"),
		Since: time.Now().Add(-24 * time.Hour),
	})
	if err != nil {
		fmt.Println("replay:", err)
	}
	fmt.Printf("replayed %d of %d, %d filtered out, %d truncated refused\n", res.Replayed, res.Read, res.Filtered, res.Truncated)
	// Output:
	// replayed 1 of 3, 1 filtered out, 1 truncated refused
}

// exampleSetup connects to DATABASE_URL, starts an embedded broker with
// topics, and migrates an outbox in a schema of its own; cleanup undoes it.
func exampleSetup(ctx context.Context, topics ...string) (pool *pgxpool.Pool, ob *outbox.Outbox, addrs []string, cleanup func(), err error) {
	pool, err = pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return nil, nil, nil, nil, err
	}
	kafka, err := broker.Start(ctx, broker.Options{Partitions: 1, Topics: topics})
	if err != nil {
		pool.Close()
		return nil, nil, nil, nil, err
	}
	schema := fmt.Sprintf("example_%d", time.Now().UnixNano())
	cleanup = func() {
		pool.Exec(context.WithoutCancel(ctx), "drop schema if exists "+pgx.Identifier{schema}.Sanitize()+" cascade")
		kafka.Close()
		pool.Close()
	}
	ob = outbox.New(outbox.WithTable(schema, "outbox"))
	if err := ob.Migrate(ctx, pool); err != nil {
		cleanup()
		return nil, nil, nil, nil, err
	}
	return pool, ob, kafka.Addrs(), cleanup, nil
}
