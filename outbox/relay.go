package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactly-go/exactly/internal/runtime/brokerlog"
	"github.com/exactly-go/exactly/internal/runtime/pgsession"
	"github.com/exactly-go/exactly/internal/runtime/redact"
	"github.com/exactly-go/exactly/internal/runtime/telemetry"
)

// Relay defaults, used for zero fields of RelayConfig.
const (
	DefaultBatchSize        = 500
	DefaultPollInterval     = 500 * time.Millisecond
	DefaultTakeoverInterval = time.Second
	DefaultProduceTimeout   = 30 * time.Second
	DefaultRetryBackoff     = 500 * time.Millisecond
	// maxRetryBackoff caps the doubling of RetryBackoff: a relay whose
	// database or brokers come back is publishing again within a few
	// seconds.
	maxRetryBackoff = 5 * time.Second
	// busyPollInterval is how soon the relay reads the table again after
	// a read that found rows; each empty read doubles the wait, up to
	// PollInterval.
	busyPollInterval = 5 * time.Millisecond
	// topicLimitTTL is how long the relay trusts a topic's
	// max.message.bytes before describing the topic again.
	topicLimitTTL = 5 * time.Minute
	// stopGrace bounds what a stopped relay still does: deleting the rows
	// Kafka acknowledged, and closing its connection.
	stopGrace = 5 * time.Second
)

// RelayConfig configures a Relay. The zero value (with Brokers set on
// NewRelay) relays the default table with the defaults above.
type RelayConfig struct {
	// Outbox is the table to relay; nil means New(), the default table.
	Outbox *Outbox
	// KafkaOptions are extra franz-go client options (TLS, SASL, a dialer,
	// client id). Options that would weaken delivery (acks, idempotence)
	// are overridden: the relay always produces with acks=all and the
	// idempotent producer (with Fence, under its table's transactional
	// id).
	KafkaOptions []kgo.Opt
	// BatchSize bounds the rows read, published and deleted at once.
	BatchSize int
	// PollInterval is how often the active relay reads an idle table when
	// nothing wakes it. Right after a read that found rows it reads again
	// within 5ms, doubling the wait after each empty read up to
	// PollInterval, so rows added without a wake-up (a direct Add whose
	// caller does not call Outbox.Wake) are found within a few
	// milliseconds while rows keep coming. Relays are woken by Outbox.Wake:
	// in-process when built from the same Outbox value as the writers, by
	// a notification on the table's channel otherwise.
	PollInterval time.Duration
	// TakeoverInterval is how often a standby relay tries to take the
	// table's relay lease. A relay that stops hands the lease over at
	// once, so a standby takes over within TakeoverInterval; a relay that
	// dies (or hangs, or loses its database) stops renewing, so a standby
	// takes over within LeaseDuration + TakeoverInterval (5s with the
	// defaults).
	TakeoverInterval time.Duration
	// LeaseDuration is how long the relay lease lasts without renewal
	// (the active relay renews it every quarter of that); 0 means
	// DefaultLeaseDuration. An active relay that cannot renew it in time
	// (its database unreachable, its process paused) stops publishing.
	LeaseDuration time.Duration
	// Fence, when true, publishes each batch in one Kafka transaction under
	// the table's transactional id (TransactionalIDPrefix and the lease's
	// producer id), which a relay initialises when it takes the lease,
	// before reading a row: a relay paused past its lease (a long GC,
	// SIGSTOP) that wakes up cannot produce or commit, and what it had sent
	// is aborted, never seen by consumers reading committed records
	// (EXACTLY_RELAY_FENCE). Costs: every transaction leaves a marker at the
	// end of the partitions it wrote, so consumers that commit the offset
	// after the last record they read (librdkafka, Kafka's clients with
	// manual commits; not exactly's consumer, which passes markers) show a
	// lag of 1 per partition for ever; readers must read committed; with
	// ACLs the relay's principal needs Write and Describe on the
	// transactional ids starting with TransactionalIDPrefix. Without Fence
	// (the default), such a relay can publish, once, the batch it had read
	// before its pause, as duplicates with the rows' message ids (first
	// occurrences in per-key order), which consumers downstream skip; it
	// never deletes or parks a row.
	Fence bool
	// ListenConnString, when set, is a direct connection to PostgreSQL
	// (a URL or key=value string; not through a transaction-mode pooler)
	// on which the active relay LISTENs for the table's notifications
	// (EXACTLY_LISTEN_DATABASE_URL in a Service). Empty means: LISTEN on a
	// connection of the pool when the pool's connections are sessions of
	// PostgreSQL, and when they go through a pooler (found at start, see
	// Run) only poll, every PollInterval. Rows written through this
	// relay's own Outbox value wake it in-process either way.
	ListenConnString string
	// ProduceTimeout bounds one attempt at publishing a batch; a batch
	// that is not acknowledged by then is published again, whole and in
	// order, after a backoff.
	ProduceTimeout time.Duration
	// MaxRecordBytes is the largest record (key, value and headers, sized
	// by RecordSize, with the relay's own headers) the relay produces;
	// 0 means DefaultMaxRecordBytes. The producer's batch limit
	// (kgo.ProducerBatchMaxBytes) is MaxRecordBytes plus a record batch's
	// 61-byte header, so with the default it equals Kafka's default
	// message.max.bytes (1048588) and never exceeds it; raise it only
	// together with the brokers' message.max.bytes. Where the relay may
	// describe a topic (kadm DescribeTopicConfigs), it lowers the limit for
	// that topic to its max.message.bytes, read at most every few minutes
	// and again before a row is parked for it (so a row retried after the
	// topic's limit was raised is published). A larger row is parked (see
	// Relay.Run), not produced.
	MaxRecordBytes int
	// RetryBackoff is the first wait after a broker or database error; it
	// doubles up to 5s while errors repeat.
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
	// exactly.outbox.backlog, exactly.outbox.oldest_age and
	// exactly.outbox.parked (rows parked; Prometheus: exactly_outbox_parked)
	// for the table. Nil means no metrics.
	MeterProvider metric.MeterProvider
}

