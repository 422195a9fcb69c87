package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactly-go/exactly/internal/runtime/telemetry"
)

// Relay defaults, used for zero fields of RelayConfig.
const (
	DefaultBatchSize        = 500
	DefaultPollInterval     = 500 * time.Millisecond
	DefaultTakeoverInterval = time.Second
	DefaultProduceTimeout   = 30 * time.Second
	DefaultRetryBackoff     = 500 * time.Millisecond
	DefaultMaxRecordBytes   = 1 << 20
	maxRetryBackoff         = 30 * time.Second
)

// RelayConfig configures a Relay. The zero value (with Brokers set on
// NewRelay) relays the default table with the defaults above.
type RelayConfig struct {
	// Outbox is the table to relay; nil means New(), the default table.
	Outbox *Outbox
	// KafkaOptions are extra franz-go client options (TLS, SASL, a dialer,
	// client id). Options that would weaken delivery (acks, idempotence)
	// are overridden: the relay always produces with acks=all and the
	// idempotent producer.
	KafkaOptions []kgo.Opt
	// BatchSize bounds the rows read, published and deleted at once.
	BatchSize int
	// PollInterval is how often the active relay reads the table when no
	// notification arrives (a fallback: Add notifies on commit).
	PollInterval time.Duration
	// TakeoverInterval is how often a standby relay tries to become the
	// active one; a dead active relay is replaced within about this long
	// after PostgreSQL notices its connection is gone.
	TakeoverInterval time.Duration
	// ProduceTimeout bounds one attempt at publishing a batch; a batch
	// that is not acknowledged by then is published again, whole and in
	// order, after a backoff.
	ProduceTimeout time.Duration
	// MaxRecordBytes is the largest record (key, value and headers) the
	// relay produces, and its producer batch limit. A larger row is never
	// skipped: the relay publishes the rows before it and then holds,
	// logging an error, until the row is fixed by hand. Keep it at or below
	// the brokers' max.message.bytes.
	MaxRecordBytes int
	// RetryBackoff is the first wait after a broker or database error; it
	// doubles up to 30s while errors repeat.
	RetryBackoff time.Duration
	// Logger receives the relay's logs; nil means slog.Default().
	Logger *slog.Logger
	// Hooks are optional callbacks, for metrics and tests.
	Hooks RelayHooks
	// TracerProvider, when set, traces every published record with a
	// "<topic> publish" span (franz-go's kotel) that is a child of the trace
	// that wrote the row, and writes that span's traceparent into the
	// record, so one trace runs from a command to the consumers of what its
	// handler emitted. Nil means no publish spans; the stored traceparent is
	// published as it is.
	TracerProvider trace.TracerProvider
	// MeterProvider, when set, records exactly.relay.commit_to_ack (seconds
	// from the writing transaction to the broker's ack) and observes
	// exactly.outbox.backlog and exactly.outbox.oldest_age for the table.
	// Nil means no metrics.
	MeterProvider metric.MeterProvider
}

// RelayHooks are optional callbacks into a relay's life. Each may be nil.
// They run on the relay's goroutine and must not block for long.
type RelayHooks struct {
	// OnActive runs with true when this relay takes the table's relay lock
	// (it is now the one publishing) and with false when it gives it up
	// (its session ended: error, lost connection or shutdown).
	OnActive func(active bool)
	// OnPoll runs after each read of the table with the number of rows
	// read (0 when the table was empty).
	OnPoll func(rows int)
	// OnPublished runs after a batch of n rows was acknowledged by the
	// brokers and deleted, with each row's age at acknowledgement: from
	// the start of the transaction that wrote it (its created_at, by the
	// database's clock) to the ack (by the relay's clock, measured from
	// the read, so clock skew does not enter).
	OnPublished func(n int, commitToAck []time.Duration)
	// OnPublishError runs after each failed attempt at publishing a
	// batch (attempt counts from 1); the batch is retried.
	OnPublishError func(attempt int, err error)
	// AfterAck runs after a batch is acknowledged and before its rows are
	// deleted, with their ids. If it returns an error, Run stops at once
	// and returns it (wrapped) without deleting the rows, exactly as if
	// the process had died there: a fault-injection point for tests.
	AfterAck func(ctx context.Context, ids []int64) error
}

// Relay publishes the rows of one outbox table to Kafka and deletes them once
// acknowledged. Several relays may run against one table (one per instance
// of a service); exactly one is active at a time, the others stand by. Build
// one with NewRelay, call Run, and Close it when Run has returned.
type Relay struct {
	pool    *pgxpool.Pool
	client  *kgo.Client
	cfg     RelayConfig
	ob      *Outbox
	log     *slog.Logger
	metrics metric.Registration
}

