package status

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// GuardRow is one guard row of a key. The fields after ProcessedAt come
// from guard migration 0004 and are empty when the table predates it.
type GuardRow struct {
	Scope       string    `json:"scope"`
	ProcessedAt time.Time `json:"processed_at"`
	// State is "applied" or "dead_lettered" ("" before migration 0004).
	State     string `json:"state,omitempty"`
	Topic     string `json:"topic,omitempty"`
	Partition *int64 `json:"partition,omitempty"`
	Offset    *int64 `json:"offset,omitempty"`
	TraceID   string `json:"trace_id,omitempty"`
	Handler   string `json:"handler,omitempty"`
	// TraceURL is the trace in Jaeger when a Jaeger URL was given.
	TraceURL string `json:"trace_url,omitempty"`
}

// DeadLettered reports whether the row marks a dead-lettered record.
func (g GuardRow) DeadLettered() bool { return g.State == guardStateDeadLettered }

// KeyReport is what Inspect found for one key.
type KeyReport struct {
	Key   string     `json:"key"`
	Scope string     `json:"scope,omitempty"`
	Guard []GuardRow `json:"guard"`
	// MissingColumns are the guard columns of migration 0004 the table does
	// not have yet (their fields are then empty).
	MissingColumns []string `json:"missing_columns,omitempty"`
	// OutboxKey is the Kafka key the outbox rows were matched on.
	OutboxKey string      `json:"outbox_key"`
	Outbox    []OutboxRow `json:"outbox"`
	// OutboxParkedKnown is false when the outbox has no parked column yet.
	OutboxParkedKnown bool `json:"outbox_parked_known"`
}

// InspectOptions narrow Inspect.
type InspectOptions struct {
	// Scope limits the guard rows to one scope; "" lists every scope.
	Scope string
	// OutboxKey is the Kafka key to match outbox rows on; nil means the
	// key itself.
	OutboxKey []byte
	// JaegerURL is Jaeger's base URL (http://localhost:16686); when set,
	// rows with a trace id get a TraceURL.
	JaegerURL string
}

// Inspect reads, in one read-only transaction, the guard rows of key and
// the outbox rows (pending or parked) whose Kafka key matches. It fails on
// an empty key, a JaegerURL that is not an absolute http(s) URL, or a
// database error (wrapped, naming the table).
func Inspect(ctx context.Context, cfg Config, key string, opts InspectOptions) (*KeyReport, error) {
	if key == "" {
		return nil, errors.New("status: inspect: empty key")
	}
	if cfg.Pool == nil {
		return nil, errors.New("status: inspect: Config.Pool is nil")
	}
	if opts.JaegerURL != "" {
		u, err := url.Parse(opts.JaegerURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("status: inspect: Jaeger URL %q is not an absolute http(s) URL", opts.JaegerURL)
		}
	}
	cfg = cfg.withDefaults()
	c := &Collector{cfg: cfg}
	outboxKey := opts.OutboxKey
	if outboxKey == nil {
		outboxKey = []byte(key)
	}
	rep := &KeyReport{Key: key, Scope: opts.Scope, OutboxKey: Printable(outboxKey), Guard: []GuardRow{}}
	err := readOnly(ctx, c, func(tx pgx.Tx) error {
		gt := cfg.Guard.Table()
		cols, err := columnsOf(ctx, tx, gt)
		if err != nil {
			return err
		}
		for _, col := range guardOptional() {
			if !cols[col] {
				rep.MissingColumns = append(rep.MissingColumns, col)
			}
		}
		sql, present := guardRowSQL(gt, cols, opts.Scope != "")
		args := []any{key}
		if opts.Scope != "" {
			args = append(args, opts.Scope)
		}
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return fmt.Errorf("reading the guard rows of %q from %s: %w", key, gt.Sanitize(), err)
		}
		defer rows.Close()
		for rows.Next() {
			var g GuardRow
			opt := make([]*string, len(present))
			dest := []any{&g.Scope, &g.ProcessedAt}
			for i := range opt {
				dest = append(dest, &opt[i])
			}
			if err := rows.Scan(dest...); err != nil {
				return fmt.Errorf("reading the guard rows of %q from %s: %w", key, gt.Sanitize(), err)
			}
			for i, col := range present {
				if opt[i] != nil {
					g.set(col, *opt[i])
				}
			}
			if g.TraceID != "" && opts.JaegerURL != "" {
				g.TraceURL = strings.TrimRight(opts.JaegerURL, "/") + "/trace/" + url.PathEscape(g.TraceID)
			}
			rep.Guard = append(rep.Guard, g)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("reading the guard rows of %q from %s: %w", key, gt.Sanitize(), err)
		}

		ot := cfg.Outbox.Table()
		ocols, err := columnsOf(ctx, tx, ot)
		if err != nil {
			return err
		}
		rep.OutboxParkedKnown = ocols[colOutboxParked]
		if rep.Outbox, err = outboxRows(ctx, tx, ot, rep.OutboxParkedKnown, cfg.Rows, outboxKey); err != nil {
			return fmt.Errorf("reading the outbox rows of Kafka key %q from %s: %w", rep.OutboxKey, ot.Sanitize(), err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("status: inspect %q: %w", key, err)
	}
	return rep, nil
}

func (g *GuardRow) set(col, v string) {
	switch col {
	case colGuardState:
		g.State = v
	case colGuardTopic:
		g.Topic = v
	case colGuardPartition:
		g.Partition = parseInt(v)
	case colGuardOffset:
		g.Offset = parseInt(v)
	case colGuardTraceID:
		g.TraceID = strings.TrimPrefix(v, `\x`) // a bytea column casts to \x-prefixed hex
	case colGuardHandler:
		g.Handler = v
	}
}

func parseInt(v string) *int64 {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return nil
	}
	return &n
}
