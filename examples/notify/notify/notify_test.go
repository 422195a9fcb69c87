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