// NewRelay returns a relay of cfg.Outbox (default: the default table) that
// publishes through a new franz-go client seeded with brokers. It fails when
// brokers is empty, a duration or size in cfg is negative, or the client
// options are invalid. It does not connect to anything.
func NewRelay(pool *pgxpool.Pool, brokers []string, cfg RelayConfig) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("outbox: NewRelay: nil pool")
	}
	if len(brokers) == 0 {
		return nil, errors.New("outbox: NewRelay: no Kafka brokers")
	}
	if cfg.BatchSize < 0 || cfg.PollInterval < 0 || cfg.TakeoverInterval < 0 || cfg.ProduceTimeout < 0 || cfg.RetryBackoff < 0 || cfg.MaxRecordBytes < 0 {
		return nil, fmt.Errorf("outbox: NewRelay: negative size or duration in %+v", cfg)
	}
	if cfg.Outbox == nil {
		cfg.Outbox = New()
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.TakeoverInterval == 0 {
		cfg.TakeoverInterval = DefaultTakeoverInterval
	}
	if cfg.ProduceTimeout == 0 {
		cfg.ProduceTimeout = DefaultProduceTimeout
	}
	if cfg.MaxRecordBytes == 0 {
		cfg.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if cfg.RetryBackoff == 0 {
		cfg.RetryBackoff = DefaultRetryBackoff
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "outbox-relay", "table", cfg.Outbox.quoted)
	opts := append([]kgo.Opt{}, cfg.KafkaOptions...)
	opts = append(opts,
		kgo.SeedBrokers(brokers...),
		kgo.AllowAutoTopicCreation(),
		// Idempotent (the franz-go default, never disabled here) with
		// acks from all in-sync replicas: no loss, no duplicates from
		// the client's own retries, order kept per partition.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordDeliveryTimeout(max(cfg.ProduceTimeout, time.Second)), // franz-go's minimum
		kgo.ProducerBatchMaxBytes(int32(min(cfg.MaxRecordBytes+recordOverhead, 1<<30))),
	)
	if cfg.TracerProvider != nil {
		mp := cfg.MeterProvider
		if mp == nil {
			mp = metricnoop.NewMeterProvider()
		}
		opts = append(opts, telemetry.KafkaTracing(cfg.TracerProvider, mp))
	}
	r := &Relay{pool: pool, cfg: cfg, ob: cfg.Outbox, log: log}
	if mp := cfg.MeterProvider; mp != nil {
		published, err := telemetry.RelayPublished(mp, cfg.Outbox.quoted)
		if err != nil {
			return nil, fmt.Errorf("outbox: NewRelay: creating metrics: %w", err)
		}
		if user := cfg.Hooks.OnPublished; user != nil {
			r.cfg.Hooks.OnPublished = func(n int, lat []time.Duration) { published(n, lat); user(n, lat) }
		} else {
			r.cfg.Hooks.OnPublished = published
		}
		r.metrics, err = telemetry.ObserveOutbox(mp, cfg.Outbox.quoted, func(ctx context.Context) (int64, time.Duration, error) {
			return cfg.Outbox.Backlog(ctx, pool)
		})
		if err != nil {
			return nil, fmt.Errorf("outbox: NewRelay: observing the backlog: %w", err)
		}
	}
	client, err := kgo.NewClient(opts...)
	if err != nil {
		if r.metrics != nil {
			_ = r.metrics.Unregister()
		}
		return nil, fmt.Errorf("outbox: NewRelay: creating Kafka client: %w", err)
	}
	r.client = client
	return r, nil
}

// Close releases the relay's Kafka client and stops observing the backlog.
// Call it after Run has returned.
func (r *Relay) Close() {
	if r.metrics != nil {
		_ = r.metrics.Unregister()
		r.metrics = nil
	}
	r.client.Close()
}

// stopError is an AfterAck hook's error: Run returns it.
type stopError struct{ err error }

func (e *stopError) Error() string { return "outbox relay stopped by AfterAck hook: " + e.err.Error() }
func (e *stopError) Unwrap() error { return e.err }

// Run relays until ctx is done, then returns nil. It takes a dedicated
// connection from the pool (removed from the pool, closed on exit) and
// tries the table's relay lock (a session advisory lock) every
// TakeoverInterval until it gets it; from then on it is the active relay:
// it LISTENs on the table's channel and, on every notification and at least
// every PollInterval, reads up to BatchSize rows in id order, publishes them
// (waiting for every ack), and deletes them, all reads and deletes on that
// one connection, so a relay whose connection died cannot delete anything.
//
// Publishing never skips or reorders a key: a batch that fails is read
// again and published again, in id order, after a backoff, while this relay
// still holds its connection; a row larger than MaxRecordBytes holds the
// relay (logged at error level) until it is fixed. A database error ends the
// session (closing the connection releases the lock) and Run reconnects
// after a backoff. A crash after the ack and before the delete publishes the
// batch again later, with the same message ids. Errors are logged, not
// returned: Run returns a non-nil error only when an AfterAck hook stops it.
func (r *Relay) Run(ctx context.Context) error {
	backoff := r.cfg.RetryBackoff
	for {
		active, err := r.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if se := (*stopError)(nil); errors.As(err, &se) {
			return err
		}
		if active {
			backoff = r.cfg.RetryBackoff
		}
		r.log.Warn("outbox relay session ended; reconnecting", "error", err, "backoff", backoff)
		if !sleep(ctx, backoff) {
			return nil
		}
		backoff = min(2*backoff, maxRetryBackoff)
	}
}

// sleep waits d or until ctx is done; it reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// session runs one connection's life: standby until the lock is taken,
// then relay until an error. It reports whether it became active.
func (r *Relay) session(ctx context.Context) (active bool, err error) {
	pc, err := r.pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("acquiring a connection: %w", err)
	}
	// Hijacked: the pool must never hand out a connection holding the
	// session lock. Closing it releases the lock.
	conn := pc.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()

	for {
		var got bool
		if err := conn.QueryRow(ctx, "select pg_try_advisory_lock($1)", r.ob.relayLockKey()).Scan(&got); err != nil {
			return false, fmt.Errorf("trying the relay lock: %w", err)
		}
		if got {
			break
		}
		if !sleep(ctx, r.cfg.TakeoverInterval) {
			return false, ctx.Err()
		}
	}
	r.log.Info("outbox relay active")
	if h := r.cfg.Hooks.OnActive; h != nil {
		h(true)
		defer h(false)
	}
	defer r.log.Info("outbox relay inactive")

	// The relay's only writes are the deletes of published rows. A delete
	// lost in a server crash republishes rows that were already acked,
	// with their message ids, which consumers downstream skip; so the
	// deletes need not wait for the WAL flush, and the next batch goes out
	// sooner (commit-to-ack latency under load).
	if _, err := conn.Exec(ctx, "set synchronous_commit = off"); err != nil {
		return true, fmt.Errorf("setting synchronous_commit for the relay's deletes: %w", err)
	}
	if _, err := conn.Exec(ctx, "listen "+pgx.Identifier{r.ob.channel}.Sanitize()); err != nil {
		return true, fmt.Errorf("listening on channel %q: %w", r.ob.channel, err)
	}
	for {
		n, err := r.relayBatch(ctx, conn)
		if err != nil {
			return true, err
		}
		if n == r.cfg.BatchSize {
			continue // more may be waiting
		}
		wctx, cancel := context.WithTimeout(ctx, r.cfg.PollInterval)
		_, err = conn.WaitForNotification(wctx)
		cancel()
		if ctx.Err() != nil {
			return true, ctx.Err()
		}
		// A timeout leaves the connection usable; other errors close it.
		if err != nil && conn.IsClosed() {
			return true, fmt.Errorf("waiting for notifications: %w", err)
		}
	}
}

