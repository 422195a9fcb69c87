// Package hrun is the executor's view of a prepared record: what a handler
// (package handler) hands the executor (internal/runtime/apply) after
// decoding and keying a record. It lives here, not in the public handler
// package, because only the runtime runs prepared records.
package hrun

import (
	"context"

	"github.com/jackc/pgx/v5"
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
	// Run calls the handler inside tx; attempt starts at 1. A panic in the
	// handler is recovered and returned as a *handler.PanicError.
	Run func(ctx context.Context, tx pgx.Tx, attempt int) error
}
