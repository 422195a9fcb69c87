package handler

import (
	"context"
	"errors"
	"fmt"
)

// WithCall gives the handler a pre-transaction call: its slow external
// work (a payment provider, a mail service), which the consumer runs
// before the record's transaction, outside any transaction, concurrently
// with the calls of other keys' records (Config.KeyConcurrency per
// partition, Config.MaxCallsInFlight per instance). The transaction that
// follows, batched with other records', records the result and runs the
// handler's function. A slow call then holds no database connection: the
// partition still uses one, whatever the calls in flight.
//
// fn gets the record's message (decoded afresh, Attempt counting its
// attempts) and should call through [dedupe.Effects.Precall] (or
// dedupe.PrecallJSON) with msg.Scope and msg.Key: the call then passes
// the idempotency key, and the handler's dedupe.Effects.Call (or CallJSON)
// with the same scope, key and table, inside the transaction, records the
// remembered result without calling again. An error from fn is a failed
// attempt of the record, retried with backoff (only its key waits) and
// dead-lettered like a handler's failure; a [Permanent] error
// dead-letters it at once; a panic is recovered as a [*PanicError].
//
// The call is skipped for a record whose guard row exists already (a
// duplicate: one batched read, outside any transaction), and is not run
// again once it succeeded, when the record's transaction is retried. With
// key concurrency off (Config.KeyConcurrency 1) fn is not run: the
// handler's own Call makes the call inside the transaction, as without
// WithCall. fn must have the handler's payload type: a mismatch makes
// [Handler.Validate] report it and the consumer refuse the handler at
// start-up.
//
// If the worker dies between the call and COMMIT, nothing of the record
// committed: the next delivery calls again with the same idempotency key,
// and the provider, which dedupes by that key, returns the original
// result (docs/external-effects.md).
func WithCall[T any](fn func(ctx context.Context, msg Message[T]) error) Option {
	return func(o *options) { o.call = fn }
}

// setCall checks the WithCall function against T and keeps it.
func (c *core[T]) setCall() error {
	switch fn := c.opts.call.(type) {
	case nil:
		return nil
	case func(context.Context, Message[T]) error:
		if fn == nil {
			return errors.New("WithCall was given a nil function")
		}
		c.call = fn
		return nil
	default:
		var zero Message[T]
		return fmt.Errorf("WithCall was given a %T, not a func(context.Context, %T) error", fn, zero)
	}
}

// preCall runs the handler's WithCall function on the record's message
// (message: the first run, its call, gets the value prepare decoded, and
// the transaction's run after it decodes afresh), recovering a panic as a
// *PanicError. The call runs in a goroutine of its own, whose stack a
// decode there would grow first: the transaction's goroutine decodes for a
// whole batch.
func (m *prepared[T]) preCall(ctx context.Context, attempt int) (err error) {
	defer recoverPanic(&err)
	msg, err := m.message(attempt)
	if err != nil {
		return err
	}
	if err := m.h.call(ctx, msg); err != nil {
		return err
	}
	m.called = true
	return nil
}

// hasCall reports whether the handler has a pre-transaction call.
func (c *core[T]) hasCall() bool { return c.call != nil }

// preCalled reports whether preCall succeeded.
func (m *prepared[T]) preCalled() bool { return m.called }
