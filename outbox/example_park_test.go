package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/outbox"
)

// ExampleMessageError shows Add refusing a message Kafka would refuse,
// before it touches the transaction (here nil), with an error that says
// what is wrong.
func ExampleMessageError() {
	ctx := context.Background()
	for _, msg := range []outbox.Message{
		{Topic: "orders/eu"},
		{Topic: strings.Repeat("t", 250)},
		{Topic: "orders", Value: make([]byte, 2<<20)},
	} {
		err := outbox.New().Add(ctx, nil, msg)
		var me *outbox.MessageError
		if errors.As(err, &me) {
			fmt.Println(me.Reason)
		}
	}
	// Output:
	// topic name has '/' at byte 6; Kafka allows only [a-zA-Z0-9._-]
	// topic name is 250 characters, over Kafka's 249
	// record is 2097291 bytes (key 0, value 2097152, 0 headers, with the relay's headers), over the 1048527-byte limit
}

// ExampleDeadLetterTopic shows the dead-letter topic of an ordinary topic and
// the legal fallback for one whose "<topic>.dlq" would exceed 249 characters.
func ExampleDeadLetterTopic() {
	fmt.Println(outbox.DeadLetterTopic("orders", ""))
	long := outbox.DeadLetterTopic(strings.Repeat("t", 249), "")
	fmt.Println(len(long), long[220:])
	// Output:
	// orders.dlq
	// 249 tttttttt-b401e3644885f679.dlq
}

// ExampleOutbox_Parked shows a row the relay cannot publish (over its
// MaxRecordBytes) parked while the next key flows, listed, fixed and
// released with Retry. It needs DATABASE_URL (set by the test harness) and
// uses an embedded Kafka broker.
func ExampleOutbox_Parked() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, ob, addrs, cleanup, err := exampleSetup(ctx, "payments")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cleanup()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := ob.Add(ctx, tx, outbox.Message{Topic: "payments", Key: []byte("order-1"), Value: make([]byte, 4000)}); err != nil {
			return err
		}
		return ob.Add(ctx, tx, outbox.Message{Topic: "payments", Key: []byte("order-2"), Value: []byte("small")})
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	published := make(chan int, 10)
	relay, err := outbox.NewRelay(pool, addrs, outbox.RelayConfig{
		Outbox:         ob,
		MaxRecordBytes: 1000,
		Logger:         slog.New(slog.DiscardHandler),
		Hooks:          outbox.RelayHooks{OnPublished: func(n int, _ []time.Duration) { published <- n }},
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

	fmt.Println("published", <-published) // order-2, past the parked order-1
	parked, err := ob.Parked(ctx, pool, outbox.ParkFilter{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, p := range parked {
		fmt.Printf("parked %s %s: %s\n", p.Topic, p.Key, p.Reason)
	}
	// The fix: the value was never meant to be that large.
	if _, err := pool.Exec(ctx, "update "+ob.Table().Sanitize()+" set value = 'small' where key = 'order-1'"); err != nil {
		fmt.Println(err)
		return
	}
	released, err := ob.Retry(ctx, pool, outbox.ParkFilter{Topic: "payments", Key: []byte("order-1")})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("released", len(released), "published", <-published)
	// Output:
	// published 1
	// parked payments order-1: record is 4127 bytes, over the 1000-byte limit for payments (MESSAGE_TOO_LARGE)
	// released 1 published 1
}
