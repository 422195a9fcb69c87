package outbox

import (
	"context"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/deferred"
	"github.com/exactly-go/exactly/internal/runtime/jsonflat"
	"github.com/exactly-go/exactly/internal/runtime/migrate"
)

// DefaultTable is the outbox table's name when WithTable is not used; it is
// looked up in the connection's search_path.
const DefaultTable = "exactly_outbox"

// defaultQuoted is DefaultTable sanitized as an identifier
// (TestDefaultQuotedIsSanitizedDefaultTable).
const defaultQuoted = `"` + DefaultTable + `"`

// Header names the relay sets on every record it publishes.
const (
	// HeaderMessageID carries the row's message id, a UUID fixed when the
	// row was written, so republishing the same row (after a relay crash
	// between the broker's ack and the row's deletion) produces records
	// with the same id that a downstream consumer deduplicates. Only
	// Message.ID overrides it: a message-id among Message.Headers (for
	// instance copied from the record a handler consumed) is dropped, so N
	// messages emitted with copied headers never share one id.
	HeaderMessageID = "message-id"
	// HeaderOutboxID carries the row's id in the outbox table (decimal), for
	// debugging.
	HeaderOutboxID = "exactly-outbox-id"
)

// maxChannelLen is PostgreSQL's limit on identifier (and so channel) length.
const maxChannelLen = 63

//go:embed migrations/*.sql
var migrationFiles embed.FS

// ErrInvalidMessage is returned (wrapped, as a *MessageError) by Add when a
// message cannot be stored or never could be published: an illegal Kafka
// topic name, a record over the size limit, or a header name that is not
// valid UTF-8 or holds a NUL byte.
var ErrInvalidMessage = errors.New("outbox: invalid message")

// Message is one Kafka record to publish once the transaction that adds it
// commits.
type Message struct {
	// Topic is the Kafka topic; required.
	Topic string
	// Key is the record key. Messages with the same (non-nil) key on one
	// topic are published in the order their transactions committed. A nil
	// key is published without a key and without an order guarantee.
	Key []byte
	// Value is the record value; nil is a tombstone.
	Value []byte
	// Headers are the record headers, published in this order before the
	// headers the relay adds. A message-id header among them is dropped:
	// set ID to choose the published message-id.
	Headers []handler.Header
	// ID, when not empty, is published as the record's message-id header
	// instead of the row's own UUID. Set it only to keep an id that already
	// names this very message (a dead letter keeps its record's id); two
	// messages with one ID are one message to a deduplicating consumer.
	ID string
}

// Querier runs statements; pgx.Tx, *pgx.Conn, *pgxpool.Pool and
// *pgxpool.Conn all satisfy it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Outbox writes messages to one outbox table and wakes the relays built
// from it (see Wake). Build it with New; it is safe for concurrent use.
// Share one Outbox value between the handlers that add rows and the relay
// of the same process: the relay then wakes as soon as a consumer's
// transaction commits instead of waiting for a notification.
type Outbox struct {
	schema, name string
	quoted       string // sanitized, possibly schema-qualified identifier
	// bufKey is quoted as the key of the table's queue and wake in a
	// consumer transaction's deferred.Buffer, boxed once: boxing a string
	// allocates, and Add would box it three times per row.
	bufKey    any
	channel   string
	maxRecord int // largest record Add accepts (RecordSize plus the relay's headers)

	// stmts holds the statements on the table, built at first use (see
	// sql): the package-level Add, AddValue and AddJSON make an Outbox per
	// call, and most calls, inside a consumer, only queue their row.
	stmtsOnce sync.Once
	stmts     *statements

	// waker is built at first use (see wk): a fresh Outbox of the
	// package-level functions, inside a consumer, never needs it.
	wakerOnce sync.Once
	waker     *waker

	// json encodes AddJSON's flat structs (see encode); nil in the fresh
	// Outbox of each package-level call, which would build an encoder for
	// one value.
	json *jsonflat.Encoders
}

// wk returns o's waker, building it at the first call.
func (o *Outbox) wk() *waker {
	o.wakerOnce.Do(func() { o.waker = newWaker(o.channel) })
	return o.waker
}

// Option configures an Outbox.
type Option func(*Outbox)

