package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testenv"
)

// A partition over its in-flight share is paused and resumed while another
// partition of the member is caught up. A resume must not wait out the
// caught-up partition's fetch at the broker (franz-go's default fetch max
// wait, 5s): 240 records of 4 KiB, ~15 per 64 KiB fetch, through a share of
// 10 records, never wait seconds between two records (5.1s with franz-go's
// default).
func TestPausedPartitionResumesWhileOthersAreIdle(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 2, "credits")
	brokers := testenv.Brokers(kc)
	const n = 240
	pad := strings.Repeat("x", 4<<10)
	var recs []*kgo.Record
	for i := range n {
		v, _ := json.Marshal(map[string]any{"order_id": fmt.Sprintf("o-%d", i), "account": 1, "amount": 1, "pad": pad})
		recs = append(recs, &kgo.Record{Topic: "credits", Partition: 0, Value: v})
	}
	v, _ := json.Marshal(credit{OrderID: "idle", Account: 2, Amount: 1})
	recs = append(recs, &kgo.Record{Topic: "credits", Partition: 1, Value: v})
	// Batches of at most 16 KiB (3 records): a 64 KiB fetch brings ~15.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerBatchMaxBytes(16<<10))
	if err != nil {
		t.Fatal(err)
	}
	err = cl.ProduceSync(context.Background(), recs...).FirstErr()
	cl.Close()
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(brokers, "paused-resume", "credits")
	cfg.MaxInFlightRecords = 20 // a share of 10 records per partition
	cfg.BatchMaxRecords = 10
	o := newOutcomes()
	hooks := o.hooks()
	count := hooks.OnOutcome
	var mu sync.Mutex
	var last time.Time
	var gap time.Duration // the longest wait between two records of partition 0
	hooks.OnOutcome = func(ctx context.Context, d consumer.OutcomeData) {
		if d.Record.Partition == 0 {
			mu.Lock()
			now := time.Now()
			if !last.IsZero() {
				gap = max(gap, now.Sub(last))
			}
			last = now
			mu.Unlock()
		}
		count(ctx, d)
	}
	startConsumer(t, cfg, pool, consumer.Handle(creditHandler(5*time.Millisecond)), consumer.WithHooks(hooks))
	o.await(t, 60*time.Second, "every record applied", func() bool { return o.get("applied") == n+1 })
	mu.Lock()
	defer mu.Unlock()
	if gap > 2500*time.Millisecond {
		t.Errorf("partition 0 waited %v between two records: a resume waited out an idle fetch", gap)
	}
	t.Logf("longest wait between two records of partition 0: %v", gap)
}
