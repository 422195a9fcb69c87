package outbox

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/runtime/brokerlog"
	"github.com/exactly-go/exactly/internal/runtime/redact"
)

// WAL relay defaults, used for zero fields of WALRelayConfig.
const (
	// DefaultWALSlot is the logical replication slot a WALRelay creates
	// and reads.
	DefaultWALSlot = "exactly_outbox"
	// DefaultWALPublication is the (table-less) publication pgoutput is
	// started with.
	DefaultWALPublication = "exactly_outbox"
	// DefaultWALLinger bounds how long the WAL relay holds a batch smaller
	// than BatchSize, from its first message, waiting for more.
	DefaultWALLinger = 5 * time.Millisecond
	// DefaultWALStatusInterval is how often the relay reports its
	// confirmed position to the server when idle.
	DefaultWALStatusInterval = 10 * time.Second
)

// slotName is what PostgreSQL accepts as a replication slot name; the
// publication name is held to the same rule, since both are written into
// replication commands that take no parameters.
var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// WALRelayConfig configures a WALRelay.
type WALRelayConfig struct {
	// ConnString names the database (a URL or key=value string); the relay
	// connects to it with replication=database, so its role needs the
	// REPLICATION attribute (and CREATE on the database, once, for the
	// publication). Required.
	ConnString string
	// Prefix is the logical decoding message prefix to relay; "" means
	// DefaultWALPrefix. Messages under other prefixes are ignored.
	Prefix string
	// Slot is the logical replication slot (pgoutput), created when
	// absent; "" means DefaultWALSlot. Letters a-z, digits and _ only. The
	// slot keeps WAL on the server until the relay confirms it: drop it
	// (pg_drop_replication_slot) when retiring the relay.
	Slot string
	// Publication is the publication pgoutput requires, created (with no
	// tables) when absent; "" means DefaultWALPublication. Same characters
	// as Slot.
	Publication string
	// KafkaOptions are extra franz-go client options; acks and idempotence
	// are overridden as for RelayConfig.KafkaOptions.
	KafkaOptions []kgo.Opt
	// MaxRecordBytes is the largest record the relay produces (the
	// producer's batch limit is this plus a batch header); 0 means
	// DefaultMaxRecordBytes. Set it to the writers'
	// WithWALMaxRecordBytes; raise it only together with the brokers'
	// message.max.bytes.
	MaxRecordBytes int
	// BatchSize is how many records the relay gathers (whole transactions)
	// before publishing; 0 means DefaultBatchSize.
	BatchSize int
	// Linger bounds how long a committed message waits for more before
	// the relay publishes a batch smaller than BatchSize: from the first
	// message of a batch; 0 means DefaultWALLinger.
	Linger time.Duration
	// TakeoverInterval is how often a standby relay tries the slot (only
	// one connection may stream a slot); 0 means DefaultTakeoverInterval.
	TakeoverInterval time.Duration
	// ProduceTimeout bounds one attempt at publishing a batch; 0 means
	// DefaultProduceTimeout.
	ProduceTimeout time.Duration
	// RetryBackoff is the first wait after an error; it doubles up to 5s
	// while errors repeat. 0 means DefaultRetryBackoff.
	RetryBackoff time.Duration
	// StatusInterval is how often the relay reports its position when idle;
	// 0 means DefaultWALStatusInterval. Keep it below the server's
	// wal_sender_timeout (60s by default).
	StatusInterval time.Duration
	// Logger receives the relay's logs; nil means slog.Default().
	Logger *slog.Logger
	// Hooks are optional callbacks, for metrics and tests.
	Hooks WALRelayHooks
}

// WALRelayHooks are optional callbacks into a WAL relay's life. Each may be
// nil. They run on the relay's goroutine and must not block for long.
type WALRelayHooks struct {
	// OnActive runs with true when this relay starts streaming the slot
	// and with false when the stream ends.
	OnActive func(active bool)
	// OnPublished runs after a batch of n records was acknowledged by the
	// brokers and its position confirmed to the server.
	OnPublished func(n int)
	// OnPublishError runs after each failed attempt at publishing a batch
	// (attempt counts from 1); the batch is published again, whole.
	OnPublishError func(attempt int, err error)
	// AfterAck runs after a batch is acknowledged and before its end
	// position (lsn) is confirmed to the server. If it returns an error,
	// Run stops at once and returns it (wrapped) without confirming, as
	// if the process had died there: a fault-injection point for tests.
	AfterAck func(ctx context.Context, lsn uint64) error
}