// RelayHooks are optional callbacks into a relay's life. Each may be nil.
// They run on the relay's goroutine and must not block for long.
type RelayHooks struct {
	// OnActive runs with true when this relay takes the table's relay
	// lease (it is now the one publishing) and with false when its term
	// ends (an error, the lease lost, or shutdown).
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
	// batch (attempt counts from 1) with a retriable error; the rows not
	// acknowledged are retried.
	OnPublishError func(attempt int, err error)
	// OnParked runs after the relay parked a row it can never publish as
	// it is, with the row's id, topic, key and the reason.
	OnParked func(id int64, topic string, key []byte, reason string)
	// AfterAck runs after a batch was acknowledged (with Fence, its Kafka
	// transaction committed) and before its rows are deleted, with their
	// ids. If it returns an error, Run stops at once
	// and returns it (wrapped) without deleting the rows, exactly as if
	// the process had died there: a fault-injection point for tests.
	AfterAck func(ctx context.Context, ids []int64) error
}

// Relay publishes the rows of one outbox table to Kafka and deletes them once
// acknowledged. Several relays may run against one table (one per instance
// of a service); exactly one is active at a time, the holder of the table's
// relay lease, the others stand by. Build one with NewRelay, call Run, and
// Close it when Run has returned.
type Relay struct {
	pool *pgxpool.Pool
	// client describes topics; each term produces through its own
	// transactional client (see term), built with opts.
	client  *kgo.Client
	opts    []kgo.Opt
	admin   *kadm.Client
	cfg     RelayConfig
	ob      *Outbox
	log     *slog.Logger
	metrics metric.Registration
	parked  metric.Registration
	// active is true while this relay holds the table's relay lease
	// (exactly.relay.active).
	active      atomic.Bool
	activeGauge metric.Registration
	// appName is the application_name of the relay's transactions;
	// holder names this process in the lease.
	appName, holder string
	// pooler is what the first probe of the pool found (probed once
	// per Run, see wakeSource).
	pooler *pgsession.Pooler
	// pauses, set only by tests, stops the relay at the named point
	// (see pause).
	pauses func(point string)

	// limits caches each topic's record limit (from its
	// max.message.bytes); only Run's goroutine uses it.
	limits map[string]topicLimit
}