// WithTable sets the outbox table: name in schema, or in the search_path
// when schema is "". An empty name keeps DefaultTable. Any characters are
// allowed; the names are quoted, never spliced into SQL.
func WithTable(schema, name string) Option {
	return func(o *Outbox) {
		o.schema = schema
		if name != "" {
			o.name = name
		}
	}
}

// WithMaxRecordBytes sets the largest record (key, value, headers and the
// relay's own headers, sized by RecordSize) that Add accepts; n <= 0 keeps
// DefaultMaxRecordBytes. Set it to the relay's RelayConfig.MaxRecordBytes:
// a larger record would reach the relay only to be parked.
func WithMaxRecordBytes(n int) Option {
	return func(o *Outbox) {
		if n > 0 {
			o.maxRecord = n
		}
	}
}

// New returns an Outbox configured by opts; by default it uses the table
// "exactly_outbox" in the search_path. New never fails.
func New(opts ...Option) *Outbox {
	o := newOutbox(opts...)
	o.json = &jsonflat.Encoders{}
	return o
}

// newOutbox is New without the JSON encoders, for the package-level
// functions' one-call Outbox.
func newOutbox(opts ...Option) *Outbox {
	o := &Outbox{name: DefaultTable, maxRecord: DefaultMaxRecordBytes}
	for _, opt := range opts {
		opt(o)
	}
	if o.schema == "" && o.name == DefaultTable {
		o.quoted, o.channel = defaultQuoted, DefaultTable // what the lines below give, without allocating
		o.bufKey = defaultQuoted                          // a constant boxes without allocating
	} else {
		o.quoted = o.Table().Sanitize()
		o.channel = channelName(o.schema, o.name)
		o.bufKey = o.quoted
	}
	return o
}

// statements are the SQL statements of an Outbox on its table.
type statements struct {
	addSQL, addNoKeySQL, flushSQL, flushOneSQL, fetchSQL, deleteSQL, backlogSQL string
	parkSQL, parkedSQL, parkedCountSQL, retrySQL, dropSQL                       string
}

// sql returns o's statements, building them at the first call.
func (o *Outbox) sql() *statements {
	o.stmtsOnce.Do(func() { o.stmts = newStatements(o.quoted) })
	return o.stmts
}

