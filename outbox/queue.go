package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/runtime/pgarray"
)

// queue holds the rows one consumer transaction added to one outbox table,
// to insert them at once before COMMIT (internal/runtime/deferred).
type queue struct {
	o       *Outbox
	topics  []string
	keys    [][]byte
	values  [][]byte
	headers []*string
}

// add queues msg's row. Its key and value are copied: they are written
// at COMMIT, long after Add returned, and a handler may reuse its buffer
// for the next message (a direct Add writes at once, so it may too).
func (q *queue) add(msg Message, hdrJSON any) {
	key, value := ownBytes(msg.Key, msg.Value)
	q.topics = append(q.topics, msg.Topic)
	q.keys = append(q.keys, key)
	q.values = append(q.values, value)
	var h *string
	if s, ok := hdrJSON.(string); ok {
		h = &s
	}
	q.headers = append(q.headers, h)
}

// Flush inserts the queued rows in one statement, without key locks and
// without notifying: the ids are drawn here, after the handlers' reads and
// writes, which is what keeps dependent rows of one key in commit order
// (see "The relay's ordering argument" in docs/design.md). The consumer
// wakes the relay after COMMIT.
func (q *queue) Flush(ctx context.Context, tx pgx.Tx) error {
	var err error
	switch len(q.topics) {
	case 0:
		return nil
	case 1:
		// One row (a batch of one record, say): a plain VALUES insert,
		// which the server starts faster than unnest's function scan.
		_, err = tx.Exec(ctx, q.o.sql().flushOneSQL, q.topics[0], q.keys[0], q.values[0], q.headers[0])
	default:
		_, err = tx.Exec(ctx, q.o.sql().flushSQL, pgarray.Text(q.topics), pgarray.Bytea(q.keys), pgarray.Bytea(q.values), q.headers)
	}
	if err != nil {
		return fmt.Errorf("outbox: adding %d messages to %s: %w", len(q.topics), q.o.quoted, err)
	}
	return nil
}

// ownBytes returns copies of key and value in one allocation, keeping a
// nil one nil (a keyless row's key is NULL, not empty).
func ownBytes(key, value []byte) ([]byte, []byte) {
	if key == nil && value == nil {
		return nil, nil
	}
	buf := make([]byte, len(key)+len(value))
	k, v := buf[:copy(buf, key):len(key)], buf[len(key):]
	copy(v, value)
	if key == nil {
		k = nil
	}
	if value == nil {
		v = nil
	}
	return k, v
}