// topicLimit is a topic's record limit and when it was read.
type topicLimit struct {
	bytes int
	at    time.Time
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
	if cfg.BatchSize < 0 || cfg.PollInterval < 0 || cfg.TakeoverInterval < 0 || cfg.ProduceTimeout < 0 || cfg.RetryBackoff < 0 || cfg.MaxRecordBytes < 0 || cfg.LeaseDuration < 0 {
		return nil, fmt.Errorf("outbox: NewRelay: negative size or duration in %+v", cfg)
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.LeaseDuration < 40*time.Millisecond {
		return nil, fmt.Errorf("outbox: NewRelay: LeaseDuration %v is below 40ms", cfg.LeaseDuration)
	}
	if cfg.ListenConnString != "" {
		if _, err := pgx.ParseConfig(cfg.ListenConnString); err != nil {
			return nil, fmt.Errorf("outbox: NewRelay: ListenConnString: %w", err)
		}
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
	// Every text value the relay logs is bounded (redact.Bound): a row's
	// key, topic or error cannot make a line megabytes long.
	log = slog.New(redact.Handler(log.Handler())).With("component", "outbox-relay", "table", cfg.Outbox.quoted)
	opts := append([]kgo.Opt{}, cfg.KafkaOptions...)
	opts = append(opts,
		kgo.WithHooks(brokerlog.New(log)), // franz-go retries an unreachable broker without a word
		kgo.SeedBrokers(brokers...),
		kgo.AllowAutoTopicCreation(),
		// Idempotent (the franz-go default, never disabled here) with
		// acks from all in-sync replicas: no loss, no duplicates from
		// the client's own retries, order kept per partition.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordDeliveryTimeout(max(cfg.ProduceTimeout, time.Second)), // franz-go's minimum
		// A batch of one maximal record is exactly MaxRecordBytes plus
		// the batch header: with the default, Kafka's default
		// message.max.bytes, never above it.
		kgo.ProducerBatchMaxBytes(int32(min(cfg.MaxRecordBytes+recordBatchOverhead, 1<<30))),
		// An unknown topic (auto-creation off) fails its records after
		// this many metadata refreshes instead of waiting for ever; the
		// relay then parks them.
		kgo.UnknownTopicRetries(4),
	)
	if cfg.TracerProvider != nil {
		mp := cfg.MeterProvider
		if mp == nil {
			mp = metricnoop.NewMeterProvider()
		}
		opts = append(opts, telemetry.KafkaTracing(cfg.TracerProvider, mp))
	}
	r := &Relay{pool: pool, cfg: cfg, ob: cfg.Outbox, log: log, limits: map[string]topicLimit{},
		appName: pgsession.AppName("relay", cfg.Outbox.quoted), holder: holderName()}
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
		r.parked, err = observeParked(mp, cfg.Outbox, pool)
		if err != nil {
			r.unregister()
			return nil, fmt.Errorf("outbox: NewRelay: observing parked rows: %w", err)
		}
		r.activeGauge, err = telemetry.ObserveRelayActive(mp, cfg.Outbox.quoted, r.active.Load)
		if err != nil {
			r.unregister()
			return nil, fmt.Errorf("outbox: NewRelay: observing the relay lease: %w", err)
		}
	}
	if cfg.Fence {
		// Each term's producer is transactional (see term): check that
		// the options allow it now, not at the first takeover.
		probe, err := kgo.NewClient(append(opts[:len(opts):len(opts)], kgo.TransactionalID(TransactionalIDPrefix+"probe"))...)
		if err != nil {
			r.unregister()
			return nil, fmt.Errorf("outbox: NewRelay: creating Kafka client: %w", err)
		}
		probe.Close()
	}
	r.opts = opts
	client, err := kgo.NewClient(opts...)
	if err != nil {
		r.unregister()
		return nil, fmt.Errorf("outbox: NewRelay: creating Kafka client: %w", err)
	}
	r.client = client
	r.admin = kadm.NewClient(client)
	return r, nil
}

func (r *Relay) unregister() {
	for _, m := range []*metric.Registration{&r.metrics, &r.parked, &r.activeGauge} {
		if *m != nil {
			_ = (*m).Unregister()
			*m = nil
		}
	}
}

// Close releases the relay's Kafka client and stops observing the backlog.
// Call it after Run has returned.
func (r *Relay) Close() {
	r.unregister()
	r.client.Close()
}

// stopError is an AfterAck hook's error: Run returns it.
type stopError struct{ err error }

func (e *stopError) Error() string { return "outbox relay stopped by AfterAck hook: " + e.err.Error() }
func (e *stopError) Unwrap() error { return e.err }

// Run relays until ctx is done, then returns nil. It tries to take the
// table's relay lease (a row of LeaseTable: owner, epoch, expiry) every
// TakeoverInterval until it gets it; from then on it is the active relay
// (a term), renewing the lease every quarter of LeaseDuration, and every
// PollInterval (sooner while rows keep coming), on every wake of its
// Outbox value (Outbox.Wake) and, when it can LISTEN, on every notification
// on the table's channel, it reads up to BatchSize rows in id order,
// publishes them (waiting for every ack; with Fence, in one Kafka
// transaction, and for its commit), and deletes them. Nothing the relay does depends on a database
// session: every statement runs in a short transaction of the pool (which
// may go through a transaction-mode pooler such as PgBouncer), with
// application_name "exactly relay <table>" and, for its deletes,
// synchronous_commit off, both for that transaction only.
//
// One relay publishes at a time. Each delete and park runs in a transaction
// that first finds the lease still held with this term's epoch, holding the
// lease row, so a relay that lost the lease changes nothing. Before each
// produce the relay checks its lease by its own clock; a relay paused past
// its lease right after that check (a long GC, SIGSTOP, a frozen VM) can,
// when it wakes, publish the batch it had read once more, with the rows'
// message ids (see RelayConfig.Fence). With Fence, each term produces with
// the table's Kafka transactional id and, before reading anything,
// initialises it, which fences every earlier term: such a relay cannot
// produce or commit (the brokers refuse its epoch), and its open
// transaction was aborted, so consumers reading committed records (as
// exactly's consumer does) never see what it sent. A term ends when the
// lease is lost, and Run stands by again.
//
// At its first term Run probes the pool (is the backend pid a connection
// announced the one that runs its statements, twice?): it LISTENs on
// ListenConnString when set, else on a connection of the pool when the
// pool's connections are sessions of PostgreSQL; behind a pooler without
// ListenConnString it polls every PollInterval, so rows other processes
// write wait up to PollInterval. It logs which, once, at info level.
//
// One bad row holds only its own (topic, key), visibly. Produce errors are
// classified (see PermanentProduceError): rows that fail with a retriable
// error (broker down, leader moved, timeouts, NOT_ENOUGH_REPLICAS) are
// read again and published again, in id order, after a backoff. A row that
// can never be published as it is (over its topic's size limit, an illegal,
// forbidden or unknown topic, a policy violation, a keyless record on a
// compacted topic) is parked: marked in the table with the reason, logged
// once at error level, counted by exactly.outbox.parked, and skipped
// together with every later row of the same (topic, key), so per-key order
// holds; every other row keeps flowing. Records that failed together with
// a permanent error are produced one by one, in id order after the rows
// before them of their key, to find the bad one, so an innocent row is
// never parked. (With Fence, a transaction in which any record failed is
// aborted; the records the brokers had taken are produced again in a
// second transaction, unless an earlier row of their key failed.) Parking survives
// restarts; Outbox.Retry releases parked rows after a fix and Outbox.Drop
// deletes them ("exactly outbox retry|drop").
//
// A database or broker error ends the term (the lease is released) and Run
// tries again after a backoff that doubles from RetryBackoff up to 5
// seconds. A crash after the commit and before the delete publishes the
// batch again later, with the same message ids. A relay stopped (ctx done)
// while producing deletes the rows whose acks came back (with Fence: aborts
// its transaction, or, after the commit, deletes the batch) before it
// returns (the delete gets up to 5 seconds after the stop), so a graceful
// stop publishes again only what Kafka had not acknowledged.
// Errors are logged, not returned: Run returns a non-nil error only when an
// AfterAck hook stops it.
func (r *Relay) Run(ctx context.Context) error {
	backoff := r.cfg.RetryBackoff
	for {
		active, err := r.term(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if se := (*stopError)(nil); errors.As(err, &se) {
			return err
		}
		if active {
			backoff = r.cfg.RetryBackoff
		}
		if errors.Is(err, errLeaseLost) {
			// Not an outage: stand by at once (the backoff stays as it
			// was).
			r.log.Warn("outbox relay lost its lease; standing by", "error", err)
			continue
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

// Pause points (see pause).
const (
	pauseProduce = "produce" // after a batch was read, before its transaction begins
	pauseCommit  = "commit"  // after every record was acknowledged, before the commit
	pauseRenew   = "renew"   // before each renewal of the lease
	pauseHold    = "hold"    // in a delete's or park's transaction, after the lease check
)

// pause stops the relay at point while a test wants it stopped: it stands
// for a process paused there (a long GC, SIGSTOP). It does nothing outside
// tests.
func (r *Relay) pause(point string) {
	if r.pauses != nil {
		r.pauses(point)
	}
}

// term runs one hold of the lease: standby until the lease is taken, then
// relay until an error or the lease is lost. It reports whether it became
// active.
func (r *Relay) term(ctx context.Context) (active bool, err error) {
	var t *term
	for standby := false; ; standby = true {
		if t, err = r.acquire(ctx); err != nil {
			return false, err
		}
		if t != nil {
			break
		}
		if !standby {
			r.log.Info("outbox relay on standby: another relay holds the table's relay lease; trying again every takeover interval",
				"takeover_interval", r.cfg.TakeoverInterval)
		}
		if !sleep(ctx, r.cfg.TakeoverInterval) {
			return false, ctx.Err()
		}
	}
	tctx, cancel := context.WithCancelCause(ctx)
	var beat sync.WaitGroup
	beat.Go(func() { t.heartbeat(tctx, cancel) })
	defer func() {
		cancel(nil)
		beat.Wait()
		t.release(ctx)
	}()
	// The term's reason to end: the lease lost, else err.
	defer func() {
		if cause := context.Cause(tctx); ctx.Err() == nil && errors.Is(cause, errLeaseLost) && !errors.Is(err, errLeaseLost) {
			err = cause
		}
	}()

	client := r.client
	if r.cfg.Fence {
		// Fence every earlier term before reading anything:
		// initialising the transactional id bumps its epoch and aborts
		// its open transaction. The coordinator aborts a transaction
		// open longer than its timeout (and bumps the epoch, which looks
		// like a fence): longer than a produce and a commit can take.
		client, err = kgo.NewClient(append(r.opts[:len(r.opts):len(r.opts)],
			kgo.TransactionalID(t.txnID), kgo.TransactionTimeout(2*r.cfg.ProduceTimeout+stopGrace))...)
		if err != nil {
			return false, fmt.Errorf("creating the transactional Kafka client: %w", err)
		}
		defer client.Close()
		fctx, fdone := context.WithTimeout(tctx, r.cfg.ProduceTimeout)
		_, _, err = client.ProducerID(fctx)
		fdone()
		if errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
			r.log.Error("outbox relay may not use its Kafka transactional id: grant its principal Write and Describe on the transactional ids starting with "+TransactionalIDPrefix,
				"transactional_id", t.txnID, "error", err)
		}
		if err != nil {
			return false, fmt.Errorf("initialising the Kafka transactional id %s (fencing earlier relays): %w", t.txnID, err)
		}
	}
	listen, err := r.wakeSource(tctx)
	if err != nil {
		return false, err
	}
	if listen != nil {
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopGrace)
			defer cancel()
			_ = listen.Close(cctx)
		}()
	}

	r.log.Info("outbox relay active", "epoch", t.epoch, "transactional_id", t.txnID)
	r.active.Store(true)
	defer r.active.Store(false)
	if h := r.cfg.Hooks.OnActive; h != nil {
		h(true)
		defer h(false)
	}
	defer r.log.Info("outbox relay inactive")

	// Active: wakes of r's Outbox need not notify.
	defer r.ob.wk().activate()()
	p := &producer{client: client, t: t, txn: r.cfg.Fence}
	backoff, failures := r.cfg.RetryBackoff, 0
	poll := r.cfg.PollInterval
	for {
		// Taken before the read: a wake during the read ends the wait.
		woken := r.ob.wk().wait()
		n, retry, err := r.relayBatch(tctx, p)
		if err != nil {
			return true, err
		}
		if retry != nil {
			failures++
			if h := r.cfg.Hooks.OnPublishError; h != nil {
				h(failures, retry)
			}
			r.log.Warn("outbox relay publish failed; retrying the rows not acknowledged", "error", retry,
				"attempt", failures, "backoff", backoff)
			if !sleep(tctx, backoff) {
				return true, tctx.Err()
			}
			backoff = min(2*backoff, maxRetryBackoff)
			continue
		}
		backoff, failures = r.cfg.RetryBackoff, 0
		if n == r.cfg.BatchSize {
			continue // more may be waiting
		}
		if n > 0 {
			poll = min(busyPollInterval, r.cfg.PollInterval)
		} else {
			poll = min(2*poll, r.cfg.PollInterval)
		}
		if err := waitWake(tctx, listen, woken, poll); err != nil {
			return true, err
		}
	}
}

// wakeSource returns the connection the active relay LISTENs on, LISTENing
// already, or nil when it only polls (see Run). The first call probes the
// pool and logs how the relay wakes.
func (r *Relay) wakeSource(ctx context.Context) (*pgx.Conn, error) {
	first := r.pooler == nil
	if first {
		p, err := pgsession.Probe(ctx, r.pool)
		if err != nil {
			return nil, err
		}
		r.pooler = &p
	}
	var conn *pgx.Conn
	switch {
	case r.cfg.ListenConnString != "":
		cfg, err := pgx.ParseConfig(r.cfg.ListenConnString)
		if err != nil {
			return nil, fmt.Errorf("ListenConnString: %w", err)
		}
		// A connection of its own, closed with the term: session
		// settings are its own.
		cfg.RuntimeParams["application_name"] = pgsession.AppName("relay listen", r.ob.quoted)
		if conn, err = pgx.ConnectConfig(ctx, cfg); err != nil {
			return nil, fmt.Errorf("connecting to ListenConnString to LISTEN: %w", err)
		}
		if first {
			r.log.Info("outbox relay wakes on notifications, on a connection of its own (ListenConnString), and polls every poll interval",
				"mode", "listen", "pool", r.pooler.String(), "poll_interval", r.cfg.PollInterval)
		}
	case !r.pooler.Detected:
		pc, err := r.pool.Acquire(ctx)
		if err != nil {
			return nil, fmt.Errorf("acquiring a connection to LISTEN on: %w", err)
		}
		// Out of the pool: no other user may inherit the LISTEN.
		conn = pc.Hijack()
		if first {
			r.log.Info("outbox relay wakes on notifications, on a connection taken from the pool, and polls every poll interval",
				"mode", "listen", "pool", r.pooler.String(), "poll_interval", r.cfg.PollInterval)
		}
	default:
		if first {
			r.log.Info("outbox relay polls: the pool goes through a pooler, where LISTEN cannot work, and no ListenConnString (EXACTLY_LISTEN_DATABASE_URL) is set; rows other processes write wait up to the poll interval",
				"mode", "poll", "pool", r.pooler.String(), "poll_interval", r.cfg.PollInterval)
		}
		return nil, nil
	}
	if _, err := conn.Exec(ctx, "listen "+pgx.Identifier{r.ob.channel}.Sanitize()); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopGrace)
		defer cancel()
		_ = conn.Close(cctx)
		return nil, fmt.Errorf("listening on channel %q: %w", r.ob.channel, err)
	}
	return conn, nil
}