// row is one outbox row read by the relay.
type row struct {
	id        int64
	messageID string
	topic     string
	key       []byte
	value     []byte
	headers   []byte
	age       time.Duration
}

// relayBatch reads, publishes and deletes one batch; it returns its size.
func (r *Relay) relayBatch(ctx context.Context, conn *pgx.Conn) (int, error) {
	readAt := time.Now()
	batch, err := r.fetch(ctx, conn)
	if err != nil {
		return 0, err
	}
	if h := r.cfg.Hooks.OnPoll; h != nil {
		h(len(batch))
	}
	if len(batch) == 0 {
		return 0, nil
	}
	batch, err = r.publish(ctx, conn, batch)
	if err != nil || len(batch) == 0 {
		return 0, err
	}
	ids := make([]int64, len(batch))
	for i := range batch {
		ids[i] = batch[i].id
	}
	ackAt := time.Since(readAt)
	if h := r.cfg.Hooks.AfterAck; h != nil {
		if err := h(ctx, ids); err != nil {
			return 0, &stopError{err}
		}
	}
	if _, err := conn.Exec(ctx, r.ob.deleteSQL, ids); err != nil {
		return 0, fmt.Errorf("deleting %d published rows (they will be published again): %w", len(ids), err)
	}
	if h := r.cfg.Hooks.OnPublished; h != nil {
		lat := make([]time.Duration, len(batch))
		for i := range batch {
			lat[i] = batch[i].age + ackAt
		}
		h(len(batch), lat)
	}
	r.log.Debug("outbox relay published", "rows", len(batch), "first_id", ids[0], "last_id", ids[len(ids)-1])
	return len(batch), nil
}