// newStatements builds the statements on table t (sanitized).
func newStatements(t string) *statements {
	st := &statements{}
	// No statement here notifies: NOTIFY in a writing transaction
	// serialises its commit with every other notifying commit (see Wake).
	//
	// A direct Add (outside a consumer), in one round trip: take the
	// per-key lock, then insert. The CTE is referenced by the insert's
	// FROM, so it runs before the row (and its id, from nextval) is
	// formed: the id is drawn only once the lock is held, so for one key
	// id order is commit order even when the caller locks rows after Add.
	st.addSQL = `with l as (select pg_advisory_xact_lock($1::bigint))
insert into ` + t + ` (topic, key, value, headers) select $2, $3, $4, $5::jsonb from l`
	// A consumer batch's rows at once, in the order they were added, just
	// before COMMIT. No key locks: the ids are drawn after every read and
	// write of the batch's handlers, so a batch that depends on another
	// (read its writes, waited for its row locks) draws larger ids; see
	// "The relay's ordering argument" in docs/design.md.
	// The topics ($1) hold one element when every row's is the same, and
	// the headers ($3) none when no row has any: unnest pads the shorter
	// arrays with nulls, which stand for that topic and for no headers.
	// The values, the largest array, come last ($4): pgx encodes the
	// parameters in order into one buffer, which then grows once for them
	// instead of again for the arrays after them.
	st.flushSQL = `insert into ` + t + ` (topic, key, value, headers)
select coalesce(u.topic, ($1::text[])[1]), u.key, u.value, u.headers::jsonb
from unnest($1::text[], $2::bytea[], $4::bytea[], $3::text[]) with ordinality as u(topic, key, value, headers, ord)
order by u.ord`
	st.flushOneSQL = `insert into ` + t + ` (topic, key, value, headers) values ($1, $2, $3, $4::jsonb)`
	st.addNoKeySQL = `insert into ` + t + ` (topic, key, value, headers) values ($1, null, $2, $3::jsonb)`
	// Every committed row, oldest id first. No "id > last seen" (a row
	// whose transaction commits late would be skipped) and no xmin filter
	// (it reorders a key; see "Order" in doc.go): for rows of one key
	// that depend on each other, id order is commit order (the per-key
	// lock of a direct Add; the late ids of a consumer's flush). Parked
	// rows, and the rows of a parked row's (topic, key), are left out (a
	// keyless row holds only itself: null never equals null); the check
	// reads the partial index of parked rows.
	publishable := `r.parked_at is null
and not exists (select from ` + t + ` p where p.parked_at is not null and p.topic = r.topic and p.key = r.key)`
	st.fetchSQL = `select id, message_id::text, topic, key, value, headers,
	(extract(epoch from clock_timestamp() - created_at) * 1000000)::bigint
from ` + t + ` r
where ` + publishable + `
order by id
limit $1`
	st.parkSQL = `update ` + t + ` set parked_at = clock_timestamp(), park_reason = $2 where id = $1 and parked_at is null`
	const parkedCols = `p.id, p.message_id::text, p.topic, p.key, p.parked_at, p.park_reason, coalesce(length(p.key), 0) + coalesce(length(p.value), 0)`
	// $1: topic or ''; $2: key or null (any); $3: id or 0 (any).
	const match = `p.parked_at is not null and ($1::text = '' or p.topic = $1) and ($2::bytea is null or p.key = $2) and ($3::bigint = 0 or p.id = $3)`
	st.parkedSQL = `select ` + parkedCols + `,
	(select count(*) from ` + t + ` h where h.parked_at is null and h.topic = p.topic and h.key = p.key)
from ` + t + ` p where ` + match + ` order by p.id`
	st.parkedCountSQL = `select count(*) from ` + t + ` where parked_at is not null`
	// Retry and Drop wake the relay after their statement (see wakeAfter).
	st.retrySQL = `update ` + t + ` p set parked_at = null, park_reason = null where ` + match + `
returning ` + strings.ReplaceAll(parkedCols, "p.parked_at, p.park_reason", "now(), ''") + `, 0::bigint`
	st.dropSQL = `delete from ` + t + ` p where ` + match + `
returning ` + parkedCols + `, 0::bigint`
	st.deleteSQL = `delete from ` + t + ` where id = any($1::bigint[])`
	// The backlog is what the relay will publish: parked rows and the rows
	// held behind them wait for an operator, not for the relay (they are
	// counted by ParkedCount and listed by Parked).
	st.backlogSQL = `select count(*), coalesce((extract(epoch from clock_timestamp() - min(created_at)) * 1000000)::bigint, 0) from ` + t + ` r where ` + publishable
	return st
}

// channelName derives the LISTEN/NOTIFY channel from the table name: the
// (schema-qualified) name itself when it fits PostgreSQL's 63-byte limit,
// else a hash of it.
func channelName(schema, name string) string {
	c := name
	if schema != "" {
		c = schema + "." + name
	}
	if len(c) <= maxChannelLen && !strings.ContainsRune(c, 0) {
		return c
	}
	h := fnv.New64a()
	h.Write([]byte(c))
	return "exactly_outbox_" + hex.EncodeToString(h.Sum(nil))
}

// Table returns the outbox table's identifier: {schema, name}, or {name}
// when no schema is configured. Use its Sanitize method to put it into SQL.
func (o *Outbox) Table() pgx.Identifier {
	if o.schema == "" {
		return pgx.Identifier{o.name}
	}
	return pgx.Identifier{o.schema, o.name}
}

// Channel returns the LISTEN/NOTIFY channel the relay listens on and Wake
// notifies (outside any writing transaction).
func (o *Outbox) Channel() string { return o.channel }

// component names this outbox's schema in the migrations table.
func (o *Outbox) component() string { return "outbox:" + o.quoted }

// keyLockKey is the transaction advisory lock key a direct Add takes for
// (topic, key).
func (o *Outbox) keyLockKey(topic string, key []byte) int64 {
	return hash64("exactly-outbox-key", o.quoted, topic, string(key))
}

// hash64 is FNV-1a over the length-prefixed parts. It must never change:
// every writer of a table must compute the same lock keys.
func hash64(parts ...string) int64 {
	h := fnv.New64a()
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	return int64(h.Sum64())
}

// Migrate creates or upgrades the default outbox table ("exactly_outbox" in
// the search_path). See Outbox.Migrate.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return newOutbox().Migrate(ctx, pool)
}

