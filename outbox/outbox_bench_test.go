package outbox_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// BenchmarkAdd adds one keyed message (per-key advisory lock, NOTIFY and
// insert in one round trip) inside a transaction of 100 adds; reported per
// add.
func BenchmarkAdd(b *testing.B) {
	ctx := context.Background()
	pool := testenv.DB(b)
	ob := outbox.New()
	if err := ob.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	value := []byte(`{"order_id":"order-8812","account":42,"amount":1250}`)
	tx, err := pool.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		if err := ob.Add(ctx, tx, outbox.Message{Topic: "account-credited", Key: []byte(strconv.Itoa(n % 10000)), Value: value}); err != nil {
			b.Fatal(err)
		}
		n++
		if n%100 == 0 {
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
			if tx, err = pool.Begin(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		b.Fatal(err)
	}
}
