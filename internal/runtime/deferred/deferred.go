// Package deferred lets writes made inside a transaction be deferred to just
// before its COMMIT and issued together. The consumer puts a Buffer in the
// context it hands to handlers; the outbox, finding it there for the same
// transaction, queues its rows instead of inserting them one by one, and the
// consumer flushes the buffer before committing. Flushing a batch's outbox
// rows at once costs one round trip instead of one per row, and draws the
// rows' ids just before COMMIT, after every read and write of the batch's
// handlers (see "The relay's ordering argument" in docs/design.md). Writers
// may also register callbacks that the consumer runs once the transaction
// has committed (the outbox wakes its relays there, outside the
// transaction).
package deferred

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Flusher is a writer's queue for one transaction.
type Flusher interface {
	// Flush issues the queued writes in tx. It fails with the database's
	// error; tx is then aborted.
	Flush(ctx context.Context, tx pgx.Tx) error
}

// Reusable is a Flusher that a later transaction's Buffer may take again,
// emptied, instead of creating a new queue (see Buffer.Reuse): its arrays
// are allocated once per run of transactions rather than once each.
type Reusable interface {
	Flusher
	// Reset empties the queue, keeping its room, and lets go of what it
	// held.
	Reset()
}

// Buffer holds the queues of one transaction. It is used by one goroutine
// (the one running the transaction's handlers) and is not safe for
// concurrent use.
type Buffer struct {
	tx      pgx.Tx
	hint    int      // writes expected (see NewSized)
	aliases []pgx.Tx // other transactions that stand for tx (see Alias)
	// queues are the transaction's queues, in creation order.
	queues []keyed
	// flushed are the Reusable queues a flush emptied the buffer of,
	// spare those of an earlier transaction (Reuse) Queue takes first.
	flushed, spare []keyed
	// lastKey and last are the queue Queue returned last, found again
	// without a map lookup.
	lastKey any
	last    Flusher
	// after holds the wakers to run once tx has committed, in
	// registration order, one per key (a transaction writes one or two
	// tables: a slice, not a map, which would be allocated per
	// transaction).
	after []afterCommit
	// preferred replaces, by key, the waker AfterCommit registers (see
	// Prefer).
	preferred []keyedWaker
	// afterArr and preferredArr hold the usual one or two of each in b's
	// own allocation.
	afterArr     [2]afterCommit
	preferredArr [1]keyedWaker
}

// keyedWaker is a waker and its key.
type keyedWaker struct {
	key any
	w   Waker
}

// afterCommit is a registered waker and, when its notification rides
// after the COMMIT (QueueNotifies), the function to call instead of Wake.
type afterCommit struct {
	keyedWaker
	notified func()
}

// Waker is what runs after a transaction has committed (AfterCommit): it
// wakes what the transaction's writes concern, such as the relays of an
// outbox table (outbox.Outbox is one). Wake must not block.
type Waker interface {
	Wake(pool *pgxpool.Pool)
}

// WakeFunc is a function as a Waker.
type WakeFunc func(pool *pgxpool.Pool)

// Wake calls f(pool).
func (f WakeFunc) Wake(pool *pgxpool.Pool) { f(pool) }

// Notifier is a Waker that can send its notification in the transaction's
// last round trip, queued right after its COMMIT (see QueueNotifies),
// instead of in a round trip of its own after the commit.
type Notifier interface {
	Waker
	// QueueNotify queues on batch, after the COMMIT already queued, the
	// statement that notifies, when one is due, and returns the function
	// to call once the COMMIT has succeeded; it returns nil when it
	// queued nothing (Wake then runs after the commit, as for a Waker).
	QueueNotify(batch *pgx.Batch) (notified func())
}

// keyed is a queue and the key it was registered under.
type keyed struct {
	key any
	f   Flusher
}

type ctxKey struct{}

// With returns ctx carrying b.
func With(ctx context.Context, b *Buffer) context.Context {
	return context.WithValue(ctx, ctxKey{}, b)
}

