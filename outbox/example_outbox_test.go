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

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
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

// ExampleDeadLetters wires dead letters into a consumer: a record that
// cannot be decoded goes to "<topic>.dlq" through the outbox, in the
// transaction that lets its offset advance, with headers saying where it
// came from and why. It needs DATABASE_URL and uses an embedded broker.
func ExampleDeadLetters() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	kafka, err := broker.Start(ctx, broker.Options{Partitions: 1, Topics: []string{"orders", "orders.dlq"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer kafka.Close()
	// Tables of its own, so the example leaves nothing behind.
	schema := fmt.Sprintf("example_%d", time.Now().UnixNano())
	defer pool.Exec(context.WithoutCancel(ctx), "drop schema "+pgx.Identifier{schema}.Sanitize()+" cascade")
	ob := outbox.New(outbox.WithTable(schema, "outbox"))
	guard := dedupe.New(dedupe.WithTable(schema, "guard"))
	if err := errors.Join(ob.Migrate(ctx, pool), guard.Migrate(ctx, pool)); err != nil {
		fmt.Println(err)
		return
	}

	type charge struct {
		Order string `json:"order"`
	}
	charges := handler.New("charge",
		handler.FromPayload(func(c charge) string { return dedupe.Key("charge", c.Order) }),
		func(context.Context, pgx.Tx, handler.Message[charge]) error { return nil })
	cfg := consumer.DefaultConfig() // usually consumer.ConfigFromEnv
	cfg.Brokers, cfg.Group, cfg.Topics = kafka.Addrs(), "billing", []string{"orders"}
	c, err := consumer.New(cfg, pool, consumer.Handle(charges), consumer.WithGuard(guard),
		consumer.WithDeadLetters(outbox.DeadLetters(ob, outbox.DefaultDeadLetterSuffix)),
		consumer.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		fmt.Println(err)
		return
	}
	relay, err := outbox.NewRelay(pool, kafka.Addrs(), outbox.RelayConfig{Outbox: ob, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer relay.Close()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- c.Run(runCtx) }()
	go func() { done <- relay.Run(runCtx) }()
	defer func() { stop(); <-done; <-done }()

	// A record that is not JSON: it cannot be decoded, so no attempt can
	// succeed and it is dead-lettered at once.
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.Addrs()...), kgo.ConsumeTopics("orders.dlq"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "orders", Key: []byte("order-8812"), Value: []byte("{not json")}).FirstErr(); err != nil {
		fmt.Println(err)
		return
	}
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			fmt.Println("no dead letter")
			return
		}
		if recs := fetches.Records(); len(recs) > 0 {
			r := recs[0]
			h := func(name string) string { v, _ := headerOf(r, name); return string(v) }
			fmt.Printf("%s %s %s\n", r.Topic, r.Key, r.Value)
			fmt.Printf("from %s/%s@%s, handler %s, attempts %s, has error: %v\n",
				h(outbox.HeaderOriginalTopic), h(outbox.HeaderOriginalPartition), h(outbox.HeaderOriginalOffset),
				h(outbox.HeaderHandler), h(outbox.HeaderAttempts), h(outbox.HeaderError) != "")
			return
		}
	}
	// Output:
	// orders.dlq order-8812 {not json
	// from orders/0@0, handler charge, attempts 1, has error: true
}

// ExampleReplay re-publishes one key's dead letters from the last day to
// their original topic, without the dead-letter headers. It uses an
// embedded broker.
func ExampleReplay() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kafka, err := broker.Start(ctx, broker.Options{Partitions: 1, Topics: []string{"orders", "orders.dlq"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer kafka.Close()
	brokers := kafka.Addrs()

	// Two dead letters, as outbox.DeadLetters writes them.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("orders"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	now := []byte(time.Now().UTC().Format(time.RFC3339Nano))
	var dead []*kgo.Record
	for _, key := range []string{"order-8812", "order-7001"} {
		dead = append(dead, &kgo.Record{Topic: "orders.dlq", Key: []byte(key), Value: []byte(`{"order":"` + key + `"}`),
			Headers: []kgo.RecordHeader{
				{Key: outbox.HeaderOriginalTopic, Value: []byte("orders")},
				{Key: outbox.HeaderError, Value: []byte("payment service unavailable")},
				{Key: outbox.HeaderDeadLetteredAt, Value: now},
			}})
	}
	if err := cl.ProduceSync(ctx, dead...).FirstErr(); err != nil {
		fmt.Println(err)
		return
	}

	res, err := outbox.Replay(ctx, brokers, outbox.ReplayOptions{
		Topic: "orders.dlq",
		Key:   []byte("order-8812"),
		Since: time.Now().Add(-24 * time.Hour),
	})
	if err != nil {
		fmt.Println("replay:", err)
		return
	}
	fmt.Printf("replayed %d of %d (%d filtered)\n", res.Replayed, res.Read, res.Filtered)

	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			fmt.Println("nothing replayed")
			return
		}
		if recs := fetches.Records(); len(recs) > 0 {
			r := recs[0]
			_, hasError := headerOf(r, outbox.HeaderError)
			fmt.Printf("%s %s %s dead-letter headers:%v\n", r.Topic, r.Key, r.Value, hasError)
			return
		}
	}
	// Output:
	// replayed 1 of 2 (1 filtered)
	// orders order-8812 {"order":"order-8812"} dead-letter headers:false
}