// WALRelay streams the messages WALOutbox wrote, in commit order, to Kafka,
// and confirms their WAL position to the server only after the brokers
// acknowledged them. Several may run against one slot: PostgreSQL lets one
// connection stream a slot at a time, the others stand by. Build one with
// NewWALRelay, call Run, and Close it when Run has returned.
type WALRelay struct {
	cfg    WALRelayConfig
	pgcfg  *pgconn.Config
	client *kgo.Client
	log    *slog.Logger
}

// NewWALRelay returns a WAL relay publishing through a new franz-go client
// seeded with brokers. It fails when brokers or cfg.ConnString is empty or
// invalid, the slot or publication name is not [a-z0-9_]{1,63}, a size or
// duration is negative, or the client options are invalid. It does not
// connect to anything.
func NewWALRelay(brokers []string, cfg WALRelayConfig) (*WALRelay, error) {
	if len(brokers) == 0 {
		return nil, errors.New("outbox: NewWALRelay: no Kafka brokers")
	}
	if cfg.ConnString == "" {
		return nil, errors.New("outbox: NewWALRelay: no ConnString")
	}
	if cfg.BatchSize < 0 || cfg.MaxRecordBytes < 0 || cfg.Linger < 0 || cfg.TakeoverInterval < 0 || cfg.ProduceTimeout < 0 || cfg.RetryBackoff < 0 || cfg.StatusInterval < 0 {
		return nil, fmt.Errorf("outbox: NewWALRelay: negative size or duration in %+v", cfg)
	}
	cfg.Prefix = cmp.Or(cfg.Prefix, DefaultWALPrefix)
	cfg.Slot = cmp.Or(cfg.Slot, DefaultWALSlot)
	cfg.Publication = cmp.Or(cfg.Publication, DefaultWALPublication)
	for what, name := range map[string]string{"slot": cfg.Slot, "publication": cfg.Publication} {
		if !slotName.MatchString(name) {
			return nil, fmt.Errorf("outbox: NewWALRelay: %s name %q: use 1 to 63 of a-z, 0-9 and _", what, name)
		}
	}
	cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultBatchSize)
	cfg.MaxRecordBytes = cmp.Or(cfg.MaxRecordBytes, DefaultMaxRecordBytes)
	cfg.Linger = cmp.Or(cfg.Linger, DefaultWALLinger)
	cfg.TakeoverInterval = cmp.Or(cfg.TakeoverInterval, DefaultTakeoverInterval)
	cfg.ProduceTimeout = cmp.Or(cfg.ProduceTimeout, DefaultProduceTimeout)
	cfg.RetryBackoff = cmp.Or(cfg.RetryBackoff, DefaultRetryBackoff)
	cfg.StatusInterval = cmp.Or(cfg.StatusInterval, DefaultWALStatusInterval)
	pgcfg, err := pgconn.ParseConfig(cfg.ConnString)
	if err != nil {
		return nil, fmt.Errorf("outbox: NewWALRelay: parsing ConnString: %w", redact.Error(err, cfg.ConnString))
	}
	pgcfg.RuntimeParams["replication"] = "database"
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = slog.New(redact.Handler(log.Handler())).With("component", "outbox-wal-relay", "slot", cfg.Slot, "prefix", cfg.Prefix)
	opts := append([]kgo.Opt{}, cfg.KafkaOptions...)
	opts = append(opts,
		kgo.WithHooks(brokerlog.New(log)), // franz-go retries an unreachable broker without a word
		kgo.SeedBrokers(brokers...),
		kgo.AllowAutoTopicCreation(),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordDeliveryTimeout(max(cfg.ProduceTimeout, time.Second)),
		kgo.ProducerBatchMaxBytes(int32(min(cfg.MaxRecordBytes+recordBatchOverhead, 1<<30))),
		kgo.UnknownTopicRetries(4),
	)
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("outbox: NewWALRelay: creating Kafka client: %w", err)
	}
	return &WALRelay{cfg: cfg, pgcfg: pgcfg, client: client, log: log}, nil
}