// New returns an empty buffer for tx.
func New(tx pgx.Tx) *Buffer { return &Buffer{tx: tx} }

// NewSized returns an empty buffer for tx whose writers expect about n
// writes (the records of a batch): their queues start with room for them.
func NewSized(tx pgx.Tx, n int) *Buffer { return &Buffer{tx: tx, hint: n} }

// Hint returns how many writes the buffer's creator expects (see
// NewSized; 0 when it did not say).
func (b *Buffer) Hint() int { return b.hint }

// Slot holds the buffer of the transaction that a context's writers are in
// now. A consumer batch that runs in several transactions in turn (a replay
// after a failed handler) puts one Slot in its records' contexts once and
// stores each transaction's buffer in it, instead of deriving a context per
// record and transaction.
type Slot struct {
	Buffer *Buffer
}

// WithSlot returns ctx carrying s: For then finds s.Buffer as it is when
// For is called. A buffer put in a context derived from ctx by With takes
// precedence.
func WithSlot(ctx context.Context, s *Slot) context.Context {
	return context.WithValue(ctx, ctxKey{}, s)
}

// For returns the buffer ctx carries for tx (by With, or in a Slot by
// WithSlot), or nil when it carries none or one for another transaction (a
// nested one, say): the caller then writes at once.
func For(ctx context.Context, tx pgx.Tx) *Buffer {
	var b *Buffer
	switch v := ctx.Value(ctxKey{}).(type) {
	case *Buffer:
		b = v
	case *Slot:
		b = v.Buffer
	}
	if b == nil {
		return nil
	}
	if b.tx == tx {
		return b
	}
	for _, a := range b.aliases {
		if a == tx {
			return b
		}
	}
	return nil
}

// Alias makes For return b for tx too: a pipelined handler's write-only
// transaction stands for the batch's.
func (b *Buffer) Alias(tx pgx.Tx) { b.aliases = append(b.aliases, tx) }

// Queue returns the queue registered under key, creating it with create on
// first use (or taking the spare queue of that key an earlier transaction
// flushed, emptied: see Reuse). Queues flush in the order they were
// created. Keys are compared with ==.
func (b *Buffer) Queue(key any, create func() Flusher) Flusher {
	if b.last != nil && b.lastKey == key {
		return b.last // the usual case: one table's rows, one after another
	}
	var f Flusher
	for _, q := range b.queues {
		if q.key == key {
			f = q.f
			break
		}
	}
	if f == nil {
		if f = b.takeSpare(key); f == nil {
			f = create()
		}
		b.queues = append(b.queues, keyed{key, f})
	}
	b.lastKey, b.last = key, f
	return f
}

// takeSpare returns the spare queue of key, emptied, or nil.
func (b *Buffer) takeSpare(key any) Flusher {
	for i, q := range b.spare {
		if q.key == key {
			b.spare = append(b.spare[:i], b.spare[i+1:]...)
			q.f.(Reusable).Reset()
			return q.f
		}
	}
	return nil
}

// Reuse gives b the Reusable queues prev's flush emptied it of (and the
// spare queues prev did not take), for b's Queue to take (emptied) instead
// of creating queues of those keys anew.
// prev's transaction must have ended, committed or rolled back: the
// statements its flush queued were sent, and nothing reads the queues'
// rows again. A nil prev, or b itself, gives nothing.
func (b *Buffer) Reuse(prev *Buffer) {
	if prev == nil || prev == b {
		return
	}
	b.spare = append(append(b.spare, prev.flushed...), prev.spare...)
	prev.flushed, prev.spare = nil, nil
}

// Ended tells b that its transaction has ended (committed or rolled back):
// the queues its flush emptied it of let go of their rows now, rather than
// when a later Buffer reuses them.
func (b *Buffer) Ended() {
	for _, q := range b.flushed {
		q.f.(Reusable).Reset()
	}
	for _, q := range b.spare {
		q.f.(Reusable).Reset()
	}
}

