// Package workunit is the executor's view of a prepared record: what a handler
// (package handler) hands the executor (internal/runtime/apply) after
// decoding and keying a record. It lives here, not in the public handler
// package, because only the runtime runs prepared records.
package workunit

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Prepared is a decoded record with its key, ready to run.
type Prepared struct {
	// Key is the record's deduplication key.
	Key string
	// Scope is the namespace of Key in the guard table (the chosen
	// handler's: a router's records each carry their own).
	Scope string
	// Handler is the name of the handler that runs the record.
	Handler string
	// Unguarded is set when that handler is NaturallyIdempotent: the record
	// claims no guard row (per record, since a router's handlers differ).
	Unguarded bool
	// Run calls the handler inside tx; attempt starts at 1. A panic in the
	// handler is recovered and returned as a *handler.PanicError. It is
	// nil for the pipelined and set-based forms. An interface, not a func,
	// so the prepared record itself runs it: no closure per record.
	Run Runner
	// Pipe, set for a pipelined handler, calls it with a Writer that
	// queues its statements; the executor sends them later, in one
	// pipeline with the rest of the batch's writes. An interface, as Run
	// is: no closure per record.
	Pipe Piper
	// Set, set for a set-based handler, is the record's membership of the
	// handler's set call.
	Set *SetMember
	// Call, set for a handler built with handler.WithCall, runs the
	// handler's pre-transaction call (its slow external work) outside any
	// transaction (attempt starts at 1) and keeps its result for the
	// record's runs; Called
	// reports whether it succeeded. The runtime calls Call at most once at
	// a time, before the transaction that runs the record, and not again
	// once Called.
	Call   func(ctx context.Context, attempt int) error
	Called func() bool
	// LockKeys are the lock keys the record touches (handler.WithLockKeys),
	// a copy of what the lock-key function returned, which no handler can
	// change: the executor takes the batch's keys, sorted, before any
	// handler runs, in every pass.
	LockKeys []string
	// Release, when set, hands the prepared record back to its handler
	// for a later record. The runtime calls it at most once, after the
	// record finished (committed or dead-lettered) and when nothing of
	// the runtime's refers to the Prepared any more: a call before that,
	// or a second one, hands another record's run this record's state.
	// A runtime that never calls it loses nothing but the reuse.
	Release Releaser
}

// Releaser hands a prepared record back for reuse (Prepared.Release).
type Releaser interface {
	// Release hands the prepared record back; it cannot fail.
	Release()
}

// Writer receives a pipelined handler's statements (handler.Queue has the
// same methods).
type Writer interface {
	// Queue queues one statement.
	Queue(sql string, args ...any)
	// QueueCheck queues one statement whose command tag check is given
	// once the pipeline's results are read, before COMMIT; an error from
	// check fails the record like a failing statement.
	QueueCheck(check func(pgconn.CommandTag) error, sql string, args ...any)
	// Tx returns a write-only transaction whose Exec queues.
	Tx() pgx.Tx
}

// SetMember is a record of a set-based handler. Records whose Group is the
// same handler are run by one call of RunSet.
type SetMember struct {
	// Group identifies the set function (the handler).
	Group any
	// Member is the handler's own state of the record, handed back to
	// RunSet.
	Member any
	// RunSet calls the handler inside tx with the messages of members
	// (each a SetMember.Member of this Group) for their attempts: each
	// message is decoded afresh after its first use and has its own copy of
	// the record's bytes and headers. A message that cannot be decoded
	// again fails the call, and a panic is recovered and returned as an
	// error. members and attempts are read during the call only: the
	// caller may reuse them for its next call.
	RunSet func(ctx context.Context, tx pgx.Tx, members []any, attempts []int) error
}

// Preparer is what the runtime calls on a handler: PrepareUnit decodes and
// keys rec (a handler.Record; R keeps this package free of the handler
// package, which imports it). handler.Any embeds it under an unexported
// alias, so every handler has the method and the public documentation
// names neither it nor Prepared.
type Preparer[R any] interface {
	// PrepareUnit decodes rec and derives its key; it fails with the
	// handler's permanent error (a decode, key or route error) when rec
	// cannot become a message.
	PrepareUnit(rec R) (Prepared, error)
	// UnitCalls reports whether the handler's records may have a
	// pre-transaction call (Prepared.Call): the consumer gives the
	// partitions of such handlers a share of its call slots.
	UnitCalls() bool
}

// Hook is a [Preparer] built from a function. The handler package embeds
// it, under an unexported alias, in each handler type, which then has the
// PrepareUnit method without documenting it.
type Hook[R any] struct {
	prepare func(R) (Prepared, error)
	calls   func() bool
}

// NewHook returns a Hook whose PrepareUnit calls prepare and whose
// UnitCalls calls calls (nil: the handler makes no pre-transaction call).
func NewHook[R any](prepare func(R) (Prepared, error), calls func() bool) Hook[R] {
	return Hook[R]{prepare: prepare, calls: calls}
}

// UnitCalls reports what the hook's calls function reports (false when
// it has none).
func (h Hook[R]) UnitCalls() bool { return h.calls != nil && h.calls() }

// PrepareUnit calls the hook's function; it fails as that function does,
// and with an error when the hook was never set (a handler built without
// its constructor, such as a zero handler.Handler).
func (h Hook[R]) PrepareUnit(rec R) (Prepared, error) {
	if h.prepare == nil {
		return Prepared{}, errors.New("handler was not built with its constructor (handler.New, NewPipelined, NewSet or NewRouter)")
	}
	return h.prepare(rec)
}

// Piper runs a pipelined handler's record (see Prepared.Pipe).
type Piper interface {
	// Pipe calls the pipelined handler with w, which queues its
	// statements; attempt starts at 1. It returns the handler's error,
	// or a *handler.PanicError for a panic.
	Pipe(ctx context.Context, w Writer, attempt int) error
}

// Runner runs a prepared record's handler (see Prepared.Run).
type Runner interface {
	// Run calls the handler inside tx; attempt starts at 1. It returns
	// the handler's error, or a *handler.PanicError for a panic.
	Run(ctx context.Context, tx pgx.Tx, attempt int) error
}