// Close releases the relay's Kafka client. Call it after Run has returned.
func (r *WALRelay) Close() { r.client.Close() }

// errSlotBusy means another connection streams the slot.
var errSlotBusy = errors.New("replication slot in use by another relay")

// Run relays until ctx is done, then returns nil. Each session connects in
// replication mode, creates the publication and the slot when absent, and
// starts streaming the slot with pgoutput (messages 'true'); while another
// relay streams it, Run stands by, retrying every TakeoverInterval. The
// server sends only committed transactions, in commit order, from the
// slot's confirmed position: a message of a rolled-back transaction is never
// seen. The relay gathers whole transactions' messages (up to about
// BatchSize records, or what arrived within Linger of the first) into a
// batch and produces it, in order, while it reads the next ones (up to 4
// batches in flight); a batch's end position is confirmed
// (StandbyStatusUpdate) only once every record of it and of the batches
// before it was acknowledged. A crash before the confirmation streams the
// batch again to the next relay, which republishes it with the same
// message ids.
//
// When a batch fails, every record in flight is published again, whole and
// in order, after a backoff, for as long as it fails (as with the table
// relay, a broker that refuses an earlier record of a key but accepts a
// later one lets the later one out first): the WAL relay cannot park a
// record (there is no row to mark), so a record the brokers refuse for ever
// (a topic that does not exist with auto-creation off, a topic's lower
// max.message.bytes) stalls the relay, logged at error level on every
// attempt, until the cause is fixed. An undecodable payload under the
// prefix stalls it likewise. Other errors end the session; Run reconnects
// after a backoff. Run returns a non-nil error only when an AfterAck hook
// stops it.
func (r *WALRelay) Run(ctx context.Context) error {
	backoff := r.cfg.RetryBackoff
	standby := false // said so already
	for {
		active, err := r.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if se := (*stopError)(nil); errors.As(err, &se) {
			return err
		}
		wait := backoff
		if !errors.Is(err, errSlotBusy) {
			standby = false
		}
		switch {
		case errors.Is(err, errSlotBusy):
			wait = r.cfg.TakeoverInterval
			if !standby {
				standby = true
				r.log.Info("outbox WAL relay on standby: another relay streams the slot; trying again every takeover interval",
					"slot", r.cfg.Slot, "takeover_interval", wait)
			}
		case active:
			backoff = r.cfg.RetryBackoff
			wait = backoff
			fallthrough
		default:
			level := slog.LevelWarn
			if errors.Is(err, ErrBadWALPayload) {
				level = slog.LevelError // stalls here until the payload's writer is fixed
			}
			r.log.Log(ctx, level, "outbox WAL relay session ended; reconnecting", "error", err, "backoff", wait)
			backoff = min(2*backoff, maxRetryBackoff)
		}
		if !sleep(ctx, wait) {
			return nil
		}
	}
}

// maxInflightBatches bounds the batches the WAL relay has produced and not
// yet seen acknowledged: it keeps reading the stream while they are in
// flight, and confirms them in order as their acks arrive.
const maxInflightBatches = 4

// walBatch is one produced batch awaiting its acks.
type walBatch struct {
	recs []*kgo.Record
	end  pglogrepl.LSN // confirmed once every record is acked
	left atomic.Int64  // records not yet acked or failed
	done chan struct{} // closed when left reaches 0
	mu   sync.Mutex
	err  error // the first produce error
}

// walState is one streaming session's position.
type walState struct {
	pending    []*kgo.Record // whole committed transactions, not yet produced
	pendingEnd pglogrepl.LSN // end of the last transaction in pending
	txn        []*kgo.Record // the open transaction's records
	inTxn      bool
	inflight   []*walBatch   // produced, oldest first
	confirmed  pglogrepl.LSN // everything up to here is acked (or had nothing to publish)
}

// idle reports whether every record read so far is confirmed.
func (st *walState) idle() bool { return !st.inTxn && len(st.pending) == 0 && len(st.inflight) == 0 }