// waitWake waits up to d for a notification on conn (nil: none) or for
// woken to close. It fails when ctx ends or the connection broke.
func waitWake(ctx context.Context, conn *pgx.Conn, woken <-chan struct{}, d time.Duration) error {
	select {
	case <-woken:
		return nil
	default:
	}
	if conn == nil {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-woken:
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-woken:
			cancel()
		case <-done:
		}
	}()
	_, err := conn.WaitForNotification(wctx)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// A timeout or a wake leaves the connection usable; other errors
	// close it.
	if err != nil && conn.IsClosed() {
		return fmt.Errorf("waiting for notifications: %w", err)
	}
	return nil
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

// relayBatch reads one batch and publishes what it can: acknowledged rows
// are deleted, rows that can never be published are parked. It returns the
// number of rows read, and the first retriable error when some rows were
// neither acknowledged nor parked (they are read again after a backoff).
func (r *Relay) relayBatch(ctx context.Context, p *producer) (int, error, error) {
	readAt := time.Now()
	batch, err := r.fetch(ctx)
	if err != nil {
		return 0, nil, err
	}
	if h := r.cfg.Hooks.OnPoll; h != nil {
		h(len(batch))
	}
	if len(batch) == 0 {
		return 0, nil, nil
	}
	acked, retry, err := r.publish(ctx, p, batch)
	if len(acked) > 0 {
		// Also when publish ended early (the relay stopped): what Kafka
		// committed is deleted, not published again by the next relay.
		if derr := r.published(ctx, p.t, acked, time.Since(readAt)); derr != nil {
			return 0, nil, derr
		}
	}
	if err != nil {
		return 0, nil, err
	}
	return len(batch), retry, nil
}

