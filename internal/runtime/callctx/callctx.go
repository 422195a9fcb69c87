// Package callctx carries, in a context, the effects table of the service
// whose consumer runs a record (the one its guard names), so that a handler
// built with handler.NewWithCall records its call's result where the
// service's guard keeps effects, whatever table the service configured
// (EXACTLY_GUARD_TABLE), without the handler being told.
package callctx

import (
	"context"

	"github.com/exactly-go/exactly/dedupe"
)

type ctxKey struct{}

// With returns ctx carrying e.
func With(ctx context.Context, e *dedupe.Effects) context.Context {
	return context.WithValue(ctx, ctxKey{}, e)
}

// From returns the effects ctx carries, or nil.
func From(ctx context.Context) *dedupe.Effects {
	e, _ := ctx.Value(ctxKey{}).(*dedupe.Effects)
	return e
}