func (r *WALRelay) session(ctx context.Context) (active bool, err error) {
	conn, err := pgconn.ConnectConfig(ctx, r.pgcfg)
	if err != nil {
		return false, fmt.Errorf("connecting in replication mode: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if err := r.setup(ctx, conn); err != nil {
		return false, err
	}
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + r.cfg.Publication + "'", "messages 'true'"},
	})
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "55006" { // object_in_use
		return false, errSlotBusy
	}
	if err != nil {
		return false, fmt.Errorf("starting replication from slot %s: %w", r.cfg.Slot, err)
	}
	r.log.Info("outbox WAL relay active")
	if h := r.cfg.Hooks.OnActive; h != nil {
		h(true)
		defer h(false)
	}
	defer r.log.Info("outbox WAL relay inactive")
	return true, r.stream(ctx, conn)
}

// Setup connects in replication mode and creates the publication and the
// slot when absent, then disconnects. Run does the same at every start;
// call Setup before the first writer uses the WALOutbox (a deployment step),
// because the slot keeps only the WAL written after its creation: events
// committed before it exists are never relayed. It fails with the wrapped
// error when the server cannot be reached, wal_level is not logical, or the
// role lacks REPLICATION (or CREATE on the database, for the publication).
func (r *WALRelay) Setup(ctx context.Context) error {
	conn, err := pgconn.ConnectConfig(ctx, r.pgcfg)
	if err != nil {
		return fmt.Errorf("outbox: WAL relay setup: connecting in replication mode: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := r.setup(ctx, conn); err != nil {
		return fmt.Errorf("outbox: WAL relay setup: %w", err)
	}
	return nil
}

// setup creates the publication and the slot when absent.
func (r *WALRelay) setup(ctx context.Context, conn *pgconn.PgConn) error {
	_, err := conn.Exec(ctx, "create publication "+pgx.Identifier{r.cfg.Publication}.Sanitize()).ReadAll()
	if pe := (*pgconn.PgError)(nil); err != nil && !(errors.As(err, &pe) && pe.Code == "42710") { // duplicate_object
		return fmt.Errorf("creating publication %s: %w", r.cfg.Publication, err)
	}
	_, err = pglogrepl.CreateReplicationSlot(ctx, conn, r.cfg.Slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{})
	if pe := (*pgconn.PgError)(nil); err != nil && !(errors.As(err, &pe) && pe.Code == "42710") {
		return fmt.Errorf("creating replication slot %s (wal_level must be logical, the role needs REPLICATION): %w", r.cfg.Slot, err)
	}
	return nil
}

// stream reads the replication stream until an error.
func (r *WALRelay) stream(ctx context.Context, conn *pgconn.PgConn) error {
	var st walState
	nextStatus := time.Now().Add(r.cfg.StatusInterval)
	// One receive context per deadline, not per message (a context with
	// a deadline per message costs more than decoding it). A batch whose
	// last ack arrives cancels it (wake), so a blocked receive returns and
	// the batch is confirmed at once.
	var recv struct {
		mu     sync.Mutex
		ctx    context.Context
		cancel context.CancelFunc
	}
	wake := func() {
		recv.mu.Lock()
		if recv.cancel != nil {
			recv.cancel()
		}
		recv.mu.Unlock()
	}
	defer wake()
	// A next session must not produce while this one's records are
	// still in flight: it could overtake them.
	defer r.drain(&st)
	var deadline, firstPending time.Time
	for {
		if err := r.settle(ctx, conn, &st, false); err != nil {
			return err
		}
		if len(st.pending) >= r.cfg.BatchSize {
			if err := r.dispatch(ctx, conn, &st, wake); err != nil {
				return err
			}
			continue
		}
		want := nextStatus
		if len(st.pending) == 0 {
			firstPending = time.Time{}
		} else {
			if firstPending.IsZero() {
				firstPending = time.Now()
			}
			want = firstPending.Add(r.cfg.Linger)
		}
		recv.mu.Lock()
		if recv.ctx == nil || !want.Equal(deadline) || recv.ctx.Err() != nil {
			if recv.cancel != nil {
				recv.cancel()
			}
			deadline = want
			recv.ctx, recv.cancel = context.WithDeadline(ctx, deadline)
		}
		rctx := recv.ctx
		recv.mu.Unlock()
		// An ack that completed the oldest batch before rctx was
		// registered did not cancel it: look before blocking.
		if len(st.inflight) > 0 {
			select {
			case <-st.inflight[0].done:
				continue
			default:
			}
		}
		msg, err := conn.ReceiveMessage(rctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, context.Canceled) {
			continue // woken by an ack
		}
		if pgconn.Timeout(err) {
			if len(st.pending) > 0 {
				if err := r.dispatch(ctx, conn, &st, wake); err != nil {
					return err
				}
			}
			if time.Now().After(nextStatus) {
				if err := r.status(ctx, conn, st.confirmed); err != nil {
					return err
				}
				nextStatus = time.Now().Add(r.cfg.StatusInterval)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("receiving from the replication stream: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if err := r.handle(ctx, conn, &st, msg.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(msg))
		default:
			return fmt.Errorf("replication stream: unexpected %T", msg)
		}
	}
}

// handle processes one CopyData message of the stream.
func (r *WALRelay) handle(ctx context.Context, conn *pgconn.PgConn, st *walState, data []byte) error {
	if len(data) == 0 {
		return errors.New("replication stream: empty CopyData")
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parsing keepalive: %w", err)
		}
		// Every commit before ServerWALEnd has been streamed; with
		// nothing open or unacknowledged, all of it is done.
		if st.idle() && ka.ServerWALEnd > st.confirmed {
			st.confirmed = ka.ServerWALEnd
		}
		if ka.ReplyRequested {
			return r.status(ctx, conn, st.confirmed)
		}
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parsing XLogData: %w", err)
		}
		m, err := pglogrepl.Parse(xld.WALData)
		if err != nil {
			return fmt.Errorf("parsing a pgoutput message at %s: %w", xld.WALStart, err)
		}
		switch m := m.(type) {
		case *pglogrepl.BeginMessage:
			st.inTxn, st.txn = true, st.txn[:0]
		case *pglogrepl.LogicalDecodingMessage:
			if !m.Transactional || m.Prefix != r.cfg.Prefix {
				return nil
			}
			// The stream's buffer is reused by the next receive: the
			// record keeps its own copy.
			wm, err := decodeWAL(bytes.Clone(m.Content))
			if err != nil {
				return fmt.Errorf("decoding the message at %s: %w", m.LSN, err)
			}
			hs := make([]kgo.RecordHeader, 0, len(wm.headers)+1)
			for _, h := range wm.headers {
				hs = append(hs, kgo.RecordHeader{Key: h.Key, Value: h.Value})
			}
			hs = append(hs, kgo.RecordHeader{Key: HeaderMessageID, Value: []byte(wm.id)})
			st.txn = append(st.txn, &kgo.Record{Topic: wm.topic, Key: wm.key, Value: wm.value, Headers: hs})
		case *pglogrepl.CommitMessage:
			st.inTxn = false
			if len(st.txn) > 0 {
				st.pending = append(st.pending, st.txn...)
				st.txn = nil
			}
			// A transaction without messages is confirmed with
			// what comes before it.
			end := m.TransactionEndLSN
			switch n := len(st.inflight); {
			case len(st.pending) > 0:
				st.pendingEnd = end
			case n > 0:
				st.inflight[n-1].end = max(st.inflight[n-1].end, end)
			default:
				st.confirmed = max(st.confirmed, end)
			}
		}
	}
	return nil
}

// dispatch produces st.pending as a new in-flight batch, without waiting
// for the acks; wake runs when its last ack (or failure) arrives. With
// maxInflightBatches in flight it waits for the oldest.
func (r *WALRelay) dispatch(ctx context.Context, conn *pgconn.PgConn, st *walState, wake func()) error {
	if len(st.pending) == 0 {
		return nil
	}
	b := &walBatch{recs: st.pending, end: st.pendingEnd, done: make(chan struct{})}
	st.pending, st.pendingEnd = nil, 0
	b.left.Store(int64(len(b.recs)))
	st.inflight = append(st.inflight, b)
	for _, rec := range b.recs {
		r.client.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				b.mu.Lock()
				b.err = cmp.Or(b.err, err)
				b.mu.Unlock()
			}
			if b.left.Add(-1) == 0 {
				close(b.done)
				wake()
			}
		})
	}
	if len(st.inflight) >= maxInflightBatches {
		return r.settle(ctx, conn, st, true)
	}
	return nil
}

