package notify_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/exactly-go/exactly/examples/notify/notify"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/handlertest"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The relay may publish an event more than once, always with the same
// message-id header: every copy of an event, delivered at once, records one
// notification. Two events about one order (two credits) are two
// notifications: the key is the event's id, not the order's.
func TestRepublishedEventNotifiesOnce(t *testing.T) {
	if notify.MessageIDHeader != outbox.HeaderMessageID {
		t.Fatalf("notify keys on header %q, the relay sets %q", notify.MessageIDHeader, outbox.HeaderMessageID)
	}
	ctx := context.Background()
	pool := testenv.DB(t)
	svc := notify.New("", "")
	if err := svc.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	const n = 10
	for i := range n {
		ev := notify.Credited{OrderID: fmt.Sprintf("order-%d", i/2), Account: 1, Amount: int64(10 + i)}
		rep := handlertest.Deliver(ctx, t, pool, svc.Handler(), handlertest.Delivery{Copies: 3,
			Headers: []handler.Header{{Key: notify.MessageIDHeader, Value: fmt.Appendf(nil, "msg-%d", i)}}}, ev)
		handlertest.AssertOneEffectPerKey(t, rep)
		if rep.Applied != 1 || rep.Duplicates != 2 {
			t.Errorf("event %d: applied %d, duplicates %d; want 1 and 2", i, rep.Applied, rep.Duplicates)
		}
	}
	var rows, orders int
	if err := pool.QueryRow(ctx, `select count(*), count(distinct order_id) from `+svc.Table().Sanitize()).Scan(&rows, &orders); err != nil {
		t.Fatal(err)
	}
	if rows != n || orders != n/2 {
		t.Errorf("%d notifications for %d orders, want %d for %d", rows, orders, n, n/2)
	}
}

// Instances that start at once all set up the schema: none fails on the
// catalog race of concurrent "create table if not exists" (duplicate key
// in pg_type_typname_nsp_index), which hit about half of the starts of two
// instances before the set-up took an advisory lock.
func TestMigrateWhenInstancesStartAtOnce(t *testing.T) {
	const instances = 6
	for round := range 4 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			pool := testenv.DB(t)
			start := make(chan struct{})
			errs := make(chan error, instances)
			for range instances {
				go func() {
					<-start
					errs <- notify.New("", "").Migrate(context.Background(), pool)
				}()
			}
			close(start)
			for range instances {
				if err := <-errs; err != nil {
					t.Errorf("one of %d concurrent set-ups failed: %v", instances, err)
				}
			}
		})
	}
}
