package shipping_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/examples/shipping/shippb"
	"github.com/exactly-go/exactly/examples/shipping/shipping"
	"github.com/exactly-go/exactly/handler/schemaregistry"
	"github.com/exactly-go/exactly/handler/schemaregistry/srtest"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// Three orders, each command sent twice: three shipments, three
// duplicates, and one OrderShipped event per order, Protobuf in the wire
// format, counting the parcels.
func TestShipsEachOrderOnce(t *testing.T) {
	ctx := context.Background()
	reg := srtest.New()
	defer reg.Close()
	r, err := schemaregistry.Dial(reg.URL())
	if err != nil {
		t.Fatal(err)
	}
	brokers := testenv.Brokers(testenv.Kafka(t, 2, shipping.CommandsTopic))
	pool := testenv.DB(t)
	ob := outbox.New()
	svc := shipping.New(r, ob)
	if err := svc.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	var applied, dups atomic.Int64
	ended := make(chan struct{}, 64) // one per outcome
	cfg := consumer.DefaultConfig()
	cfg.Brokers, cfg.Group, cfg.Topics = brokers, "shipping", []string{shipping.CommandsTopic}
	cfg.CommitInterval = 100 * time.Millisecond
	s, err := consumer.NewService(cfg, pool, consumer.Handle(svc.Handler()), consumer.WithOutbox(ob),
		consumer.WithHooks(consumer.Hooks{OnOutcome: func(_ context.Context, d consumer.OutcomeData) {
			switch d.Outcome {
			case dedupe.Applied:
				applied.Add(1)
			case dedupe.Duplicate:
				dups.Add(1)
			}
			ended <- struct{}{}
		}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	defer func() { stop(); <-done }()

	var recs []*kgo.Record
	for i, id := range []string{"A-1", "A-2", "A-3"} {
		cmd := &shippb.ShipOrder{OrderId: id, Address: "1 Quay St", Items: []*shippb.Item{{Sku: "mug", Quantity: int32(i + 1)}, {Sku: "tea", Quantity: 1}}}
		b, err := svc.Codec().Encode(ctx, shipping.CommandsTopic, cmd)
		if err != nil {
			t.Fatal(err)
		}
		rec := &kgo.Record{Topic: shipping.CommandsTopic, Key: []byte(id), Value: b}
		recs = append(recs, rec, rec)
	}
	testenv.Produce(t, brokers, recs...)

	events := testenv.ReadTopic(t, brokers, shipping.EventsTopic, 3)
	var got []string
	for _, e := range events {
		var ev *shippb.OrderShipped
		if err := svc.Codec().Unmarshal(e.Value, &ev); err != nil {
			t.Fatalf("an OrderShipped event: %v", err)
		}
		got = append(got, ev.GetOrderId())
		if want := map[string]int32{"A-1": 2, "A-2": 3, "A-3": 4}[ev.GetOrderId()]; ev.GetParcels() != want || ev.GetShipmentId() == 0 {
			t.Errorf("event %v; want %d parcels and a shipment id", ev, want)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"A-1", "A-2", "A-3"}) {
		t.Errorf("events for %v; want one per order", got)
	}
	timeout := time.After(30 * time.Second)
	for range 6 {
		select {
		case <-ended:
		case <-timeout:
			t.Fatalf("%d applied, %d duplicates after 30 s; want 6 outcomes", applied.Load(), dups.Load())
		}
	}
	if applied.Load() != 3 || dups.Load() != 3 {
		t.Errorf("%d applied, %d duplicates; want 3 and 3", applied.Load(), dups.Load())
	}
	var n int
	if err := pool.QueryRow(ctx, `select count(*) from shipments`).Scan(&n); err != nil || n != 3 {
		t.Errorf("%d shipments (%v); want 3", n, err)
	}
}
