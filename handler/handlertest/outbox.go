package handlertest

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/outbox"
)

// OutboxOpts narrows what [RequireOutboxed] and [RequireOutboxCount] look
// at. A nil *OutboxOpts means the defaults.
type OutboxOpts struct {
	// Outbox is the outbox table; nil means outbox.New() (the default table).
	Outbox *outbox.Outbox
	// Key, when not nil, matches only rows with this Kafka key.
	Key []byte
	// Codec decodes the value in RequireOutboxed; nil means handler.JSON{}.
	Codec handler.Codec
}

// Outboxed is one outbox row a handler wrote, its value decoded.
type Outboxed[T any] struct {
	// Topic and Key are where the relay will publish it.
	Topic string
	Key   []byte
	// Value is the decoded value.
	Value T
	// Headers are the stored headers (a traceparent among them when the
	// handler ran in a trace).
	Headers []handler.Header
}

// RequireOutboxed fails t unless the outbox holds exactly one row for
// topic (and opts.Key, when set), and returns it with its value decoded
// into T. It fails t, saying why, when the table cannot be read or the
// value does not decode.
func RequireOutboxed[T any](ctx context.Context, t TB, pool *pgxpool.Pool, topic string, opts *OutboxOpts) Outboxed[T] {
	t.Helper()
	rows := outboxRows(ctx, t, pool, topic, opts)
	if len(rows) != 1 {
		t.Fatalf("handlertest: %d outbox rows for topic %q%s, want exactly one", len(rows), topic, keyNote(opts))
	}
	codec := handler.Codec(handler.JSON{})
	if opts != nil && opts.Codec != nil {
		codec = opts.Codec
	}
	out := Outboxed[T]{Topic: topic, Key: rows[0].key, Headers: rows[0].headers}
	if err := codec.Unmarshal(rows[0].value, &out.Value); err != nil {
		t.Fatalf("handlertest: decoding the outbox row for topic %q with %s: %v", topic, codec.Name(), err)
	}
	return out
}

// RequireOutboxCount fails t unless the outbox holds exactly n rows for
// topic (and opts.Key, when set); n = 0 asserts that a handler emitted
// nothing there.
func RequireOutboxCount(ctx context.Context, t TB, pool *pgxpool.Pool, topic string, n int, opts *OutboxOpts) {
	t.Helper()
	if got := len(outboxRows(ctx, t, pool, topic, opts)); got != n {
		t.Fatalf("handlertest: %d outbox rows for topic %q%s, want %d", got, topic, keyNote(opts), n)
	}
}

type outboxRow struct {
	key, value []byte
	headers    []handler.Header
}

func keyNote(opts *OutboxOpts) string {
	if opts == nil || opts.Key == nil {
		return ""
	}
	return fmt.Sprintf(" and key %q", opts.Key)
}

// outboxRows reads the rows of topic (and key) in id order.
func outboxRows(ctx context.Context, t TB, pool *pgxpool.Pool, topic string, opts *OutboxOpts) []outboxRow {
	t.Helper()
	ob := outbox.New()
	var key []byte
	if opts != nil {
		if opts.Outbox != nil {
			ob = opts.Outbox
		}
		key = opts.Key
	}
	rows, err := pool.Query(ctx, `select key, value, headers::text from `+ob.Table().Sanitize()+
		` where topic = $1 and ($2::bytea is null or key = $2) order by id`, topic, key)
	if err != nil {
		t.Fatalf("handlertest: reading outbox table %s: %v", ob.Table().Sanitize(), err)
	}
	defer rows.Close()
	var out []outboxRow
	for rows.Next() {
		var r outboxRow
		var hdr *string
		if err := rows.Scan(&r.key, &r.value, &hdr); err != nil {
			t.Fatalf("handlertest: reading outbox table %s: %v", ob.Table().Sanitize(), err)
		}
		if hdr != nil {
			var stored []struct {
				Key   string `json:"key"`
				Value []byte `json:"value"`
			}
			if err := json.Unmarshal([]byte(*hdr), &stored); err != nil {
				t.Fatalf("handlertest: decoding outbox headers %s: %v", *hdr, err)
			}
			for _, h := range stored {
				r.headers = append(r.headers, handler.Header{Key: h.Key, Value: h.Value})
			}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("handlertest: reading outbox table %s: %v", ob.Table().Sanitize(), err)
	}
	return out
}
