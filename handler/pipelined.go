package handler

import (
	"context"

	"github.com/exactly-go/exactly/internal/runtime/hrun"
	"github.com/jackc/pgx/v5"
)

// Queue collects the writes of a [Pipelined] handler. Nothing is executed
// when the handler calls it: the executor sends the queued statements of
// every record of the batch, the outbox rows and the outcome counters in
// one pipeline (one round trip), then commits.
type Queue interface {
	// Queue queues one statement with its arguments. Its result is never
	// read: a statement that fails (a constraint violation, say) fails its
	// record, which is then retried or dead-lettered alone, and the other
	// records of the batch commit.
	Queue(sql string, args ...any)
	// Tx returns a write-only transaction for helpers that take a pgx.Tx,
	// such as outbox.Add: its Exec queues like Queue, and everything that
	// reads (Query, QueryRow, CopyFrom, SendBatch, Begin, Conn) fails or
	// returns nil, since the handler runs before anything is sent.
	Tx() pgx.Tx
}

// PipeFunc is a pipelined handler function: it queues the record's writes
// on q instead of executing them, so it cannot read the database. Returning
// an error fails the record (see [Func] for retries and [Permanent]); a
// panic is recovered and counts as an error. A pipelined handler may run
// more than once per applied effect (its earlier run rolled back with its
// batch); each run gets its value decoded afresh.
type PipeFunc[T any] func(ctx context.Context, q Queue, msg Message[T]) error

// Pipelined is a handler whose writes are queued and sent in one pipeline
// with the rest of its batch's writes. Build it with [NewPipelined]; it is
// immutable and safe for concurrent use.
//
// Choose it for handlers that only write (insert a ledger row, upsert a
// balance, add an outbox row): a batch then costs four round trips (BEGIN,
// the guard claim, the pipeline, COMMIT) instead of one per statement.
// Handlers that must read keep the [Func] form ([New]); handlers that can
// write a whole batch with one set-based statement use [NewSet].
type Pipelined[T any] struct {
	core[T]
	fn PipeFunc[T]
}

// NewPipelined builds a pipelined handler called name whose keys come from
// key; opts are those of [New]. Like New, it never fails: an invalid
// handler reports the problem from Validate, which the consumer calls at
// start-up.
func NewPipelined[T any](name string, key KeySource[T], fn PipeFunc[T], opts ...Option) *Pipelined[T] {
	return &Pipelined[T]{core: newCore(name, key, fn == nil, opts), fn: fn}
}

// Prepare decodes rec and derives its key, for the runtime (see [Any]). It
// fails with a [*DecodeError] or a [*KeyError], both permanent.
func (h *Pipelined[T]) Prepare(rec Record) (hrun.Prepared, error) {
	p, m, err := h.prepare(rec)
	if err != nil {
		return hrun.Prepared{}, err
	}
	p.Pipe = func(ctx context.Context, w hrun.Writer, attempt int) (err error) {
		defer recoverPanic(&err)
		msg, err := m.message(attempt)
		if err != nil {
			return err
		}
		return h.fn(ctx, w, msg)
	}
	return p, nil
}
