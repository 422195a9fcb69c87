package handler

import (
	"context"
	"fmt"

	"github.com/exactly-go/exactly/internal/runtime/workunit"
	"github.com/jackc/pgx/v5"
)

// SetFunc is a set-based handler function: it receives the messages of a
// batch that are not duplicates (in offset order) in one call, inside the
// transaction that holds their guard rows, and writes them with set-based
// SQL (INSERT … SELECT FROM unnest(…), COPY). outbox.Add with tx inside it
// queues rows as in a [Func].
//
// When it returns an error, exactly rolls the batch back and bisects it
// under savepoints to find the record that fails alone; that record is
// retried or dead-lettered by itself (see [Func] for retries and
// [Permanent]) and the others commit. It therefore runs several times when
// a record fails (about 2·log2(n) calls on subsets), and must write only
// what its msgs say. When no record fails alone (the batch fails only as a
// whole), the first record of the failing subset is failed with the error;
// so is the first record of the set when the call fails once and then
// succeeds on the same messages (a flaky or state-dependent function): a
// failing call always charges an attempt.
// A panic is recovered and counts as an error. It must not commit or roll
// back tx, and must not keep it after returning. msgs, its messages and
// their records' bytes are the function's own: it may reorder msgs or keep
// it after returning, and no later call touches them.
type SetFunc[T any] func(ctx context.Context, tx pgx.Tx, msgs []Message[T]) error

// Set is a set-based handler. Build it with [NewSet]; it is immutable and
// safe for concurrent use.
//
// Choose it when the batch's writes fit a few set-based statements: it is
// the fastest form (one statement per table for the whole batch), at the
// price of bisecting on failure.
type Set[T any] struct {
	core[T]
	fn SetFunc[T]
	// run is runSet, bound once: every record's SetMember shares it.
	run func(ctx context.Context, tx pgx.Tx, members []any, attempts []int) error
}

// NewSet builds a set-based handler called name whose keys come from key;
// opts are those of [New]. Like New, it never fails: an invalid handler
// reports the problem from Validate, which the consumer calls at start-up.
func NewSet[T any](name string, key KeySource[T], fn SetFunc[T], opts ...Option) *Set[T] {
	h := &Set[T]{core: newCore(name, key, fn == nil, opts), fn: fn}
	h.run = h.runSet
	h.unitHook = workunit.NewHook(h.prepareUnit, h.hasCall)
	return h
}

// prepareUnit decodes rec and derives its key, for the runtime (see
// [Any]). It fails with a [*DecodeError] or a [*KeyError], both permanent.
func (h *Set[T]) prepareUnit(rec Record) (workunit.Prepared, error) {
	p, m, err := h.prepare(rec)
	if err != nil {
		return workunit.Prepared{}, err
	}
	m.set = workunit.SetMember{Group: h, Member: m, RunSet: h.run}
	p.Set = &m.set
	return p, nil
}

// runSet calls fn with the messages of members (each a *prepared[T] of
// this handler) for their attempts.
func (h *Set[T]) runSet(ctx context.Context, tx pgx.Tx, members []any, attempts []int) (err error) {
	defer recoverPanic(&err)
	// A new array for each call, never reused: the function may keep msgs
	// (to act on it after COMMIT, say).
	typed := make([]Message[T], len(members))
	for i, member := range members {
		m, ok := member.(*prepared[T])
		if !ok {
			return fmt.Errorf("handler %q: set member %d is a %T, not one of its records", h.name, i, member)
		}
		if typed[i], err = m.message(attempts[i]); err != nil {
			return err
		}
	}
	return h.fn(ctx, tx, typed)
}
