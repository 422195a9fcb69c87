package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testenv/broker"
	"github.com/exactly-go/exactly/outbox"
)

// ExampleNewSharded spreads messages over three outbox tables, each
// published by its own relay: a key always lands in the same table, so its
// messages keep their commit order. It needs DATABASE_URL (set by the test
// harness) and uses an embedded Kafka broker.
func ExampleNewSharded() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	kafka, err := broker.Start(ctx, broker.Options{Partitions: 3, Topics: []string{"orders"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer kafka.Close()
	schema := fmt.Sprintf("example_%d", time.Now().UnixNano())
	defer pool.Exec(context.WithoutCancel(ctx), "drop schema "+pgx.Identifier{schema}.Sanitize()+" cascade")

	ob, err := outbox.NewSharded(3, outbox.WithTable(schema, "outbox"))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, o := range ob.Shards() {
		fmt.Println(o.Table()[1])
	}
	if err := ob.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, k := range []string{"order-1", "order-2", "order-3", "order-4"} {
			if err := ob.AddJSON(ctx, tx, "orders", []byte(k), map[string]string{"order": k}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// A key's shard is a function of the topic and key: order-1's row is in
	// the table Shard names.
	var inShard bool
	shard := ob.Shards()[ob.Shard("orders", []byte("order-1"))]
	if err := pool.QueryRow(ctx, "select exists (select from "+shard.Table().Sanitize()+" where key = $1)", []byte("order-1")).Scan(&inShard); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("order-1 in the shard Shard names", inShard)

	relay, err := outbox.NewShardedRelay(pool, kafka.Addrs(), ob, outbox.RelayConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer relay.Close()
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error)
	go func() { relayDone <- relay.Run(relayCtx) }()
	defer func() { stopRelay(); <-relayDone }()

	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.Addrs()...), kgo.ConsumeTopics("orders"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	var keys []string
	for len(keys) < 4 {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			fmt.Println("published", keys)
			return
		}
		fetches.EachRecord(func(r *kgo.Record) { keys = append(keys, string(r.Key)) })
	}
	slices.Sort(keys)
	fmt.Println("published", keys)
	// Output:
	// outbox_0
	// outbox_1
	// outbox_2
	// order-1 in the shard Shard names true
	// published [order-1 order-2 order-3 order-4]
}
