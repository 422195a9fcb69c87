package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// oppositeOrders runs a consumer over two partitions whose records go round
// the same five accounts in opposite orders, each adding an outbox row keyed
// by the account and, with balances, updating the account's balance row.
// Both partitions' first batches are made to overlap. It checks that every
// record is applied once and returns the first offset of the first batch
// each partition lost to contention, the size of the batch that retried
// from there, and how many were lost.
func oppositeOrders(t *testing.T, balances bool) (lost, retriedSize map[int32]int64, contention int32, batchMax int) {
	t.Helper()
	ctx := context.Background()
	pool := testenv.DB(t)
	setupLedger(t, pool)
	ob := outbox.New()
	if err := ob.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `create table balances(account bigint primary key, total bigint not null)`); err != nil {
		t.Fatal(err)
	}
	kc := testenv.Kafka(t, 2, "credits")
	brokers := testenv.Brokers(kc)
	const perPartition = 150
	var recs []*kgo.Record
	for p := int32(0); p < 2; p++ {
		for i := 0; i < perPartition; i++ {
			acct := int64(i % 5)
			if p == 1 {
				acct = 4 - acct // the other partition goes round the accounts backwards
			}
			v, _ := json.Marshal(credit{OrderID: fmt.Sprintf("p%d-%d", p, i), Account: acct, Amount: 1})
			recs = append(recs, &kgo.Record{Topic: "credits", Partition: p, Value: v})
		}
	}
	produceManual(t, brokers, recs...)

	// Both partitions' first batches meet here after each locked its first
	// account, so each then waits for the other's: a certain deadlock.
	var arrived atomic.Int32
	bothLocked := make(chan struct{})
	h := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			if err := insertCredit(ctx, tx, msg.Value); err != nil {
				return err
			}
			if balances {
				if _, err := tx.Exec(ctx, `insert into balances(account, total) values($1, $2)
					on conflict (account) do update set total = balances.total + excluded.total`, msg.Value.Account, msg.Value.Amount); err != nil {
					return err
				}
			}
			if msg.Record.Offset == 1 && msg.Attempt == 1 {
				if arrived.Add(1) == 2 {
					close(bothLocked)
				}
				select {
				case <-bothLocked:
				case <-time.After(10 * time.Second):
				}
			}
			// Outbox rows keyed by account too: queued and flushed just
			// before COMMIT without key locks, they never deadlock (the
			// balances rows do).
			return ob.Add(ctx, tx, outbox.Message{Topic: "credited", Key: []byte(strconv.FormatInt(msg.Value.Account, 10)), Value: msg.Record.Value})
		})
	var contentions atomic.Int32
	var mu sync.Mutex
	lost = map[int32]int64{}        // partition -> first offset of the batch lost to contention
	retriedSize = map[int32]int64{} // partition -> size of the next batch committed from there
	o := newOutcomes()
	hooks := o.hooks()
	hooks.OnRetry = func(_ context.Context, d consumer.RetryData) {
		p, off, err := d.Partition, d.Offset, d.Err
		if apply.IsContention(err) {
			contentions.Add(1)
			mu.Lock()
			if _, seen := lost[p]; !seen {
				lost[p] = off
			}
			mu.Unlock()
		}
	}
	hooks.BeforeDBCommit = func(_ context.Context, d consumer.CommitData) {
		p, first, last := d.Partition, d.FirstOffset, d.LastOffset
		mu.Lock()
		defer mu.Unlock()
		if off, ok := lost[p]; ok && off == first {
			if _, done := retriedSize[p]; !done {
				retriedSize[p] = last - first + 1
			}
		}
	}
	cfg := testConfig(brokers, "deadlock", "credits")
	cfg.BatchMaxRecords = 100
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(hooks))
	o.await(t, 120*time.Second, "every record", func() bool { return o.total() >= 2*perPartition })
	if a := o.get("applied"); a != 2*perPartition {
		t.Errorf("applied %d, want %d", a, 2*perPartition)
	}
	if n := count(t, pool, `select count(*) from ledger`); n != 2*perPartition {
		t.Errorf("%d ledger rows, want %d", n, 2*perPartition)
	}
	if n := count(t, pool, `select count(*) from exactly_outbox`); n != 2*perPartition {
		t.Errorf("%d outbox rows, want %d", n, 2*perPartition)
	}
	mu.Lock()
	defer mu.Unlock()
	return lost, retriedSize, contentions.Load(), cfg.BatchMaxRecords
}

// Two partitions whose batches update the same five balance rows in opposite
// orders deadlock on the row locks. The workers retry at once with smaller
// batches, and every record is applied once.
func TestDeadlockedBatchesShrink(t *testing.T) {
	lost, retriedSize, contention, batchMax := oppositeOrders(t, true)
	if len(lost) == 0 {
		t.Fatal("no batch lost to contention: the test did not provoke the deadlock it is about")
	}
	for p, size := range retriedSize {
		if size > int64(batchMax)/2 {
			t.Errorf("partition %d: after losing a batch to contention, retried with %d records, want at most %d", p, size, batchMax/2)
		}
	}
	t.Logf("%d transactions lost to contention; retried batch sizes %v", contention, retriedSize)
}

// The same overlapping batches with only outbox rows keyed by account: the
// outbox queues a batch's rows and inserts them just before COMMIT without
// key locks, so they never deadlock (they did when each Add took its lock as
// it went: the chaos harness saw backlogs drain at 20-100 records/s).
func TestOutboxKeyLocksDoNotDeadlock(t *testing.T) {
	_, _, contention, _ := oppositeOrders(t, false)
	if contention != 0 {
		t.Errorf("%d transactions lost to contention, want none", contention)
	}
}