// Migrate creates or upgrades o's table (and its schema, if configured and
// absent). It is idempotent and safe to run from several instances at once:
// migrators serialize on an advisory lock and a migrated schema is left
// unchanged. An outbox table dropped after it was migrated (its schema
// dropped with cascade, a partial restore) is created again from scratch,
// with a warning on slog.Default, although exactly_schema_migrations still
// records its versions. It fails with the wrapped database error, leaving
// the schema as it was.
func (o *Outbox) Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	migs, err := o.migrations()
	if err != nil {
		return err
	}
	if _, err := migrate.Apply(ctx, pool, o.component(), migs, migrate.WithTable(o.Table())); err != nil {
		return fmt.Errorf("outbox: migrate %s: %w", o.quoted, err)
	}
	return nil
}

func (o *Outbox) migrations() ([]migrate.Migration, error) {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("outbox: open embedded migrations: %w", err)
	}
	data := struct{ Schema, Table, Lease string }{Table: o.quoted, Lease: o.leaseTable().Sanitize()}
	if o.schema != "" {
		data.Schema = pgx.Identifier{o.schema}.Sanitize()
	}
	migs, err := migrate.Load(sub, data)
	if err != nil {
		return nil, fmt.Errorf("outbox: load migrations: %w", err)
	}
	return migs, nil
}

// SchemaVersion reports the outbox table's schema version recorded in the
// database (0 when never migrated, and when the table does not exist
// whatever is recorded) and the latest version this package knows; current < latest means Migrate has work to do. It fails with the
// wrapped database error.
func (o *Outbox) SchemaVersion(ctx context.Context, q Querier) (current, latest int, err error) {
	migs, err := o.migrations()
	if err != nil {
		return 0, 0, err
	}
	current, err = migrate.Version(ctx, q, o.component(), migrate.WithTable(o.Table()))
	if err != nil {
		return 0, 0, fmt.Errorf("outbox: schema version of %s: %w", o.quoted, err)
	}
	return current, migrate.Latest(migs), nil
}

// storedHeader is one header as stored in the headers jsonb column; the
// value is base64 (encoding/json's encoding of []byte). ID marks the
// message-id header that Message.ID set: the only one the relay publishes.
type storedHeader struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
	ID    bool   `json:"id,omitempty"`
}

// Writer adds messages to an outbox inside the caller's transaction:
// [*Outbox] (one table), [*Sharded] (a table per shard) and [*WALOutbox]
// (the write-ahead log) are writers, with the same methods, and a handler
// that takes a Writer works with any of them.
//
// A message added with tx is published after tx commits and never if tx
// rolls back: the added row (or WAL message) is part of tx, and inside an
// exactly consumer's transaction the queued message is dropped with the
// rolled-back batch (the batch's retry adds it again). A writer's methods
// fail with a *MessageError (wrapping ErrInvalidMessage) without touching
// tx when the message could never be published, with the codec's error
// when AddJSON cannot encode v, and with the wrapped database error
// otherwise; a failed statement aborts tx, as any failed statement does.
type Writer interface {
	// Add writes msg inside tx.
	Add(ctx context.Context, tx pgx.Tx, msg Message) error
	// AddJSON encodes v as JSON and adds it like Add, under key and with
	// headers.
	AddJSON(ctx context.Context, tx pgx.Tx, topic string, key []byte, v any, headers ...handler.Header) error
}

var (
	_ Writer = (*Outbox)(nil)
	_ Writer = (*Sharded)(nil)
	_ Writer = (*WALOutbox)(nil)
)

// Add writes msg to the default outbox table inside tx. See Outbox.Add.
func Add(ctx context.Context, tx pgx.Tx, msg Message) error {
	return newOutbox().Add(ctx, tx, msg)
}

