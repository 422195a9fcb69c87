package apply_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
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

// recordingNotifier records, for each QueueNotify, the statement the batch
// ended with, and queues nothing (Wake then runs after the commit).
type recordingNotifier struct {
	last  *[]string
	woken *atomic.Int32
}

func (r recordingNotifier) Wake(*pgxpool.Pool) { r.woken.Add(1) }

func (r recordingNotifier) QueueNotify(batch *pgx.Batch) func() {
	*r.last = append(*r.last, batch.QueuedQueries[batch.Len()-1].SQL)
	return nil
}

// The notification is queued only after the COMMIT it follows, never in
// the writing transaction: a batch whose pipeline carries COMMIT asks its
// notifiers once that COMMIT is queued; a batch whose COMMIT is sent alone
// (a queued statement's check) asks none, and wakes after the commit.
func TestNotificationIsQueuedOnlyAfterCommit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		h     handler.Any
		items func(t *testing.T) []apply.Item
		setup func(t *testing.T, pool *pgxpool.Pool)
		want  []string
	}{
		{"commit in the pipeline", handler.New("entry", handler.FromPayload(entryKey), func(ctx context.Context, tx pgx.Tx, m handler.Message[entry]) error {
			return outbox.Add(ctx, tx, outbox.Message{Topic: "t", Key: []byte(m.Value.ID), Value: []byte("v")})
		}), func(t *testing.T) []apply.Item { return entries(t, 3, -1, 1) }, func(*testing.T, *pgxpool.Pool) {}, []string{"commit"}},
		{"commit alone after checks", checkedTransfers(handler.RowsAffected(1), map[string]int{}),
			func(t *testing.T) []apply.Item { return xfers(t, 3, -1) }, newAccounts, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, pool := newFormExecutor(t, tc.h)
			tc.setup(t, pool)
			var last []string
			var woken atomic.Int32
			e.Wakes = map[string]deferred.Waker{outbox.New().Table().Sanitize(): recordingNotifier{&last, &woken}}
			if res, herr, err := e.Run(context.Background(), tc.items(t)); err != nil || herr != nil || len(res) != 3 {
				t.Fatalf("Run = %v, %v, %v; want 3 results", res, herr, err)
			}
			if !slices.Equal(last, tc.want) {
				t.Fatalf("notifiers asked after %q, want after %q", last, tc.want)
			}
			if woken.Load() != 1 {
				t.Fatalf("woken %d times after the commit, want once", woken.Load())
			}
		})
	}
}

// A handler that swallows a database error leaves its transaction aborted:
// the batch fails (the record's attempt), and no notification is sent for
// its outbox row, neither after the failed COMMIT nor on its own. The
// marker, notified after Run, must be the listener's first notification.
func TestSwallowedErrorSendsNoNotification(t *testing.T) {
	h := handler.New("entry", handler.FromPayload(entryKey), func(ctx context.Context, tx pgx.Tx, m handler.Message[entry]) error {
		if err := outbox.Add(ctx, tx, outbox.Message{Topic: "t", Key: []byte(m.Value.ID), Value: []byte("v")}); err != nil {
			return err
		}
		_, _ = tx.Exec(ctx, "select 1/0") // swallowed: the transaction is aborted
		return nil
	})
	e, pool := newFormExecutor(t, h)
	ctx := context.Background()
	pc, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	listener := pc.Hijack()
	t.Cleanup(func() { listener.Close(context.Background()) })
	channel := outbox.New().Channel()
	if _, err := listener.Exec(ctx, "listen "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	res, herr, err := e.Run(ctx, entries(t, 1, -1, 1))
	if err != nil || herr == nil || len(res) != 0 {
		t.Fatalf("Run = %v, %v, %v; want the swallowed error as the record's failed attempt", res, herr, err)
	}
	if _, err := pool.Exec(ctx, "select pg_notify($1, 'marker')", channel); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Payload != "marker" {
		t.Fatalf("first notification %q, want the marker: a rolled-back batch notified", n.Payload)
	}
	var rows int
	if err := pool.QueryRow(ctx, "select count(*) from exactly_outbox").Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d outbox rows (%v), want none: the batch rolled back", rows, err)
	}
}