// Flush flushes every queue, in creation order, and empties the buffer. It
// fails with the first queue's error.
func (b *Buffer) Flush(ctx context.Context) error {
	for _, q := range b.queues {
		if err := q.f.Flush(ctx, b.tx); err != nil {
			return fmt.Errorf("flushing deferred writes: %w", err)
		}
	}
	b.reset()
	return nil
}

// AfterCommit registers w to run after the transaction has committed,
// once per key: a second registration under the same key is ignored.
// Wakers never run when the transaction rolls back. They run on the
// committing goroutine, in registration order.
func (b *Buffer) AfterCommit(key any, w Waker) {
	for _, a := range b.after {
		if a.key == key {
			return
		}
	}
	for _, p := range b.preferred {
		if p.key == key {
			w = p.w
			break
		}
	}
	if b.after == nil {
		b.after = b.afterArr[:0]
	}
	b.after = append(b.after, afterCommit{keyedWaker: keyedWaker{key, w}})
}

// Prefer makes a later AfterCommit under key register w instead of its
// own waker. It registers nothing by itself: w runs only if something is
// registered under key. The consumer uses it so that rows written to its
// service's outbox table through any Outbox value (outbox.Add's default
// one, say) wake the service's own relay in-process.
func (b *Buffer) Prefer(key any, w Waker) {
	for i, p := range b.preferred {
		if p.key == key {
			b.preferred[i].w = w
			return
		}
	}
	if b.preferred == nil {
		b.preferred = b.preferredArr[:0]
	}
	b.preferred = append(b.preferred, keyedWaker{key, w})
}

// QueueNotifies lets each registered Notifier queue its notification on
// batch, whose last statement is the transaction's COMMIT, and returns how
// many statements were queued. A statement after COMMIT runs in its own
// transaction once COMMIT has succeeded, and not at all when it failed;
// the caller reads its result without failing the committed transaction
// on its error, and calls NotifiesFailed when there was one. The owner
// then calls Committed as usual.
func (b *Buffer) QueueNotifies(batch *pgx.Batch) int {
	if b == nil {
		return 0
	}
	queued := 0
	for i := range b.after {
		n, ok := b.after[i].w.(Notifier)
		if !ok {
			continue
		}
		before := batch.Len()
		b.after[i].notified = n.QueueNotify(batch)
		queued += batch.Len() - before
	}
	return queued
}

// NotifiesFailed forgets the notifications QueueNotifies queued: one of
// them (or the round trip after the COMMIT) failed, so Committed runs
// their wakers' Wake instead, which notifies on its own.
func (b *Buffer) NotifiesFailed() {
	if b != nil {
		for i := range b.after {
			b.after[i].notified = nil
		}
	}
}

// Committed runs the AfterCommit wakers with pool (the pool the
// transaction came from, for work outside it) and forgets them: a waker
// whose notification rode after the COMMIT (QueueNotifies) has its
// notified function called instead. The transaction's owner calls it once
// COMMIT has succeeded; a nil b does nothing.
func (b *Buffer) Committed(pool *pgxpool.Pool) {
	if b == nil {
		return
	}
	after := b.after
	b.after = nil
	for _, a := range after {
		if a.notified != nil {
			a.notified()
			continue
		}
		a.w.Wake(pool)
	}
}

// reset empties b after a flush, keeping its Reusable queues as flushed
// (their rows are still read by the statements the flush queued).
func (b *Buffer) reset() {
	for _, q := range b.queues {
		if _, ok := q.f.(Reusable); ok {
			b.flushed = append(b.flushed, q)
		}
	}
	b.queues, b.aliases, b.lastKey, b.last = nil, nil, nil, nil
}

