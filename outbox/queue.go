package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// queue holds the rows one consumer transaction added to one outbox table,
// to insert them at once before COMMIT (internal/txbuf).
type queue struct {
	o       *Outbox
	locks   []int64
	topics  []string
	keys    [][]byte
	values  [][]byte
	headers []*string
}

func (q *queue) add(o *Outbox, msg Message, hdrJSON any) {
	if msg.Key != nil {
		q.locks = append(q.locks, o.keyLockKey(msg.Topic, msg.Key))
	}
	q.topics = append(q.topics, msg.Topic)
	q.keys = append(q.keys, msg.Key)
	q.values = append(q.values, msg.Value)
	var h *string
	if s, ok := hdrJSON.(string); ok {
		h = &s
	}
	q.headers = append(q.headers, h)
}

// Flush inserts the queued rows in one statement: it takes every key's
// lock, in sorted order, before any row's id is drawn, so rows of one key
// are still numbered in commit order, and two batches sharing keys wait for
// each other instead of deadlocking.
func (q *queue) Flush(ctx context.Context, tx pgx.Tx) error {
	if len(q.topics) == 0 {
		return nil
	}
	locks := q.locks
	if locks == nil {
		locks = []int64{}
	}
	if _, err := tx.Exec(ctx, q.o.flushSQL, locks, q.o.channel, q.topics, q.keys, q.values, q.headers); err != nil {
		return fmt.Errorf("outbox: adding %d messages to %s: %w", len(q.topics), q.o.quoted, err)
	}
	return nil
}
