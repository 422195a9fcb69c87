package status_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// A running group whose partition 1 gets a record every 20 ms (each in
// flight for a moment: lag 0 or 1 at a sample) is healthy at every one of
// five samples a second apart: nothing is "stalled", nothing needs a
// human. Then a record on partition 0 whose handler never returns holds
// that partition's committed offset while the records behind it wait:
// the next sample marks partition 0 stalled, and the problem says what to
// do and where the runbook is.
func TestStallIsNotARecordInFlight(t *testing.T) {
	pool := testenv.DB(t)
	ctx := t.Context()
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	brokers := testenv.Brokers(testenv.Kafka(t, 2, "jobs"))
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := handler.New("jobs", handler.FromPayload(func(o order) string { return dedupe.Key("job", o.ID) }),
		func(ctx context.Context, _ pgx.Tx, msg handler.Message[order]) error {
			if msg.Value.ID == "stuck" {
				once.Do(func() { close(entered) })
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		})
	cfg := consumer.DefaultConfig()
	cfg.Brokers, cfg.Group, cfg.Topics = brokers, "jobs-group", []string{"jobs"}
	cfg.CommitInterval = 100 * time.Millisecond
	c, err := consumer.New(cfg, pool, consumer.Handle(h), consumer.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	t.Cleanup(func() {
		close(release)
		stop()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	})

	pcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pcl.Close)
	record := func(p int32, id string) *kgo.Record {
		v, _ := json.Marshal(order{ID: id})
		return &kgo.Record{Topic: "jobs", Partition: p, Value: v}
	}
	trickleCtx, stopTrickle := context.WithCancel(ctx)
	trickled := make(chan struct{})
	go func() {
		defer close(trickled)
		for i := 0; trickleCtx.Err() == nil; i++ {
			_ = pcl.ProduceSync(trickleCtx, record(1, fmt.Sprint("t-", i))).FirstErr()
			select {
			case <-trickleCtx.Done():
			case <-time.After(20 * time.Millisecond): // a steady trickle, as producers send
			}
		}
	}()
	t.Cleanup(func() { stopTrickle(); <-trickled })

	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admCl.Close)
	scfg := status.Config{Pool: pool, Admin: kadm.NewClient(admCl), Groups: []string{"jobs-group"}, Brokers: brokers}
	// The group has joined and committed partition 1 before the samples.
	for {
		r, err := status.Collect(ctx, scfg, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Groups) == 1 && r.Groups[0].State == "Stable" && len(r.Partitions) > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling the broker's view of the group
	}
	for i := range 5 {
		r, err := status.Collect(ctx, scfg, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if r.NeedsHuman() {
			t.Errorf("healthy sample %d needs a human: %q", i, r.Problems)
		}
	}

	if err := pcl.ProduceSync(ctx, record(0, "stuck"), record(0, "behind-1"), record(0, "behind-2")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	<-entered
	r, err := status.Collect(ctx, scfg, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var stalled []int32
	for _, p := range r.Partitions {
		if p.Stalled {
			stalled = append(stalled, p.Partition)
		}
	}
	if len(stalled) != 1 || stalled[0] != 0 {
		t.Errorf("stalled partitions %v, want [0]: %+v", stalled, r.Partitions)
	}
	found := false
	for _, p := range r.Problems {
		if strings.Contains(p, `"jobs-group" "jobs"/0`) && strings.Contains(p, "no offset committed over") &&
			strings.Contains(p, "-> do: ") && strings.Contains(p, "docs/operations.md#exactlyconsumerstalled") {
			found = true
		}
	}
	if !found {
		t.Errorf("no stall problem for partition 0 with what to do: %q", r.Problems)
	}
}