// Add writes msg to o's table inside tx, in one round trip. The message is
// published after tx commits; if tx rolls back, the row goes with it and
// nothing is ever published. Add does not notify inside tx (a notifying
// transaction's commit is serialised with every other one's): after your
// COMMIT, call o.Wake to have the relay publish at once; without it the
// relay finds the row at its next poll (RelayConfig.PollInterval).
//
// For a non-nil key, Add first takes a transaction-scoped advisory lock on
// (table, topic, key): a second transaction adding the same key waits in Add
// until the first ends, so rows of one key are numbered, and published, in
// commit order. The lock is needed because Add draws the row's id at once:
// without it, a transaction that adds a row and only then waits for a row
// lock held by another one adding the same key would commit after it with
// a smaller id, and the relay would publish its row first
// (TestDirectAddKeyLockKeepsCommitOrder). Transactions that add several keys
// in different orders, or that add a key and then lock a row another
// transaction holds while adding that key, can deadlock; PostgreSQL then
// aborts one of them (SQLSTATE 40P01), which the caller retries. Add rows
// after the transaction's other writes, keys in a fixed (for example
// sorted) order, to avoid that.
//
// Inside a handler run by an exactly consumer (its ctx and tx), Add only
// queues the row, after the same checks, and takes no lock: the consumer
// inserts the batch's rows together just before COMMIT, when the handlers'
// reads and writes are done, so their ids follow those of every transaction
// the batch depended on; after COMMIT it wakes the relay (Wake). The handler
// therefore does not see its own outbox rows in tx.
//
// When ctx carries a valid OpenTelemetry span context, Add stores it as
// W3C traceparent (and tracestate) headers, replacing any the message had.
//
// Add fails with a *MessageError (wrapping ErrInvalidMessage) saying what is
// wrong, without touching tx, for a topic that is not a legal Kafka topic
// name (see ValidateTopic), a record larger than the outbox's limit
// (WithMaxRecordBytes; sized by RecordSize plus the relay's headers), or a
// header name that is not valid UTF-8 or contains NUL; and with the wrapped
// database error otherwise (for instance when the table does not exist); a
// failed statement aborts tx, as any failed statement does.
func (o *Outbox) Add(ctx context.Context, tx pgx.Tx, msg Message) error {
	return o.add(ctx, tx, msg, true, false)
}

// add adds msg (see Add), with a span and the trace context when trace,
// and without copying msg.Value into a consumer transaction's queue when
// ownValue (the value was made for this message).
func (o *Outbox) add(ctx context.Context, tx pgx.Tx, msg Message, trace, ownValue bool) error {
	if err := ValidateTopic(msg.Topic); err != nil {
		return err
	}
	headers := msg.Headers
	if trace {
		if actx, span, ok := addSpan(ctx, msg.Topic); ok {
			defer span.End()
			ctx = actx
			headers = withTraceContext(ctx, headers)
		}
	}
	if err := checkSize(msg, headers, o.maxRecord); err != nil {
		return err
	}
	var hdrJSON any // nil stores SQL null
	if len(headers) > 0 || msg.ID != "" {
		stored := make([]storedHeader, 0, len(headers)+1)
		for _, h := range headers {
			if strings.ContainsRune(h.Key, 0) || !utf8.ValidString(h.Key) {
				return &MessageError{Topic: msg.Topic, Reason: fmt.Sprintf("header name %q is not valid UTF-8 without NUL", h.Key)}
			}
			stored = append(stored, storedHeader{Key: h.Key, Value: h.Value})
		}
		if msg.ID != "" {
			stored = append(stored, storedHeader{Key: HeaderMessageID, Value: []byte(msg.ID), ID: true})
		}
		b, err := json.Marshal(stored)
		if err != nil {
			return fmt.Errorf("outbox: encoding headers of a message to %s: %w", msg.Topic, err)
		}
		hdrJSON = string(b)
	}
	if buf := deferred.For(ctx, tx); buf != nil {
		// Inside an exactly consumer's transaction: queued, inserted with
		// the rest of the batch's rows just before COMMIT (see flush).
		q := buf.Queue(o.bufKey, func() deferred.Flusher { return newQueue(o, buf.Hint()) }).(*queue)
		if len(q.topics) == 0 {
			q.o = o // the transaction's first row: a reused queue was another's
		}
		q.add(msg, hdrJSON, ownValue)
		if !q.wakes {
			buf.AfterCommit(o.bufKey, o) // once per table and transaction (a second is ignored)
			q.wakes = true
		}
		return nil
	}
	var err error
	if msg.Key == nil {
		_, err = tx.Exec(ctx, o.sql().addNoKeySQL, msg.Topic, msg.Value, hdrJSON)
	} else {
		_, err = tx.Exec(ctx, o.sql().addSQL, o.keyLockKey(msg.Topic, msg.Key), msg.Topic, msg.Key, msg.Value, hdrJSON)
	}
	if err != nil {
		return fmt.Errorf("outbox: adding a message to %s in %s: %w", msg.Topic, o.quoted, err)
	}
	return nil
}