// recordOverhead bounds a record's encoding overhead within a batch.
const recordOverhead = 512

// errTooLarge reports a row larger than MaxRecordBytes.
var errTooLarge = errors.New("record larger than MaxRecordBytes")

// fetch reads up to BatchSize rows in id order.
func (r *Relay) fetch(ctx context.Context, conn *pgx.Conn) ([]row, error) {
	rows, err := conn.Query(ctx, r.ob.fetchSQL, r.cfg.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("reading outbox rows: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(rw pgx.CollectableRow) (row, error) {
		var b row
		var micros int64
		err := rw.Scan(&b.id, &b.messageID, &b.topic, &b.key, &b.value, &b.headers, &micros)
		b.age = time.Duration(micros) * time.Microsecond
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading outbox rows: %w", err)
	}
	return batch, nil
}

// records builds the Kafka records of batch, in order. It stops before the
// first row larger than maxBytes (franz-go would fail that record alone and
// publish the ones after it, reordering its key) and returns errTooLarge
// when that is the first row.
func records(batch []row, maxBytes int) ([]*kgo.Record, error) {
	recs := make([]*kgo.Record, 0, len(batch))
	for _, b := range batch {
		var stored []storedHeader
		if len(b.headers) > 0 {
			if err := json.Unmarshal(b.headers, &stored); err != nil {
				return nil, fmt.Errorf("decoding headers of outbox row %d: %w", b.id, err)
			}
		}
		hs := make([]kgo.RecordHeader, 0, len(stored)+2)
		hasID := false
		for _, h := range stored {
			hs = append(hs, kgo.RecordHeader{Key: h.Key, Value: h.Value})
			hasID = hasID || h.Key == HeaderMessageID
		}
		if !hasID {
			hs = append(hs, kgo.RecordHeader{Key: HeaderMessageID, Value: []byte(b.messageID)})
		}
		hs = append(hs, kgo.RecordHeader{Key: HeaderOutboxID, Value: strconv.AppendInt(nil, b.id, 10)})
		size := len(b.key) + len(b.value)
		for _, h := range hs {
			size += len(h.Key) + len(h.Value)
		}
		if size > maxBytes {
			if len(recs) == 0 {
				return nil, fmt.Errorf("outbox row %d to %s is %d bytes: %w (%d)", b.id, b.topic, size, errTooLarge, maxBytes)
			}
			break
		}
		recs = append(recs, &kgo.Record{Topic: b.topic, Key: b.key, Value: b.value, Headers: hs})
	}
	return recs, nil
}

// publish produces a prefix of batch (all of it unless a row is too large)
// until every record is acknowledged, retrying in order after broker errors
// (with the batch read again, so rows fixed by hand are picked up), and
// returns the rows it published. It gives up only
// when ctx ends or the relay's connection (and so its lock) is gone.
func (r *Relay) publish(ctx context.Context, conn *pgx.Conn, batch []row) ([]row, error) {
	backoff := r.cfg.RetryBackoff
	for attempt := 1; ; attempt++ {
		recs, err := records(batch, r.cfg.MaxRecordBytes)
		if err != nil {
			// A row the relay cannot publish is never skipped: hold the
			// table and say so loudly until it is fixed by hand.
			r.log.Error("outbox relay cannot publish a row; holding", "error", err, "attempt", attempt)
		} else {
			pctx, cancel := context.WithTimeout(ctx, r.cfg.ProduceTimeout)
			withTraceContexts(pctx, recs)
			err = r.client.ProduceSync(pctx, recs...).FirstErr()
			cancel()
			if err == nil {
				return batch[:len(recs)], nil
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			r.log.Warn("outbox relay publish failed; retrying the batch", "error", err, "attempt", attempt,
				"rows", len(recs), "first_id", batch[0].id, "backoff", backoff)
		}
		if h := r.cfg.Hooks.OnPublishError; h != nil {
			h(attempt, err)
		}
		if !sleep(ctx, backoff) {
			return nil, ctx.Err()
		}
		backoff = min(2*backoff, maxRetryBackoff)
		// Re-read the batch: rows fixed by hand meanwhile are picked up,
		// and a lost connection (and so lock) ends the session.
		fresh, err := r.fetch(ctx, conn)
		if err != nil {
			return nil, err
		}
		if len(fresh) == 0 {
			return nil, nil // deleted by hand
		}
		// Per key, fresh holds the same rows in the same order (plus
		// possibly later ones), so publishing it keeps each key's order.
		batch = fresh
	}
}
