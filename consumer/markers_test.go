package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testenv"
)

// A topic written in Kafka transactions, as the outbox relay writes: each
// transaction leaves a marker in the log, after its records, and the last
// transaction here is aborted (its record is never delivered). With key
// concurrency off and on, the consumer applies every committed record once
// and its committed offset reaches each partition's end offset, past the
// trailing markers, instead of stopping one short of it for ever.
func TestCommittedOffsetPassesTransactionMarkers(t *testing.T) {
	for _, kc := range []int{1, 64} {
		t.Run(fmt.Sprintf("key-concurrency-%d", kc), func(t *testing.T) {
			pool := testenv.DB(t)
			setupLedger(t, pool)
			const parts, n = 2, 20
			k := testenv.Kafka(t, parts, "credits")
			brokers := testenv.Brokers(k)
			ctx := context.Background()
			prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID("markers-test"),
				kgo.RecordPartitioner(kgo.ManualPartitioner()))
			if err != nil {
				t.Fatal(err)
			}
			defer prod.Close()
			txn := func(i int, end kgo.TransactionEndTry) {
				t.Helper()
				v, _ := json.Marshal(credit{OrderID: fmt.Sprintf("order-%d", i), Account: int64(i % 10), Amount: 100})
				if err := prod.BeginTransaction(); err != nil {
					t.Fatal(err)
				}
				if err := prod.ProduceSync(ctx, &kgo.Record{Topic: "credits", Partition: int32(i % parts), Value: v}).FirstErr(); err != nil {
					t.Fatal(err)
				}
				if err := prod.EndTransaction(ctx, end); err != nil {
					t.Fatal(err)
				}
			}
			for i := range n {
				txn(i, kgo.TryCommit)
			}
			txn(n, kgo.TryAbort)

			o := newOutcomes()
			cfg := testConfig(brokers, "g", "credits")
			cfg.KeyConcurrency = kc
			startConsumer(t, cfg, pool, consumer.Handle(creditHandler(0)), consumer.WithHooks(o.hooks()))
			o.await(t, 30*time.Second, "every committed record", func() bool { return o.total() >= n })
			ends, err := kadm.NewClient(prod).ListEndOffsets(ctx, "credits")
			if err != nil {
				t.Fatal(err)
			}
			ends.Each(func(e kadm.ListedOffset) {
				o.awaitCommitted(t, 30*time.Second, "credits", e.Partition, e.Offset)
			})
			if got := count(t, pool, `select count(*) from ledger`); got != n {
				t.Errorf("ledger rows = %d, want %d (the aborted record is not one)", got, n)
			}
			if a := o.get("applied"); a != n {
				t.Errorf("applied = %d, want %d", a, n)
			}
		})
	}
}