// published deletes the rows Kafka committed, ackAt after they were read,
// and reports them (OnPublished). The delete runs only while t holds the
// lease (see term.guarded), and outlives ctx by up to stopGrace: a relay
// stopped after a commit deletes what the broker already has before it lets
// go, so a graceful stop publishes nothing twice; while ctx lasts, the
// delete takes as long as it takes. It fails when the AfterAck hook stops
// the relay (leaving the rows, as a crash there would), or the lease was
// lost or the delete failed (the rows are published again).
func (r *Relay) published(ctx context.Context, t *term, acked []row, ackAt time.Duration) error {
	ids := make([]int64, len(acked))
	for i := range acked {
		ids[i] = acked[i].id
	}
	if h := r.cfg.Hooks.AfterAck; h != nil {
		if err := h(ctx, ids); err != nil {
			return &stopError{err}
		}
	}
	dctx, release := outliving(ctx, stopGrace)
	defer release()
	err := t.guarded(dctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(dctx, r.ob.sql().deleteSQL, ids)
		return err
	})
	if err != nil {
		return fmt.Errorf("deleting %d published rows (they will be published again): %w", len(ids), err)
	}
	if h := r.cfg.Hooks.OnPublished; h != nil {
		lat := make([]time.Duration, len(acked))
		for i := range acked {
			lat[i] = acked[i].age + ackAt
		}
		h(len(acked), lat)
	}
	r.log.Debug("outbox relay published", "rows", len(acked), "first_id", ids[0], "last_id", ids[len(ids)-1])
	return nil
}

