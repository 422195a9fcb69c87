package outbox_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/runtime/deferred"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// flushBatch is a consumer batch's outbox path: 100 Adds queued in the
// transaction's buffer (keys drawn from keys distinct values), the flush
// just before COMMIT, COMMIT, and the after-commit wake.
func flushBatch(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, next *atomic.Int64, keys int) error {
	value := []byte(`{"order_id":"order-8812","account":42,"amount":1250}`)
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	buf := deferred.New(tx)
	bctx := deferred.With(ctx, buf)
	for range 100 {
		key := []byte(strconv.FormatInt(next.Add(1)%int64(keys), 10))
		if err := ob.Add(bctx, tx, outbox.Message{Topic: "account-credited", Key: key, Value: value}); err != nil {
			return err
		}
	}
	if err := buf.Flush(ctx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	buf.Committed(pool)
	return nil
}

// BenchmarkFlush measures one consumer batch of 100 outbox rows (queue,
// flush, COMMIT, wake) on one connection, keys spread over 10,000 values;
// reported per batch.
func BenchmarkFlush(b *testing.B) {
	ctx := context.Background()
	pool := testenv.DB(b)
	ob := outbox.New()
	if err := ob.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	b.ReportAllocs()
	for b.Loop() {
		if err := flushBatch(ctx, pool, ob, &next, 10000); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFlushParallel runs batches of 100 rows concurrently (GOMAXPROCS
// × 4 goroutines on testenv's pool of 20) whose keys overlap (10 keys), as batches
// of different partitions emitting events for the same accounts do;
// reported per batch. Key locks would make these batches wait for each
// other; a NOTIFY in each would serialise their commits.
func BenchmarkFlushParallel(b *testing.B) {
	ctx := context.Background()
	pool := testenv.DB(b)
	ob := outbox.New()
	if err := ob.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	b.SetParallelism(4)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := flushBatch(ctx, pool, ob, &next, 10); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
