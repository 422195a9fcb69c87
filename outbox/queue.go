package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/runtime/deferred"
	"github.com/exactly-go/exactly/internal/runtime/pgarray"
)

// queue holds the rows one consumer transaction added to one outbox table,
// to insert them at once before COMMIT (internal/runtime/deferred).
type queue struct {
	o       *Outbox
	topics  []string
	keys    [][]byte
	values  [][]byte
	headers pgarray.NullText
	// wakes: the transaction's buffer wakes the table's relay after
	// COMMIT (registered with the queue's first row).
	wakes bool
}

// newQueue returns an empty queue of o's rows with room for n of them.
func newQueue(o *Outbox, n int) *queue {
	n = max(n, 1)
	return &queue{o: o, topics: make([]string, 0, n), keys: make([][]byte, 0, n),
		values: make([][]byte, 0, n), headers: make(pgarray.NullText, 0, n)}
}

// Reset empties q for a later transaction of the same buffer chain
// (deferred.Buffer.Reuse), keeping its arrays and letting go of its rows.
func (q *queue) Reset() {
	clear(q.topics)
	clear(q.keys)
	clear(q.values)
	clear(q.headers)
	q.topics, q.keys, q.values, q.headers = q.topics[:0], q.keys[:0], q.values[:0], q.headers[:0]
	q.wakes = false
}

var _ deferred.Reusable = (*queue)(nil)

// add queues msg's row. Its key and value are copied: they are written
// at COMMIT, long after Add returned, and a handler may reuse its buffer
// for the next message (a direct Add writes at once, so it may too). With
// ownValue the value is not copied: it was made for this row (AddValue's
// encoding) and nobody else holds it.
func (q *queue) add(msg Message, hdrJSON any, ownValue bool) {
	var key, value []byte
	if ownValue {
		key, _ = ownBytes(msg.Key, nil)
		value = msg.Value
	} else {
		key, value = ownBytes(msg.Key, msg.Value)
	}
	q.topics = append(q.topics, msg.Topic)
	q.keys = append(q.keys, key)
	q.values = append(q.values, value)
	s, ok := hdrJSON.(string)
	q.headers = append(q.headers, pgarray.NullString{S: s, Valid: ok})
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
		var h *string
		if q.headers[0].Valid {
			h = &q.headers[0].S
		}
		_, err = tx.Exec(ctx, q.o.sql().flushOneSQL, q.topics[0], q.keys[0], q.values[0], h)
	default:
		_, err = tx.Exec(ctx, q.o.sql().flushSQL, pgarray.Text(pgarray.Once(q.topics)), pgarray.Bytea(q.keys), noneIfNull(q.headers), pgarray.Bytea(q.values))
	}
	if err != nil {
		return fmt.Errorf("outbox: adding %d messages to %s: %w", len(q.topics), q.o.quoted, err)
	}
	return nil
}

// noneIfNull returns headers, or none when every row's is null (flushSQL
// reads a missing one as null).
func noneIfNull(headers pgarray.NullText) pgarray.NullText {
	for _, h := range headers {
		if h.Valid {
			return headers
		}
	}
	return headers[:0]
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
