package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
)

// On a healthy system — a consumer.Service (consumer, relay, pruner)
// applying a record every 20 ms as it arrives — `exactly status` exits 0
// and says "nothing needs a human" on every one of five runs (a record in
// flight at a sample is not a stall), and shows its relay active.
func TestStatusOnAHealthySystemExitsZeroEveryTime(t *testing.T) {
	url := testenv.DBURL(t)
	t.Setenv("DATABASE_URL", url)
	brokers := testenv.Brokers(testenv.Kafka(t, 2, "orders"))
	t.Setenv("EXACTLY_KAFKA_BROKERS", strings.Join(brokers, ","))
	var out bytes.Buffer
	if err := runMigrate(t.Context(), nil, &out); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out.String())
	}
	pool, err := poolFromDatabaseURL(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	h := handler.New("orders", handler.FromPayload(func(s string) string { return "order:" + s }),
		func(context.Context, pgx.Tx, handler.Message[string]) error { return nil })
	cfg := consumer.DefaultConfig()
	cfg.Brokers, cfg.Group, cfg.Topics = brokers, "orders-group", []string{"orders"}
	svc, err := consumer.NewService(cfg, pool, consumer.Handle(h), consumer.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("service: %v", err)
		}
	}()
	pcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer pcl.Close()
	trickled := make(chan struct{})
	go func() {
		defer close(trickled)
		for i := 0; ctx.Err() == nil; i++ {
			_ = pcl.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: fmt.Appendf(nil, `"o-%d"`, i)}).FirstErr()
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond): // a steady trickle, as producers send
			}
		}
	}()
	defer func() { stop(); <-trickled }()

	// The group has joined and committed before the runs.
	for deadline := time.Now().Add(60 * time.Second); ; {
		out.Reset()
		err := runStatus(t.Context(), []string{"-interval", "0"}, &out)
		if err == nil && strings.Contains(out.String(), `"orders-group"  state Stable`) && strings.Contains(out.String(), "relay (") &&
			!strings.Contains(out.String(), "NONE ACTIVE") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the service never showed up healthy: %v\n%s", err, out.String())
		}
		time.Sleep(100 * time.Millisecond) // polling, as an operator reruns status
	}
	for i := range 5 {
		out.Reset()
		if err := runStatus(t.Context(), []string{"-interval", "1s"}, &out); err != nil || !strings.Contains(out.String(), "nothing needs a human") {
			t.Errorf("run %d on a healthy system: %v\n%s", i, err, out.String())
		}
	}
}