// fetch reads up to BatchSize publishable rows in id order: neither parked
// nor behind a parked row of their (topic, key).
func (r *Relay) fetch(ctx context.Context) ([]row, error) {
	var batch []row
	err := r.inTx(ctx, false, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, r.ob.sql().fetchSQL, r.cfg.BatchSize)
		if err != nil {
			return err
		}
		batch, err = pgx.CollectRows(rows, func(rw pgx.CollectableRow) (row, error) {
			var b row
			var micros int64
			err := rw.Scan(&b.id, &b.messageID, &b.topic, &b.key, &b.value, &b.headers, &micros)
			b.age = time.Duration(micros) * time.Microsecond
			return b, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reading outbox rows: %w", err)
	}
	return batch, nil
}

// record builds row b's Kafka record: its stored headers minus any
// message-id not set through Message.ID, then message-id (Message.ID, or
// the row's UUID) and exactly-outbox-id. It fails when the stored headers
// cannot be decoded.
func record(b row) (*kgo.Record, error) {
	var stored []storedHeader
	if len(b.headers) > 0 {
		if err := json.Unmarshal(b.headers, &stored); err != nil {
			return nil, fmt.Errorf("decoding the stored headers: %w", err)
		}
	}
	hs := make([]kgo.RecordHeader, 0, len(stored)+2)
	id := b.messageID
	for _, h := range stored {
		if h.Key == HeaderMessageID {
			// A copied message-id (a handler forwarding the headers
			// of what it consumed) would give every message it emits
			// one id; only Message.ID chooses the id.
			if h.ID {
				id = string(h.Value)
			}
			continue
		}
		hs = append(hs, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderMessageID, Value: []byte(id)},
		kgo.RecordHeader{Key: HeaderOutboxID, Value: strconv.AppendInt(nil, b.id, 10)})
	return &kgo.Record{Topic: b.topic, Key: b.key, Value: b.value, Headers: hs}, nil
}

// parkKey identifies the rows one parked row holds: its (topic, key), or
// the row alone when it has no key (keyless rows have no order to keep).
type parkKey struct {
	topic, key string
	id         int64 // set only for keyless rows
}

func keyOf(b row) parkKey {
	if b.key == nil {
		return parkKey{topic: b.topic, id: b.id}
	}
	return parkKey{topic: b.topic, key: string(b.key)}
}

// publish produces batch once, in order, and returns the rows acknowledged
// and the first retriable error when some rows were not. Rows that fail
// before producing (illegal topic, over their topic's limit, undecodable
// headers) or with a permanent produce error are parked, and rows after them
// of the same (topic, key) are neither produced nor acknowledged. Rows that
// failed together with a permanent error are produced again one at a time,
// so only the row that fails alone is parked. It fails only when parking
// fails (a database error) or ctx ends.
//
// Rows of one key go to one partition and so, normally, into one batch that
// succeeds or fails whole. A broker that refuses only an earlier batch of a
// key (a size limit the relay could not read, so did not check before
// producing) lets a later row of that key through before the earlier one is
// parked; the relay cannot take a published record back.
func (r *Relay) publish(ctx context.Context, p *producer, batch []row) (acked []row, retry error, err error) {
	blocked := map[parkKey]bool{}
	park := func(b row, reason string) error {
		blocked[keyOf(b)] = true
		return r.park(ctx, p.t, b, reason)
	}
	fresh := r.refreshLimits(ctx, batch, false)
	var recs []*kgo.Record
	var sent []row
	for _, b := range batch {
		if blocked[keyOf(b)] {
			continue
		}
		rec, err := record(b)
		reason := ""
		switch {
		case err != nil:
			reason = err.Error()
		case ValidateTopic(b.topic) != nil:
			reason = ValidateTopic(b.topic).(*MessageError).Reason
		default:
			size, limit := recordSize(rec.Key, rec.Value, rec.Headers), r.limitOf(b.topic)
			if size > limit && size <= r.cfg.MaxRecordBytes && !fresh[b.topic] {
				// Over a cached topic limit: read it again before
				// parking, so a row retried after the operator raised
				// the topic's max.message.bytes is not parked again
				// from the old value.
				for t := range r.refreshLimits(ctx, []row{b}, true) {
					fresh[t] = true
				}
				limit = r.limitOf(b.topic)
			}
			if size > limit {
				reason = fmt.Sprintf("record is %d bytes, over the %d-byte limit for %s (%s)", size, limit, b.topic, kerr.MessageTooLarge.Message)
			}
		}
		if reason != "" {
			if err := park(b, reason); err != nil {
				return nil, nil, err
			}
			continue
		}
		recs = append(recs, rec)
		sent = append(sent, b)
	}
	if len(recs) == 0 {
		return nil, nil, nil
	}
	withTraceContexts(ctx, recs)
	if !p.t.valid() {
		// Cheap, and not enough alone (a pause may fall right after it):
		// the transactional id's fencing is what stops a relay that lost
		// its lease.
		return nil, nil, fmt.Errorf("%w: not renewed within the lease duration (%v)", errLeaseLost, r.cfg.LeaseDuration)
	}
	r.pause(pauseProduce)
	results, err := p.produce(ctx, r, recs)
	if err != nil {
		return nil, nil, err
	}
	// Results come in completion order: find each record's row.
	index := make(map[*kgo.Record]int, len(recs))
	for i, rec := range recs {
		index[rec] = i
	}
	errs := make([]error, len(recs))
	committed := true
	for _, res := range results {
		errs[index[res.Record]] = res.Err
		committed = committed && res.Err == nil
	}
	defer func() { slices.SortFunc(acked, func(a, b row) int { return cmp.Compare(a.id, b.id) }) }()
	if committed {
		return append(acked, sent...), nil, nil
	}
	if ctx.Err() != nil {
		if p.txn {
			return nil, nil, ctx.Err() // the transaction was aborted: nothing is published
		}
		// Stopped with some acknowledgements back: what Kafka took is
		// published and is deleted, or the next relay publishes it again.
		for i := range sent {
			if errs[i] == nil {
				acked = append(acked, sent[i])
			}
		}
		return acked, nil, ctx.Err()
	}
	// With Fence the transaction was aborted: none of it is published.
	// (Without, what was acknowledged is.) In id order,
	// a row whose record the brokers took is produced again in a second
	// transaction, unless an earlier row of its key failed; a row that
	// failed makes the later rows of its key wait (per-key order): until
	// the next round after a backoff for a retriable error, and for a
	// permanent one until it was produced alone below.
	waiting := map[parkKey]bool{}
	var again, suspects []int
	for i := range sent {
		k := keyOf(sent[i])
		switch e := errs[i]; {
		case e == nil: // without Fence, each record stands alone
			acked = append(acked, sent[i])
		case waiting[k]:
		case errors.Is(e, errAborted):
			again = append(again, i)
		case PermanentProduceError(e):
			suspects = append(suspects, i)
			waiting[k] = true
		default:
			retry = cmp.Or(retry, fmt.Errorf("producing outbox row %d to %s: %w", sent[i].id, sent[i].topic, e))
			waiting[k] = true
		}
	}
	// copyOf copies record i: franz-go fills in a produced record's fields.
	copyOf := func(i int) *kgo.Record {
		return &kgo.Record{Topic: recs[i].Topic, Key: recs[i].Key, Value: recs[i].Value, Headers: recs[i].Headers}
	}
	againFailed := map[parkKey]bool{}
	if len(again) > 0 {
		rs := make([]*kgo.Record, len(again))
		for j, i := range again {
			rs[j] = copyOf(i)
		}
		res, err := p.produce(ctx, r, rs)
		if err != nil {
			return acked, nil, err
		}
		if ferr := res.FirstErr(); ferr != nil {
			if ctx.Err() != nil {
				return acked, nil, ctx.Err()
			}
			retry = cmp.Or(retry, fmt.Errorf("producing %d outbox rows again after an aborted transaction: %w", len(again), ferr))
			for _, i := range again {
				againFailed[keyOf(sent[i])] = true
			}
		} else {
			for _, i := range again {
				acked = append(acked, sent[i])
			}
		}
	}
	// Isolate: produce each suspect alone, in id order, once the rows
	// before it of its key are published; only the rows that fail alone
	// are parked, with the rows after them of their key held.
	for _, i := range suspects {
		b := sent[i]
		if blocked[keyOf(b)] || againFailed[keyOf(b)] {
			continue
		}
		if len(suspects) > 1 {
			res, err := p.produce(ctx, r, []*kgo.Record{copyOf(i)})
			if err != nil {
				return acked, nil, err
			}
			perr := res.FirstErr()
			switch {
			case perr == nil:
				acked = append(acked, b)
				continue
			case ctx.Err() != nil:
				return acked, nil, ctx.Err()
			case !PermanentProduceError(perr):
				retry = cmp.Or(retry, fmt.Errorf("producing outbox row %d to %s: %w", b.id, b.topic, perr))
				blocked[keyOf(b)] = true // keep its key's order: retry it first
				continue
			}
			errs[i] = perr
		}
		if err := park(b, errs[i].Error()); err != nil {
			return acked, nil, err
		}
	}
	return acked, retry, nil
}

// producer is a term's Kafka client: with txn (RelayConfig.Fence) a
// transactional one of its own, else the relay's idempotent client.
type producer struct {
	client *kgo.Client
	t      *term
	txn    bool
}

// errAborted is the error of a record that the brokers acknowledged in a
// transaction that was then aborted (another record of it failed, or the
// commit did): it is published again.
var errAborted = errors.New("acknowledged in a Kafka transaction that was aborted")

// produce produces recs, in order, in one Kafka transaction, bounded by
// ProduceTimeout, and commits it when every record was acknowledged; else it
// aborts it. It returns each record's result: no error for any when the
// transaction committed; when it aborted, each record's own error, and
// errAborted (wrapping the commit's error, if any) for the records that had
// been acknowledged. It fails when the transaction cannot begin or end: the
// producer was fenced by a newer term, or is broken; the term then ends.
// The commit outlives ctx by up to stopGrace, so a relay stopped after the
// acks still commits (and deletes) what the brokers have.
func (p *producer) produce(ctx context.Context, r *Relay, recs []*kgo.Record) (kgo.ProduceResults, error) {
	if !p.txn {
		// Each record's own result: what was acknowledged is published.
		pctx, cancel := context.WithTimeout(ctx, r.cfg.ProduceTimeout)
		defer cancel()
		return p.client.ProduceSync(pctx, recs...), nil
	}
	if err := p.client.BeginTransaction(); err != nil {
		return nil, fmt.Errorf("beginning a Kafka transaction: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.ProduceTimeout)
	results := p.client.ProduceSync(pctx, recs...)
	cancel()
	ectx, release := outliving(ctx, stopGrace)
	defer release()
	ectx, cancel = context.WithTimeout(ectx, r.cfg.ProduceTimeout)
	defer cancel()
	var commitErr error
	if results.FirstErr() == nil {
		r.pause(pauseCommit)
		if commitErr = p.client.EndTransaction(ectx, kgo.TryCommit); commitErr == nil {
			return results, nil
		}
	}
	if err := cmp.Or(commitErr, results.FirstErr()); fenced(err) {
		// The transaction is aborted already (by the newer relay's
		// takeover); this producer can do nothing more.
		return nil, fmt.Errorf("%w: a newer relay fenced this one's Kafka producer: %w", errLeaseLost, err)
	}
	if err := p.client.AbortBufferedRecords(ectx); err != nil {
		return nil, fmt.Errorf("aborting a Kafka transaction: %w", err)
	}
	if err := p.client.EndTransaction(ectx, kgo.TryAbort); err != nil {
		if commitErr != nil {
			return nil, fmt.Errorf("committing a Kafka transaction: %w (aborting it: %w)", commitErr, err)
		}
		return nil, fmt.Errorf("aborting a Kafka transaction: %w", err)
	}
	for i := range results {
		if results[i].Err == nil {
			if commitErr != nil {
				results[i].Err = fmt.Errorf("%w: %w", errAborted, commitErr)
			} else {
				results[i].Err = errAborted
			}
		}
	}
	return results, nil
}

// fenced reports whether err means a newer producer with the same
// transactional id (a newer relay term) fenced this one.
func fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch)
}

// outliving returns a context that ctx's end does not cancel at once but
// grace after it (a context without ctx's deadline or cancellation until
// then), and the function that releases it, which the caller must call.
func outliving(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	octx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-octx.Done():
		}
	})
	return octx, func() { stop(); cancel() }
}