// withTraceContext returns headers with the W3C trace context of ctx, when
// ctx has a valid span context, replacing any traceparent or tracestate
// headers; otherwise headers unchanged.
func withTraceContext(ctx context.Context, headers []handler.Header) []handler.Header {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return headers // nothing to inject: no carrier to allocate
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return headers
	}
	out := make([]handler.Header, 0, len(headers)+len(carrier))
	for _, h := range headers {
		if _, replaced := carrier[h.Key]; !replaced {
			out = append(out, h)
		}
	}
	for _, k := range []string{"traceparent", "tracestate"} {
		if v, ok := carrier[k]; ok {
			out = append(out, handler.Header{Key: k, Value: []byte(v)})
		}
	}
	return out
}

// AddValue encodes v with codec and writes it to the default outbox table
// inside tx under key. See Outbox.AddValue.
func AddValue(ctx context.Context, tx pgx.Tx, topic string, key []byte, v any, codec handler.Codec, headers ...handler.Header) error {
	return newOutbox().AddValue(ctx, tx, topic, key, v, codec, headers...)
}

// AddValue encodes v with codec and adds it to o like Add, with key and
// headers. It fails with the codec's error (wrapped, naming the topic)
// without touching tx when v cannot be encoded, and like Add otherwise.
func (o *Outbox) AddValue(ctx context.Context, tx pgx.Tx, topic string, key []byte, v any, codec handler.Codec, headers ...handler.Header) error {
	b, fresh, err := encode(o.json, v, codec, topic)
	if err != nil {
		return err
	}
	return o.add(ctx, tx, Message{Topic: topic, Key: key, Value: b, Headers: headers}, true, fresh)
}

// encode encodes v with codec for topic, reporting whether the encoding is
// a fresh slice that a queued row may keep (handler.JSON's is; another
// codec's may be a buffer it reuses, and is copied). A flat struct for
// handler.JSON is encoded by es, when there is one: json.Marshal's bytes,
// in about half the time. It fails with the codec's error, wrapped.
func encode(es *jsonflat.Encoders, v any, codec handler.Codec, topic string) (b []byte, fresh bool, err error) {
	_, isJSON := codec.(handler.JSON)
	if isJSON && es != nil {
		if b, ok := es.Marshal(v); ok {
			return b, true, nil
		}
	}
	if b, err = codec.Marshal(v); err != nil {
		return nil, false, fmt.Errorf("outbox: encoding a %T for %s with %s: %w", v, topic, codec.Name(), err)
	}
	return b, isJSON, nil
}

// AddJSON encodes v as JSON (handler.JSON) and writes it to the default
// outbox table inside tx under key, with headers. See Outbox.AddJSON.
func AddJSON(ctx context.Context, tx pgx.Tx, topic string, key []byte, v any, headers ...handler.Header) error {
	return newOutbox().AddJSON(ctx, tx, topic, key, v, headers...)
}

// AddJSON encodes v as JSON (handler.JSON) and adds it to o like Add, with
// key and headers. It fails like AddValue.
func (o *Outbox) AddJSON(ctx context.Context, tx pgx.Tx, topic string, key []byte, v any, headers ...handler.Header) error {
	return o.AddValue(ctx, tx, topic, key, v, handler.JSON{}, headers...)
}

// Backlog reports the default outbox table's backlog. See Outbox.Backlog.
func Backlog(ctx context.Context, q Querier) (count int64, oldest time.Duration, err error) {
	return newOutbox().Backlog(ctx, q)
}

// Backlog reports how many committed rows of o await publication by the
// relay and the age of the oldest (0 when there are none), by the
// database's clock. Parked rows, and the rows of their (topic, key) held
// behind them, are not in it: they wait for `exactly outbox retry|drop`
// (see Parked and ParkedCount), so a parked row neither keeps the backlog
// from draining nor ages it for ever. It fails with the wrapped database
// error.
func (o *Outbox) Backlog(ctx context.Context, q Querier) (count int64, oldest time.Duration, err error) {
	var micros int64
	if err := q.QueryRow(ctx, o.sql().backlogSQL).Scan(&count, &micros); err != nil {
		return 0, 0, fmt.Errorf("outbox: reading backlog of %s: %w", o.quoted, err)
	}
	return count, time.Duration(micros) * time.Microsecond, nil
}
