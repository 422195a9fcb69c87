package handler

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/runtime/callctx"
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
// duplicate: one batched read, outside any transaction, when the record's
// turn comes if an earlier record of its key was unfinished), and is not run
// again once it succeeded, when the record's transaction is retried. With
// key concurrency off (Config.KeyConcurrency 1) fn is not run: the
// handler's own Call makes the call inside the transaction, as without
// WithCall. fn must have the handler's payload type: a mismatch makes
// [Handler.Validate] report it and the consumer refuse the handler at
// start-up.
//
// fn must honour ctx. Its deadline is Config.CallTimeout
// (EXACTLY_CALL_TIMEOUT): a call past it is a failed attempt; a call still
// running after half of it is logged and listed as held while it runs. At
// revoke and shutdown ctx is cancelled and the consumer waits for fn at
// most Config.CallTimeout (and at most 5 s), then abandons it: its result
// is dropped, and the next owner calls again with the same idempotency
// key. A call that ignores ctx holds its key and a call slot (of its
// partition's share of Config.MaxCallsInFlight) until it returns.
//
// If the worker dies between the call and COMMIT, nothing of the record
// committed: the next delivery calls again with the same idempotency key,
// and the provider, which dedupes by that key, returns the original
// result (docs/external-effects.md). [NewWithCall] declares the call once
// instead of in fn and again in the handler.
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

// CallFunc is the external call of a handler built with [NewWithCall]: it
// calls the other system for msg, passing idempotencyKey (msg.Key,
// normalized by dedupe.NormalizeKey) as the request's idempotency key, and
// returns the system's answer. It must honour ctx: its deadline is
// Config.CallTimeout, and it is cancelled at revoke and shutdown.
type CallFunc[T, R any] func(ctx context.Context, msg Message[T], idempotencyKey string) (R, error)

// CalledFunc is the transaction function of a handler built with
// [NewWithCall]: a [Func] that also gets the call's result, recorded in
// the same transaction.
type CalledFunc[T, R any] func(ctx context.Context, tx pgx.Tx, msg Message[T], result R) error

// NewWithCall builds a handler whose external call is declared once: call
// makes it (outside any transaction, before the record's transaction, as
// [WithCall] runs a call) and fn gets its result inside the transaction,
// which records the result in the effects table of the consumer's guard
// (Config.GuardTable, EXACTLY_GUARD_TABLE: the same table whatever the
// service configured). The call, its idempotency key (msg.Key) and what
// the call validates are written once, so they cannot drift between a
// WithCall function and the handler.
//
// A record's call is made at most once per delivery while its result is
// remembered: not again when its transaction is retried, not at all when
// its guard row exists (a duplicate) or a result is recorded for its key
// (the recorded result is handed to fn). R is encoded with encoding/json
// (dedupe.CallJSON records it). With key concurrency off
// (Config.KeyConcurrency 1) call is made inside the transaction instead.
// An error from call is a failed attempt of the record (a [Permanent] one
// dead-letters it at once); so is a call past Config.CallTimeout, whose
// context then ends.
//
// call must honour ctx. A call that ignores it holds its key and a call
// slot until it returns; at revoke and shutdown the consumer waits for it
// at most Config.CallTimeout (and at most 5 s), then abandons it: its
// result is dropped and the next owner calls again with the same
// idempotency key, which the other system must dedupe.
//
// Like [New], it never fails: a nil call or fn, or a [WithCall] option
// among opts, is reported by [Handler.Validate].
func NewWithCall[T, R any](name string, key KeySource[T], call CallFunc[T, R], fn CalledFunc[T, R], opts ...Option) *Handler[T] {
	defaults := dedupe.NewEffects(nil) // where no consumer says (a test calling the handler directly)
	effects := func(ctx context.Context) *dedupe.Effects {
		if e := callctx.From(ctx); e != nil {
			return e
		}
		return defaults
	}
	bind := func(msg Message[T]) func(context.Context, string) (R, error) {
		return func(ctx context.Context, idempotencyKey string) (R, error) {
			return call(ctx, msg, idempotencyKey)
		}
	}
	var run Func[T]
	if fn != nil {
		run = func(ctx context.Context, tx pgx.Tx, msg Message[T]) error {
			r, err := dedupe.CallJSON(ctx, effects(ctx), tx, msg.Scope, msg.Key, bind(msg))
			if err != nil {
				return err
			}
			return fn(ctx, tx, msg, r)
		}
	}
	var given options
	for _, o := range opts {
		o(&given)
	}
	pre := func(ctx context.Context, msg Message[T]) error {
		_, err := dedupe.PrecallJSON(ctx, effects(ctx), msg.Scope, msg.Key, bind(msg))
		return err
	}
	h := New(name, key, run, append(opts[:len(opts):len(opts)], WithCall(pre))...)
	if h.valid == nil {
		switch {
		case call == nil:
			h.valid = fmt.Errorf("handler %q: NewWithCall was given a nil call", name)
		case given.call != nil:
			h.valid = fmt.Errorf("handler %q: NewWithCall declares the call; remove the WithCall option", name)
		}
	}
	return h
}
