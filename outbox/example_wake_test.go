package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/outbox"
)

// ExampleOutbox_Wake adds a message outside a consumer and wakes the relay
// once the transaction has committed. The relay polls only hourly here, so
// the wake-up is what gets the message published at once.
func ExampleOutbox_Wake() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, ob, addrs, cleanup, err := exampleSetup(ctx, "payments")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cleanup()

	polled := make(chan struct{}, 1)
	relay, err := outbox.NewRelay(pool, addrs, outbox.RelayConfig{
		Outbox:       ob, // the same value the writer wakes
		PollInterval: time.Hour,
		Logger:       slog.New(slog.DiscardHandler),
		Hooks: outbox.RelayHooks{OnPoll: func(int) {
			select {
			case polled <- struct{}{}:
			default:
			}
		}},
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
	<-polled // the relay read the empty table and now waits

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return ob.Add(ctx, tx, outbox.Message{Topic: "payments", Key: []byte("order-8812"), Value: []byte("charged")})
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ob.Wake(pool) // after COMMIT, never inside the transaction

	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics("payments"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	wakeCtx, cancelWake := context.WithTimeout(ctx, 10*time.Second)
	defer cancelWake()
	for {
		fetches := cl.PollFetches(wakeCtx)
		if wakeCtx.Err() != nil {
			fmt.Println("nothing published within 10s")
			return
		}
		if recs := fetches.Records(); len(recs) > 0 {
			fmt.Printf("%s %s %s\n", recs[0].Topic, recs[0].Key, recs[0].Value)
			return
		}
	}
	// Output: payments order-8812 charged
}