// PermanentProduceError reports whether err, the error franz-go gave for a
// produced record, means that record can never be published as it is, so
// the relay parks it instead of retrying: MESSAGE_TOO_LARGE,
// RECORD_LIST_TOO_LARGE, INVALID_TOPIC_EXCEPTION,
// TOPIC_AUTHORIZATION_FAILED, POLICY_VIOLATION, INVALID_RECORD (a keyless
// record on a compacted topic) and UNKNOWN_TOPIC_OR_PARTITION (returned
// only after franz-go's bounded retries, when the topic does not exist and
// is not auto-created). Every other error, retriable by Kafka's rules or
// unknown, is retried: the relay never parks a row for an outage.
func PermanentProduceError(err error) bool {
	for _, p := range []*kerr.Error{
		kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidTopicException,
		kerr.TopicAuthorizationFailed, kerr.PolicyViolation, kerr.InvalidRecord,
		kerr.UnknownTopicOrPartition,
	} {
		if errors.Is(err, p) {
			return true
		}
	}
	return false
}

// park marks row b parked with reason, logs it once at error level and runs
// the OnParked hook. A row already parked (by a concurrent retry race) is
// left as it is.
func (r *Relay) park(ctx context.Context, t *term, b row, reason string) error {
	reason = boundText(reason, maxReasonBytes)
	err := t.guarded(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, r.ob.sql().parkSQL, b.id, reason)
		return err
	})
	if err != nil {
		return fmt.Errorf("parking outbox row %d: %w", b.id, err)
	}
	r.log.Error("outbox relay parked a row it cannot publish; later rows of its key wait behind it (exactly outbox parked|retry|drop)",
		"id", b.id, "message_id", b.messageID, "topic", redact.Bound(b.topic), "key", redact.Bound(string(b.key)), "reason", redact.Bound(reason))
	if h := r.cfg.Hooks.OnParked; h != nil {
		h(b.id, b.topic, b.key, reason)
	}
	return nil
}

