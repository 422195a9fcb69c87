package handler

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// DeadLetterFunc writes rec to its dead-letter topic inside tx, the
// transaction that also lets rec's offset advance. handlerName is the
// handler the record was meant for ("" when none could be chosen),
// attempts the number of times a handler ran on it (0 when it could not be
// decoded or keyed), and reason why it is dead-lettered. rec is a copy of
// the record (Record.Clone), the function's to keep.
//
// outbox.DeadLetters returns one that writes through the outbox; pass it to
// consumer.WithDeadLetters (consumer.Service does so by default). An error
// fails the whole transaction, which the consumer then retries as an
// outage: a dead-letter sink that cannot write holds the partition, it
// never drops the record.
type DeadLetterFunc func(ctx context.Context, tx pgx.Tx, rec Record, handlerName string, attempts int, reason error) error
