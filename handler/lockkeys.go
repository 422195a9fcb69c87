package handler

import (
	"fmt"
	"slices"
)

// WithLockKeys declares the lock keys a record touches: the rows its
// handler locks, named by the caller ("account:7"). Both accounts of a
// transfer, for example:
//
//	handler.WithLockKeys(func(t Transfer) []string {
//		return []string{"account:" + t.From, "account:" + t.To}
//	})
//
// Before any handler of a batch runs, the executor takes a transaction-level
// advisory lock on every distinct key of the batch, in one statement and in
// one global order (sorted 64-bit hashes of the keys). Batches of any
// partition and any process that touch the same keys then wait for each
// other instead of deadlocking, provided every writer of those rows
// declares them. A key shared by two rows only serializes more; a row
// locked without declaring its key can still deadlock.
//
// fn runs once per record when it is prepared, on the decoded payload; the
// runtime keeps a copy of the keys it returns, so the handler may change
// the slice (or the payload it came from) without changing the locks. A
// panic in fn fails the record with a permanent [*KeyError]. fn must have
// the handler's payload type: a mismatch makes [Handler.Validate] report it
// and the consumer refuse the handler at start-up.
func WithLockKeys[T any](fn func(T) []string) Option {
	return func(o *options) { o.lockKeys = fn }
}

// deriveLockKeys runs the lock-key function, turning a panic into a
// *KeyError.
func (h *core[T]) deriveLockKeys(v T) (keys []string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &KeyError{Source: "lock keys", Reason: fmt.Sprintf("the lock-key function panicked: %v", r)}
		}
	}()
	// A copy: the slice fn returns may be part of v (a field), which the
	// first run of the handler gets and may change, and the executor takes
	// the locks again on every replay of the batch.
	return slices.Clone(h.lockKeys(v)), nil
}