// settle confirms the oldest in-flight batches whose records were all
// acknowledged, in order, waiting for the oldest first when wait is set.
// When a batch failed, every in-flight record is published again, in
// order, until acknowledged (republish).
func (r *WALRelay) settle(ctx context.Context, conn *pgconn.PgConn, st *walState, wait bool) error {
	for len(st.inflight) > 0 {
		head := st.inflight[0]
		if wait {
			select {
			case <-head.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			wait = false
		} else {
			select {
			case <-head.done:
			default:
				return nil
			}
		}
		head.mu.Lock()
		err := head.err
		head.mu.Unlock()
		if err != nil {
			return r.republish(ctx, conn, st, err)
		}
		st.inflight = st.inflight[1:]
		if err := r.confirm(ctx, conn, st, head.end, len(head.recs)); err != nil {
			return err
		}
	}
	return nil
}

// republish waits for every in-flight batch, then produces all their
// records again, whole and in order, until every one is acknowledged, and
// confirms the last batch's end. first is the error that failed them.
func (r *WALRelay) republish(ctx context.Context, conn *pgconn.PgConn, st *walState, first error) error {
	for _, b := range st.inflight {
		select {
		case <-b.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var recs []*kgo.Record
	for _, b := range st.inflight {
		recs = append(recs, b.recs...)
	}
	end := st.inflight[len(st.inflight)-1].end
	st.inflight = nil
	backoff := r.cfg.RetryBackoff
	err := first
	for attempt := 1; err != nil; attempt++ {
		if h := r.cfg.Hooks.OnPublishError; h != nil {
			h(attempt, err)
		}
		level := slog.LevelWarn
		if PermanentProduceError(err) {
			level = slog.LevelError // the WAL relay cannot park: it stalls until fixed
		}
		r.log.Log(ctx, level, "outbox WAL relay publish failed; publishing the records in flight again", "error", err,
			"records", len(recs), "attempt", attempt, "backoff", backoff)
		if !sleep(ctx, backoff) {
			return ctx.Err()
		}
		backoff = min(2*backoff, maxRetryBackoff)
		// Keep the stream alive (wal_sender_timeout) while retrying.
		if err := r.status(ctx, conn, st.confirmed); err != nil {
			return err
		}
		// Fresh records: franz-go fills in the produced ones' fields.
		fresh := make([]*kgo.Record, len(recs))
		for i, p := range recs {
			fresh[i] = &kgo.Record{Topic: p.Topic, Key: p.Key, Value: p.Value, Headers: p.Headers}
		}
		pctx, cancel := context.WithTimeout(ctx, r.cfg.ProduceTimeout)
		err = r.client.ProduceSync(pctx, fresh...).FirstErr()
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return r.confirm(ctx, conn, st, end, len(recs))
}

// confirm runs AfterAck, then reports end as confirmed and runs
// OnPublished with the n records acknowledged.
func (r *WALRelay) confirm(ctx context.Context, conn *pgconn.PgConn, st *walState, end pglogrepl.LSN, n int) error {
	if h := r.cfg.Hooks.AfterAck; h != nil {
		if err := h(ctx, uint64(end)); err != nil {
			return &stopError{err}
		}
	}
	st.confirmed = max(st.confirmed, end)
	if err := r.status(ctx, conn, st.confirmed); err != nil {
		return err
	}
	if h := r.cfg.Hooks.OnPublished; h != nil {
		h(n)
	}
	return nil
}

// drain waits, up to ProduceTimeout and a second, for the records still in
// flight when a session ends (their acks no longer matter: the next
// session streams them again).
func (r *WALRelay) drain(st *walState) {
	t := time.NewTimer(r.cfg.ProduceTimeout + time.Second)
	defer t.Stop()
	for _, b := range st.inflight {
		select {
		case <-b.done:
		case <-t.C:
			r.log.Warn("outbox WAL relay session ended with records still in flight", "batches", len(st.inflight))
			return
		}
	}
}

// status reports lsn as written, flushed and applied: the server may
// recycle the WAL before it, and streams from it after a restart.
func (r *WALRelay) status(ctx context.Context, conn *pgconn.PgConn, lsn pglogrepl.LSN) error {
	err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: lsn, WALFlushPosition: lsn, WALApplyPosition: lsn,
	})
	if err != nil {
		return fmt.Errorf("confirming position %s: %w", lsn, err)
	}
	return nil
}
