package apply_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/deferred"
	"github.com/exactly-go/exactly/outbox"
)

// The notification that wakes the relays of another process rides in the
// batch's COMMIT round trip, after the COMMIT: a listener gets it, and the
// pool lends no connection beyond the transaction's own (a notification
// sent on its own takes one, in a goroutine, after the commit). In each
// handler form.
func TestOutboxNotificationRidesAfterCommit(t *testing.T) {
	for _, form := range []struct {
		name string
		h    handler.Any
	}{
		{"tx", handler.New("entry", handler.FromPayload(entryKey), func(ctx context.Context, tx pgx.Tx, m handler.Message[entry]) error {
			return outbox.Add(ctx, tx, outbox.Message{Topic: "t", Key: []byte(m.Value.ID), Value: []byte("v")})
		})},
		{"pipelined", handler.NewPipelined("entry", handler.FromPayload(entryKey), func(ctx context.Context, q handler.Queue, m handler.Message[entry]) error {
			return outbox.Add(ctx, q.Tx(), outbox.Message{Topic: "t", Key: []byte(m.Value.ID), Value: []byte("v")})
		})},
	} {
		t.Run(form.name, func(t *testing.T) {
			e, pool := newFormExecutor(t, form.h)
			ctx := context.Background()
			pc, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			listener := pc.Hijack()
			t.Cleanup(func() { listener.Close(context.Background()) })
			if _, err := listener.Exec(ctx, "listen "+pgx.Identifier{outbox.New().Channel()}.Sanitize()); err != nil {
				t.Fatal(err)
			}
			before := pool.Stat().AcquireCount()
			if res, herr, err := e.Run(ctx, entries(t, 3, -1, 1)); err != nil || herr != nil || len(res) != 3 {
				t.Fatalf("Run = %v, %v, %v; want 3 results", res, herr, err)
			}
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			n, err := listener.WaitForNotification(wctx)
			if err != nil {
				t.Fatalf("waiting for the relays' notification: %v", err)
			}
			if n.Payload != "" {
				t.Fatalf("notification %q, want the relays' wake-up", n.Payload)
			}
			var rows int
			if err := pool.QueryRow(ctx, "select count(*) from exactly_outbox").Scan(&rows); err != nil || rows != 3 {
				t.Fatalf("%d outbox rows (%v), want 3", rows, err)
			}
			// The count's own acquire is the one after Run's.
			if got := pool.Stat().AcquireCount() - before; got != 2 {
				t.Fatalf("the pool lent %d connections for Run and the count, want 2: the notification took one of its own", got)
			}
		})
	}
}

// failingNotifier queues a notification that fails after the COMMIT.
type failingNotifier struct{ woken, notified *atomic.Int32 }

func (f failingNotifier) Wake(*pgxpool.Pool) { f.woken.Add(1) }

func (f failingNotifier) QueueNotify(batch *pgx.Batch) func() {
	batch.Queue("select 1/0")
	return func() { f.notified.Add(1) }
}

// A notification that fails after the COMMIT neither fails the committed
// batch nor counts as sent: its waker wakes (and notifies on its own).
func TestFailedNotificationAfterCommitWakes(t *testing.T) {
	h := handler.New("entry", handler.FromPayload(entryKey), func(ctx context.Context, tx pgx.Tx, m handler.Message[entry]) error {
		return outbox.Add(ctx, tx, outbox.Message{Topic: "t", Key: []byte(m.Value.ID), Value: []byte("v")})
	})
	e, pool := newFormExecutor(t, h)
	var woken, notified atomic.Int32
	e.Wakes = map[string]deferred.Waker{outbox.New().Table().Sanitize(): failingNotifier{&woken, &notified}}
	ctx := context.Background()
	if res, herr, err := e.Run(ctx, entries(t, 3, -1, 1)); err != nil || herr != nil || len(res) != 3 {
		t.Fatalf("Run = %v, %v, %v; want 3 results: the failed notification came after the COMMIT", res, herr, err)
	}
	var rows int
	if err := pool.QueryRow(ctx, "select count(*) from exactly_outbox").Scan(&rows); err != nil || rows != 3 {
		t.Fatalf("%d outbox rows (%v), want 3 committed", rows, err)
	}
	if woken.Load() != 1 || notified.Load() != 0 {
		t.Fatalf("woken %d, notified %d; want the waker woken once and the failed notification not counted as sent", woken.Load(), notified.Load())
	}
}
