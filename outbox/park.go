package outbox

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/exactly-go/exactly/internal/runtime/telemetry"
)

// MetricOutboxParked is the gauge of parked outbox rows (Prometheus:
// exactly_outbox_parked), observed by a relay with a MeterProvider.
const MetricOutboxParked = "exactly.outbox.parked"

// maxReasonBytes bounds a stored park reason.
const maxReasonBytes = 1024

// Parked is an outbox row the relay parked because it can never be
// published as it is.
type Parked struct {
	// ID is the row's id in the outbox table.
	ID int64
	// MessageID is the row's message id (its UUID).
	MessageID string
	// Topic and Key are the row's topic and key (nil for a keyless row).
	Topic string
	Key   []byte
	// ParkedAt is when the relay parked it.
	ParkedAt time.Time
	// Reason is why: the produce error or the check that failed.
	Reason string
	// Bytes is the size of its key and value.
	Bytes int
	// Held counts the later rows of the same (topic, key) waiting behind
	// it (always 0 for a keyless row, and in Retry's and Drop's results).
	Held int64
}

// ParkFilter selects parked rows. The zero value selects every parked row.
type ParkFilter struct {
	// Topic, when not empty, selects only rows of this topic.
	Topic string
	// Key, when non-nil, selects only rows with exactly this key.
	Key []byte
	// ID, when not 0, selects only the row with this id.
	ID int64
}

func (f ParkFilter) args() []any {
	var key any // nil: any key
	if f.Key != nil {
		key = f.Key
	}
	return []any{f.Topic, key, f.ID}
}

// Parked returns o's parked rows selected by f, oldest first, each with the
// number of rows held behind it. It fails with the wrapped database error
// (for instance when the table predates migration 2: run Migrate).
func (o *Outbox) Parked(ctx context.Context, q Querier, f ParkFilter) ([]Parked, error) {
	out, err := o.parkedRows(ctx, q, o.sql().parkedSQL, f.args()...)
	if err != nil {
		return nil, fmt.Errorf("outbox: listing parked rows of %s: %w", o.quoted, err)
	}
	return out, nil
}

// ParkedCount returns how many of o's rows are parked. It fails with the
// wrapped database error.
func (o *Outbox) ParkedCount(ctx context.Context, q Querier) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, o.sql().parkedCountSQL).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: counting parked rows of %s: %w", o.quoted, err)
	}
	return n, nil
}

// Retry releases the parked rows selected by f, after the cause was fixed
// (the topic created, an ACL granted, a limit raised), and wakes the relay:
// it publishes them, and the rows held behind them, in id order, or parks
// them again if they still fail. It returns the rows released. It fails
// with the wrapped database error, releasing nothing.
//
// The relay is woken after the statement, never inside it (a notifying
// transaction's commit is serialised with every other one's): when q is a
// pool or a connection, the statement has committed when Retry returns, and
// Retry wakes the relays built from o in this process and, when none of
// them is the active relay, notifies o's channel through q in a statement
// of its own. When q is a pgx.Tx, Retry cannot know when it commits: call
// o.Wake after COMMIT (without it the relay finds the rows at its next
// poll).
func (o *Outbox) Retry(ctx context.Context, q Querier, f ParkFilter) ([]Parked, error) {
	out, err := o.parkedRows(ctx, q, o.sql().retrySQL, f.args()...)
	if err != nil {
		return nil, fmt.Errorf("outbox: releasing parked rows of %s: %w", o.quoted, err)
	}
	if len(out) > 0 {
		o.wakeAfter(ctx, q)
	}
	return out, nil
}

// Drop deletes the parked rows selected by f, which are then never
// published, and wakes the relay as Retry does: the rows held behind them
// are published next. It returns the rows deleted (with their reasons), so
// the caller can say what was dropped. It fails with the wrapped database
// error, deleting nothing.
func (o *Outbox) Drop(ctx context.Context, q Querier, f ParkFilter) ([]Parked, error) {
	out, err := o.parkedRows(ctx, q, o.sql().dropSQL, f.args()...)
	if err != nil {
		return nil, fmt.Errorf("outbox: dropping parked rows of %s: %w", o.quoted, err)
	}
	if len(out) > 0 {
		o.wakeAfter(ctx, q)
	}
	return out, nil
}

func (o *Outbox) parkedRows(ctx context.Context, q Querier, sql string, args ...any) ([]Parked, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Parked, error) {
		var p Parked
		err := r.Scan(&p.ID, &p.MessageID, &p.Topic, &p.Key, &p.ParkedAt, &p.Reason, &p.Bytes, &p.Held)
		return p, err
	})
}

// observeParked registers the gauge exactly.outbox.parked for o's table.
func observeParked(mp metric.MeterProvider, o *Outbox, pool *pgxpool.Pool) (metric.Registration, error) {
	return telemetry.ObserveParked(mp, o.quoted, func(ctx context.Context) (int64, error) { return o.ParkedCount(ctx, pool) })
}

// boundText returns s as valid UTF-8 of at most n bytes, cut at a rune
// boundary and marked with "…" when cut.
func boundText(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	const ell = "…"
	cut := n - len(ell)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ell
}
