package deferred

import (
	"context"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestAfterCommitOncePerKeyInOrder checks what the outbox relies on to wake
// its relays once per table and transaction: a second registration under a
// key is ignored, callbacks run in registration order with the pool given
// to Committed, and only once (a second Committed runs nothing).
func TestAfterCommitOncePerKeyInOrder(t *testing.T) {
	b := New(nil)
	var ran []string
	pool := &pgxpool.Pool{}
	cb := func(name string) WakeFunc {
		return func(p *pgxpool.Pool) {
			if p != pool {
				t.Errorf("%s got pool %p, want %p", name, p, pool)
			}
			ran = append(ran, name)
		}
	}
	b.AfterCommit("t1", cb("t1 first"))
	b.AfterCommit("t2", cb("t2"))
	b.AfterCommit("t1", cb("t1 second"))
	if len(ran) != 0 {
		t.Fatalf("callbacks ran before Committed: %v", ran)
	}
	b.Committed(pool)
	if want := []string{"t1 first", "t2"}; !reflect.DeepEqual(ran, want) {
		t.Fatalf("ran %v, want %v", ran, want)
	}
	b.Committed(pool)
	if len(ran) != 2 {
		t.Fatalf("a second Committed ran callbacks again: %v", ran)
	}
	var nilBuf *Buffer
	nilBuf.Committed(pool) // no buffer, nothing to run
}

// Prefer replaces the callback a later AfterCommit registers under its key,
// and registers nothing by itself.
func TestPreferReplacesTheCallbackOfItsKey(t *testing.T) {
	b := New(nil)
	var got []string
	b.Prefer("t1", WakeFunc(func(*pgxpool.Pool) { got = append(got, "preferred t1") }))
	b.Prefer("unused", WakeFunc(func(*pgxpool.Pool) { got = append(got, "preferred unused") }))
	b.AfterCommit("t1", WakeFunc(func(*pgxpool.Pool) { got = append(got, "own t1") }))
	b.AfterCommit("t2", WakeFunc(func(*pgxpool.Pool) { got = append(got, "own t2") }))
	b.Committed(nil)
	if want := []string{"preferred t1", "own t2"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("callbacks ran %q, want %q", got, want)
	}
}

// notifier is a Notifier that queues its statement when due, recording
// what ran.
type notifier struct {
	name string
	due  bool
	ran  *[]string
}

func (n notifier) Wake(*pgxpool.Pool) { *n.ran = append(*n.ran, n.name+" woken") }

func (n notifier) QueueNotify(batch *pgx.Batch) func() {
	if !n.due {
		return nil
	}
	batch.Queue("select pg_notify($1, '')", n.name)
	return func() { *n.ran = append(*n.ran, n.name+" notified") }
}

// QueueNotifies queues, after what the batch holds, the statements of the
// Notifiers that are due; Committed then calls their notified functions
// instead of Wake, and Wake for the others, in registration order.
func TestQueueNotifiesLetsDueNotifiersRideAfterCommit(t *testing.T) {
	b := New(nil)
	var ran []string
	b.AfterCommit("due", notifier{name: "due", due: true, ran: &ran})
	b.AfterCommit("plain", WakeFunc(func(*pgxpool.Pool) { ran = append(ran, "plain woken") }))
	b.AfterCommit("late", notifier{name: "late", ran: &ran})
	batch := &pgx.Batch{}
	batch.Queue("commit")
	if n := b.QueueNotifies(batch); n != 1 || batch.Len() != 2 || batch.QueuedQueries[1].Arguments[0] != "due" {
		t.Fatalf("QueueNotifies queued %d, batch holds %d statements; want the due notifier's after the COMMIT", n, batch.Len())
	}
	if len(ran) != 0 {
		t.Fatalf("ran %v before Committed", ran)
	}
	b.Committed(nil)
	if want := []string{"due notified", "plain woken", "late woken"}; !reflect.DeepEqual(ran, want) {
		t.Fatalf("ran %q, want %q", ran, want)
	}
	var nilBuf *Buffer
	if n := nilBuf.QueueNotifies(batch); n != 0 {
		t.Fatalf("a nil buffer queued %d", n)
	}
	nilBuf.NotifiesFailed()

	// A notification that failed after the COMMIT: its waker wakes.
	ran = nil
	b = New(nil)
	b.AfterCommit("due", notifier{name: "due", due: true, ran: &ran})
	b.QueueNotifies(&pgx.Batch{})
	b.NotifiesFailed()
	b.Committed(nil)
	if want := []string{"due woken"}; !reflect.DeepEqual(ran, want) {
		t.Fatalf("after a failed notification ran %q, want %q", ran, want)
	}
}

// txID stands for a distinct transaction: For compares transactions by
// identity only.
type txID struct {
	pgx.Tx
	id int
}

// A Slot in the context gives For the buffer stored in it when For is
// called, for that buffer's transaction only; a buffer put in by With in a
// context derived from it takes precedence.
func TestForFindsTheSlotsCurrentBuffer(t *testing.T) {
	tx1, tx2 := &txID{id: 1}, &txID{id: 2}
	var slot Slot
	ctx := WithSlot(context.Background(), &slot)
	if b := For(ctx, tx1); b != nil {
		t.Fatalf("For found %p in an empty slot", b)
	}
	b1 := New(tx1)
	slot.Buffer = b1
	if b := For(ctx, tx1); b != b1 {
		t.Fatalf("For(tx1) = %p, want the slot's buffer %p", b, b1)
	}
	b2 := New(tx2)
	slot.Buffer = b2
	if b := For(ctx, tx1); b != nil {
		t.Fatalf("For(tx1) = %p after the slot moved to tx2's buffer, want nil", b)
	}
	if b := For(ctx, tx2); b != b2 {
		t.Fatalf("For(tx2) = %p, want %p", b, b2)
	}
	if b := For(With(ctx, b1), tx1); b != b1 {
		t.Fatalf("For(tx1) under With(b1) = %p, want %p", b, b1)
	}
}

// countFlusher counts the rows queued on it.
type countFlusher struct{ n int }

func (*countFlusher) Flush(context.Context, pgx.Tx) error { return nil }

// TestQueueReturnsEachKeysQueue: Queue gives every key its own queue,
// created once, whatever the order keys come in (the last one is found
// without a lookup), and after the buffer is flushed a key gets a new
// queue, not the flushed one.
func TestQueueReturnsEachKeysQueue(t *testing.T) {
	b := New(nil)
	created := 0
	queue := func(key string) *countFlusher {
		return b.Queue(key, func() Flusher { created++; return &countFlusher{} }).(*countFlusher)
	}
	for _, key := range []string{"a", "a", "b", "a", "b", "b", "c", "a"} {
		queue(key).n++
	}
	if got := [3]int{queue("a").n, queue("b").n, queue("c").n}; got != [3]int{4, 3, 1} || created != 3 {
		t.Fatalf("rows per queue a, b, c = %v with %d queues created, want [4 3 1] and 3", got, created)
	}
	var order []any
	for _, q := range b.queues {
		order = append(order, q.key)
	}
	if !reflect.DeepEqual(order, []any{"a", "b", "c"}) {
		t.Fatalf("flush order %v, want a, b, c", order)
	}
	flushed := queue("c")
	if err := b.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if q := queue("c"); q == flushed || q.n != 0 || created != 4 {
		t.Fatalf("after the flush, key c's queue is the flushed one (%v) or holds %d rows; want a new, empty one", q == flushed, q.n)
	}
}

// reusableFlusher is a Reusable queue of rows that records its flushes.
type reusableFlusher struct {
	rows    []string
	resets  int
	flushes int
}

func (f *reusableFlusher) Flush(context.Context, pgx.Tx) error { f.flushes++; return nil }
func (f *reusableFlusher) Reset()                              { f.rows = f.rows[:0]; f.resets++ }

// TestReuseTakesTheFlushedQueuesEmptied: a Buffer given the previous
// transaction's buffer (Reuse) takes its flushed Reusable queues, emptied,
// instead of creating new ones of those keys; a queue that is not
// Reusable, a key without a spare, and a buffer that was never flushed
// give nothing; Ended empties the flushed queues at once.
func TestReuseTakesTheFlushedQueuesEmptied(t *testing.T) {
	ctx := context.Background()
	created := 0
	reusable := func(b *Buffer, key string) *reusableFlusher {
		return b.Queue(key, func() Flusher { created++; return &reusableFlusher{} }).(*reusableFlusher)
	}
	first := New(nil)
	a := reusable(first, "a")
	a.rows = append(a.rows, "row 1", "row 2")
	plain := first.Queue("plain", func() Flusher { return &countFlusher{} })
	if err := first.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if len(a.rows) != 2 {
		t.Fatalf("the flush emptied queue a (%d rows left): the statements it queued may still read them", len(a.rows))
	}
	first.Ended()
	if len(a.rows) != 0 || a.resets != 1 {
		t.Fatalf("Ended left queue a with %d rows (%d resets), want it emptied", len(a.rows), a.resets)
	}

	second := New(nil)
	second.Reuse(first)
	if got := reusable(second, "a"); got != a || len(got.rows) != 0 || created != 1 {
		t.Fatalf("the second transaction's queue a is the flushed one: %v, with %d rows and %d queues created; want the same, empty, 1", got == a, len(got.rows), created)
	}
	if second.Queue("plain", func() Flusher { return &countFlusher{} }) == plain {
		t.Error("a queue that is not Reusable was reused")
	}
	if reusable(second, "b"); created != 2 {
		t.Errorf("a key without a spare: %d queues created, want a new one (2)", created)
	}

	third := New(nil)
	third.Reuse(second) // second was never flushed: its queues are still its own
	if reusable(third, "a") == a || created != 3 {
		t.Error("a queue of a buffer that was never flushed was reused")
	}
}

// A transaction's wakers for one or two tables, and the preferred one,
// live in the buffer's own allocation: registering them allocates nothing.
func TestAfterCommitOfOneOrTwoTablesAllocatesNothing(t *testing.T) {
	b := New(nil)
	var ran int
	w := WakeFunc(func(*pgxpool.Pool) { ran++ })
	allocs := testing.AllocsPerRun(100, func() {
		b.Prefer("t1", w)
		b.AfterCommit("t1", w)
		b.AfterCommit("t2", w)
		b.Committed(nil)
		b.preferred = nil // a new transaction's buffer has none
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per transaction of two tables, want 0", allocs)
	}
	if ran != 2*101 {
		t.Fatalf("wakers ran %d times over 101 transactions, want twice each", ran)
	}
}