// limitOf returns the record limit for topic: MaxRecordBytes, lowered to
// the topic's max.message.bytes minus a batch header when known.
func (r *Relay) limitOf(topic string) int {
	if l, ok := r.limits[topic]; ok && l.bytes > 0 {
		return min(l.bytes, r.cfg.MaxRecordBytes)
	}
	return r.cfg.MaxRecordBytes
}

// refreshLimits describes the topics of batch whose limit is unknown or
// older than topicLimitTTL (every legal one when force is set), in one
// request bounded by 5 seconds, and returns the topics it asked about.
// Topics it may not describe, or that do not exist yet, keep MaxRecordBytes
// (and are asked again after the TTL); a failed request is logged at debug
// level.
func (r *Relay) refreshLimits(ctx context.Context, batch []row, force bool) map[string]bool {
	var topics []string
	now := time.Now()
	for _, b := range batch {
		if l, ok := r.limits[b.topic]; (force || !ok || now.Sub(l.at) > topicLimitTTL) && ValidateTopic(b.topic) == nil && !slices.Contains(topics, b.topic) {
			topics = append(topics, b.topic)
		}
	}
	asked := make(map[string]bool, len(topics))
	if len(topics) == 0 {
		return asked
	}
	for _, t := range topics {
		if !force {
			// Unknown until described; a forced read that fails keeps
			// the value read before.
			r.limits[t] = topicLimit{at: now}
		}
		asked[t] = true
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rcs, err := r.admin.DescribeTopicConfigs(dctx, topics...)
	if err != nil {
		r.log.Debug("outbox relay cannot describe topics; using MaxRecordBytes", "topics", topics, "error", err)
		return asked
	}
	for _, rc := range rcs {
		if rc.Err != nil {
			continue
		}
		for _, c := range rc.Configs {
			if c.Key != "max.message.bytes" || c.Value == nil {
				continue
			}
			if v, err := strconv.Atoi(*c.Value); err == nil && v > recordBatchOverhead {
				r.limits[rc.Name] = topicLimit{bytes: v - recordBatchOverhead, at: now}
			}
		}
	}
	return asked
}
