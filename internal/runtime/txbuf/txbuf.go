// Package txbuf lets writes made inside a transaction be deferred to just
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
package txbuf

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Flusher is a writer's queue for one transaction.
type Flusher interface {
	// Flush issues the queued writes in tx. It fails with the database's
	// error; tx is then aborted.
	Flush(ctx context.Context, tx pgx.Tx) error
}

// Buffer holds the queues of one transaction. It is used by one goroutine
// (the one running the transaction's handlers) and is not safe for
// concurrent use.
type Buffer struct {
	tx       pgx.Tx
	order    []any
	flushers map[any]Flusher
	// after holds the callbacks to run once tx has committed, by key.
	afterKeys []any
	after     map[any]func(pool *pgxpool.Pool)
}

type ctxKey struct{}

// With returns ctx carrying b.
func With(ctx context.Context, b *Buffer) context.Context {
	return context.WithValue(ctx, ctxKey{}, b)
}

// New returns an empty buffer for tx.
func New(tx pgx.Tx) *Buffer { return &Buffer{tx: tx, flushers: map[any]Flusher{}} }

// For returns the buffer ctx carries for tx, or nil when it carries none or
// one for another transaction (a nested one, say): the caller then writes at
// once.
func For(ctx context.Context, tx pgx.Tx) *Buffer {
	b, _ := ctx.Value(ctxKey{}).(*Buffer)
	if b == nil || b.tx != tx {
		return nil
	}
	return b
}

// Queue returns the queue registered under key, creating it with create on
// first use. Queues flush in the order they were created.
func (b *Buffer) Queue(key any, create func() Flusher) Flusher {
	f, ok := b.flushers[key]
	if !ok {
		f = create()
		b.flushers[key] = f
		b.order = append(b.order, key)
	}
	return f
}

// Flush flushes every queue, in creation order, and empties the buffer. It
// fails with the first queue's error.
func (b *Buffer) Flush(ctx context.Context) error {
	for _, k := range b.order {
		if err := b.flushers[k].Flush(ctx, b.tx); err != nil {
			return fmt.Errorf("flushing deferred writes: %w", err)
		}
	}
	b.order, b.flushers = nil, map[any]Flusher{}
	return nil
}

// AfterCommit registers fn to run after the transaction has committed, once
// per key: a second registration under the same key is ignored. Callbacks
// never run when the transaction rolls back. They run on the committing
// goroutine, in registration order, and must not block.
func (b *Buffer) AfterCommit(key any, fn func(pool *pgxpool.Pool)) {
	if _, ok := b.after[key]; ok {
		return
	}
	if b.after == nil {
		b.after = map[any]func(*pgxpool.Pool){}
	}
	b.after[key] = fn
	b.afterKeys = append(b.afterKeys, key)
}

// Committed runs the AfterCommit callbacks with pool (the pool the
// transaction came from, for work outside it) and forgets them. The
// transaction's owner calls it once COMMIT has succeeded; a nil b does
// nothing.
func (b *Buffer) Committed(pool *pgxpool.Pool) {
	if b == nil {
		return
	}
	keys, after := b.afterKeys, b.after
	b.afterKeys, b.after = nil, nil
	for _, k := range keys {
		after[k](pool)
	}
}
