package handler

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/internal/runtime/workunit"
)

// Queue collects the writes of a [Pipelined] handler. Nothing is executed
// when the handler calls it: the executor sends the queued statements of
// every record of the batch, the outbox rows and the outcome counters in
// one pipeline (one round trip), then commits.
type Queue interface {
	// Queue queues one statement with its arguments. Its result is not
	// read: a statement that fails (a constraint violation, say) fails its
	// record, which is then retried or dead-lettered alone, and the other
	// records of the batch commit. So does one that runs too long: the
	// pipeline sets statement_timeout to most of what is left of the batch
	// deadline (unless the session already has one), so the server ends
	// it (SQLSTATE 57014) as an attempt of its record. The arguments are encoded when the
	// pipeline is sent, after the handler returned (as with pgx.Batch):
	// do not change a slice or buffer once it is queued; pass a fresh
	// one per statement.
	Queue(sql string, args ...any)
	// QueueCheck queues one statement like Queue and has check judge its
	// result: once the batch's pipeline has run, and before anything
	// commits, check is called with the statement's command tag (pgx's
	// habit, as in pgx.QueuedQuery.Exec). Use [RowsAffected] to require
	// that an UPDATE touched exactly one row. An error from check (or a
	// panic in it) fails the record exactly like a failing statement: the
	// batch rolls back, the record is retried and then dead-lettered
	// alone (at once when check returns a [Permanent] error), and the
	// batch's other records commit. A statement that fails fails its
	// record without calling check. check must only inspect the tag: it
	// may run more than once per record (once per pass of its batch), and
	// one that does not return within the batch deadline is an attempt of
	// its record, like a handler that overruns it. A nil check makes
	// QueueCheck a Queue.
	//
	// A batch with a checked statement costs one more round trip: COMMIT
	// cannot share the pipeline (the server would commit before the tag
	// is read), so it is sent alone once every check has passed.
	QueueCheck(check func(pgconn.CommandTag) error, sql string, args ...any)
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
// balance, add an outbox row): a batch then costs two round trips (BEGIN
// with the lock keys and the guard claims; the pipeline with COMMIT)
// instead of one per statement, or three when a statement is queued with
// [Queue.QueueCheck] (COMMIT then goes alone, after the checks). Handlers
// that must read keep the [Func] form ([New]); handlers that can write a
// whole batch with one set-based statement use [NewSet].
type Pipelined[T any] struct {
	core[T]
	fn PipeFunc[T]
}

// NewPipelined builds a pipelined handler called name whose keys come from
// key; opts are those of [New]. Like New, it never fails: an invalid
// handler reports the problem from Validate, which the consumer calls at
// start-up.
func NewPipelined[T any](name string, key KeySource[T], fn PipeFunc[T], opts ...Option) *Pipelined[T] {
	h := &Pipelined[T]{core: newCore(name, key, fn == nil, opts), fn: fn}
	h.unitHook = workunit.NewHook(h.prepareUnit, h.hasCall)
	return h
}

// prepareUnit decodes rec and derives its key, for the runtime (see
// [Any]). It fails with a [*DecodeError] or a [*KeyError], both permanent.
func (h *Pipelined[T]) prepareUnit(rec Record) (workunit.Prepared, error) {
	p, m, err := h.prepare(rec)
	if err != nil {
		return workunit.Prepared{}, err
	}
	m.pipe = h.fn
	p.Pipe = m
	return p, nil
}

// Pipe runs the record's pipelined handler with w (workunit.Piper); a
// panic in it is recovered into a *PanicError.
func (m *prepared[T]) Pipe(ctx context.Context, w workunit.Writer, attempt int) (err error) {
	defer recoverPanic(&err)
	msg, err := m.message(attempt)
	if err != nil {
		return err
	}
	return m.pipe(ctx, w, msg)
}

// RowsAffectedError is the error of a [RowsAffected] check: the statement
// affected Got rows where Want were required. Reach it with errors.As from
// the reason of a dead-lettered record.
type RowsAffectedError struct {
	// Want is the number of rows required, Got the number affected.
	Want, Got int64
	// Command is the statement's command ("UPDATE", say), from its tag.
	Command string
}

// Error names the command and both counts.
func (e *RowsAffectedError) Error() string {
	cmd := e.Command
	if cmd == "" {
		cmd = "the statement"
	}
	return fmt.Sprintf("%s affected %d rows, want %d", cmd, e.Got, e.Want)
}

// RowsAffected returns a check for [Queue.QueueCheck] that refuses a
// result unless its statement affected exactly n rows (an UPDATE of an
// account that must exist: n = 1). It fails with a [*RowsAffectedError];
// the record is then retried, and dead-lettered alone at its last attempt.
// Wrap it to dead-letter at once:
//
//	func(tag pgconn.CommandTag) error {
//		if err := handler.RowsAffected(1)(tag); err != nil {
//			return handler.Permanent(err)
//		}
//		return nil
//	}
func RowsAffected(n int64) func(pgconn.CommandTag) error {
	return func(tag pgconn.CommandTag) error {
		if got := tag.RowsAffected(); got != n {
			cmd, _, _ := strings.Cut(tag.String(), " ")
			return &RowsAffectedError{Want: n, Got: got, Command: cmd}
		}
		return nil
	}
}