// FlushInto queues every queue's writes on batch, in creation order, instead
// of executing them, and empties the buffer; it returns how many
// statements it queued. The caller sends batch (one round trip with its
// other statements) and reports the statements' errors.
func (b *Buffer) FlushInto(ctx context.Context, batch *pgx.Batch) (int, error) {
	if len(b.queues) == 0 {
		b.reset()
		return 0, nil
	}
	before := batch.Len()
	q := &Recorder{Batch: batch}
	for _, k := range b.queues {
		if err := k.f.Flush(ctx, q); err != nil {
			return 0, fmt.Errorf("queuing deferred writes: %w", err)
		}
	}
	b.reset()
	return batch.Len() - before, nil
}

// Recorder is a write-only pgx.Tx whose Exec queues the statement on Batch
// and returns an empty command tag: the statement runs when Batch is sent.
// Everything that would read fails with ErrWriteOnly (or returns nil).
type Recorder struct {
	Batch *pgx.Batch
	// Name names the writer in errors ("handler credit").
	Name string
	// Checks are the checks queued with QueueCheck, in order. The owner of
	// Batch calls each with its statement's command tag once Batch's
	// results are read.
	Checks []Check
}

// Check is the check of one statement queued with [Recorder.QueueCheck].
type Check struct {
	// Statement is the statement's position in the Recorder's Batch.
	Statement int
	// Fn is the check: it gets the statement's command tag and returns
	// an error to refuse the result.
	Fn func(pgconn.CommandTag) error
}

// ErrWriteOnly is the error of a read through a Recorder.
var ErrWriteOnly = errors.New("this transaction only queues writes (a pipelined handler cannot read; use the tx form)")

func (r *Recorder) fail(op string) error {
	if r.Name == "" {
		return fmt.Errorf("%s: %w", op, ErrWriteOnly)
	}
	return fmt.Errorf("%s: %s: %w", r.Name, op, ErrWriteOnly)
}

// Queue queues sql with args (a pipelined handler's handler.Queue).
func (r *Recorder) Queue(sql string, args ...any) { r.Batch.Queue(sql, args...) }

// QueueCheck queues sql with args like Queue and records check for the
// statement in r.Checks (a pipelined handler's handler.Queue). A nil check
// records nothing: the statement is queued as by Queue.
func (r *Recorder) QueueCheck(check func(pgconn.CommandTag) error, sql string, args ...any) {
	r.Batch.Queue(sql, args...)
	if check != nil {
		r.Checks = append(r.Checks, Check{Statement: r.Batch.Len() - 1, Fn: check})
	}
}

// Tx returns r (a pipelined handler's handler.Queue).
func (r *Recorder) Tx() pgx.Tx { return r }

// Exec queues sql with args and returns an empty tag.
func (r *Recorder) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.Batch.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

// Begin fails with ErrWriteOnly.
func (r *Recorder) Begin(context.Context) (pgx.Tx, error) { return nil, r.fail("Begin") }

// Commit fails with ErrWriteOnly: the executor commits.
func (r *Recorder) Commit(context.Context) error { return r.fail("Commit") }

// Rollback fails with ErrWriteOnly: return an error to roll back.
func (r *Recorder) Rollback(context.Context) error { return r.fail("Rollback") }

// CopyFrom fails with ErrWriteOnly.
func (r *Recorder) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, r.fail("CopyFrom")
}

// SendBatch returns results that fail with ErrWriteOnly.
func (r *Recorder) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	return pgx.FailedBatchResults(b, r.fail("SendBatch"))
}

// LargeObjects returns the zero LargeObjects, which cannot be used.
func (r *Recorder) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

// Prepare fails with ErrWriteOnly.
func (r *Recorder) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, r.fail("Prepare")
}

// Query fails with ErrWriteOnly.
func (r *Recorder) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, r.fail("Query")
}

// QueryRow returns a row whose Scan fails with ErrWriteOnly.
func (r *Recorder) QueryRow(context.Context, string, ...any) pgx.Row {
	return failedRow{r.fail("QueryRow")}
}

// Conn returns nil: there is no connection to use yet.
func (r *Recorder) Conn() *pgx.Conn { return nil }

type failedRow struct{ err error }

func (f failedRow) Scan(...any) error { return f.err }
