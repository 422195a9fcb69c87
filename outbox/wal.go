package outbox

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/deferred"
	"github.com/exactly-go/exactly/internal/runtime/jsonflat"
	"github.com/exactly-go/exactly/internal/runtime/pgarray"
)

// DefaultWALPrefix is the logical decoding message prefix WALOutbox writes
// and WALRelay reads when none is configured.
const DefaultWALPrefix = "exactly-outbox"

// walVersion is the first byte of every payload WALOutbox writes.
const walVersion = 1

// ErrBadWALPayload is wrapped in the error that ends a WAL relay's session
// (logged at error level; Run retries, and stalls there) for a logical
// decoding message under its prefix that it cannot decode: one not written
// by a WALOutbox of this payload version.
var ErrBadWALPayload = errors.New("outbox: undecodable WAL outbox payload")

// WALOutbox writes messages into the transaction's WAL with
// pg_logical_emit_message instead of into a table; a WALRelay streams them
// to Kafka through logical replication, in commit order. Nothing is
// inserted, deleted or vacuumed, and no per-key lock is taken: the WAL's
// commit order is the publication order. It needs wal_level=logical and a
// WALRelay reading its prefix (see docs/scaling.md for the costs).
//
// Experimental: the WAL relay cannot park a record that the brokers refuse
// for ever (there is no row to mark); see WALRelay.Run.
//
// Build it with NewWAL; it is immutable and safe for concurrent use.
type WALOutbox struct {
	prefix    string
	maxRecord int
	json      *jsonflat.Encoders // AddJSON's flat structs (see encode)
}

// WALOption configures a WALOutbox.
type WALOption func(*WALOutbox)

// WithWALPrefix sets the logical decoding message prefix; "" keeps
// DefaultWALPrefix. Writers and the relay must agree on it.
func WithWALPrefix(prefix string) WALOption {
	return func(w *WALOutbox) {
		if prefix != "" {
			w.prefix = prefix
		}
	}
}

// WithWALMaxRecordBytes sets the largest record Add accepts, as
// WithMaxRecordBytes does for a table outbox; n <= 0 keeps
// DefaultMaxRecordBytes.
func WithWALMaxRecordBytes(n int) WALOption {
	return func(w *WALOutbox) {
		if n > 0 {
			w.maxRecord = n
		}
	}
}

// NewWAL returns a WALOutbox configured by opts. It never fails.
func NewWAL(opts ...WALOption) *WALOutbox {
	w := &WALOutbox{prefix: DefaultWALPrefix, maxRecord: DefaultMaxRecordBytes, json: &jsonflat.Encoders{}}
	for _, opt := range opts {
		opt(w)
	}
	return w
}

// Prefix returns the logical decoding message prefix w writes.
func (w *WALOutbox) Prefix() string { return w.prefix }

// ErrWALNotReady is returned (wrapped) by WALOutbox.Check when messages
// written now would never be relayed.
var ErrWALNotReady = errors.New("outbox: WAL outbox not ready")

// Check reports whether messages w writes through q's database would reach
// a WAL relay reading slot ("" means DefaultWALSlot): pg_logical_emit_message
// succeeds whatever the server's wal_level, and a slot sees only what was
// written after its creation, so a writer that starts before either is in
// place loses its messages silently. Call it at a writer's start. It fails
// with an error wrapping ErrWALNotReady naming the missing piece (wal_level
// below logical, or no logical slot of that name in this database), and with
// the wrapped database error when it cannot ask.
func (w *WALOutbox) Check(ctx context.Context, q Querier, slot string) error {
	if slot == "" {
		slot = DefaultWALSlot
	}
	var level string
	var slotHere bool
	err := q.QueryRow(ctx, `select current_setting('wal_level'),
	exists (select from pg_replication_slots where slot_name = $1 and slot_type = 'logical' and database = current_database())`, slot).Scan(&level, &slotHere)
	if err != nil {
		return fmt.Errorf("outbox: checking the WAL outbox's setup: %w", err)
	}
	if level != "logical" {
		return fmt.Errorf("%w: wal_level is %s, not logical (set it in postgresql.conf and restart)", ErrWALNotReady, level)
	}
	if !slotHere {
		return fmt.Errorf("%w: no logical replication slot %q in this database: run the WAL relay (or WALRelay.Setup) before the writers", ErrWALNotReady, slot)
	}
	return nil
}

const walEmitSQL = `select pg_logical_emit_message(true, $1, $2::bytea)`

// unnest with ordinality yields the payloads in order, and the function
// scan evaluates emit in that order.
const walFlushSQL = `select count(pg_logical_emit_message(true, $1, m)) from unnest($2::bytea[]) with ordinality as u(m, ord)`

// Add writes msg into tx's WAL as a transactional logical decoding message
// under w's prefix: it is decoded, and so published, only if tx commits,
// after every transaction that committed before it; if tx rolls back, the
// message is never decoded, so never published. The message id (msg.ID,
// or a new random UUID) is inside the payload, so a republished record
// carries the same message-id. Inside an exactly consumer's transaction the
// message is queued and emitted with the batch's others just before COMMIT.
//
// Add fails like Outbox.Add: with a *MessageError (wrapping
// ErrInvalidMessage) without touching tx for an illegal topic, a record over
// the limit or a bad header name, and with the wrapped database error
// otherwise (for instance wal_level below logical).
func (w *WALOutbox) Add(ctx context.Context, tx pgx.Tx, msg Message) error {
	if err := ValidateTopic(msg.Topic); err != nil {
		return err
	}
	actx, span, _ := addSpan(ctx, msg.Topic)
	defer span.End()
	headers := withTraceContext(actx, msg.Headers)
	if err := checkSize(msg, headers, w.maxRecord); err != nil {
		return err
	}
	payload, err := encodeWAL(msg, headers)
	if err != nil {
		return err
	}
	if buf := deferred.For(ctx, tx); buf != nil {
		q := buf.Queue("wal:"+w.prefix, func() deferred.Flusher { return &walQueue{w: w} }).(*walQueue)
		q.payloads = append(q.payloads, payload)
		return nil
	}
	if _, err := tx.Exec(ctx, walEmitSQL, w.prefix, payload); err != nil {
		return fmt.Errorf("outbox: emitting a WAL message to %s: %w", msg.Topic, err)
	}
	return nil
}

// AddValue encodes v with codec and adds it like Add, failing like
// Outbox.AddValue.
func (w *WALOutbox) AddValue(ctx context.Context, tx pgx.Tx, topic string, key []byte, v any, codec handler.Codec, headers ...handler.Header) error {
	b, _, err := encode(w.json, v, codec, topic)
	if err != nil {
		return err
	}
	return w.Add(ctx, tx, Message{Topic: topic, Key: key, Value: b, Headers: headers})
}

// AddJSON encodes v as JSON (handler.JSON) and adds it like Add, failing
// like AddValue.
func (w *WALOutbox) AddJSON(ctx context.Context, tx pgx.Tx, topic string, key []byte, v any, headers ...handler.Header) error {
	return w.AddValue(ctx, tx, topic, key, v, handler.JSON{}, headers...)
}

// walQueue holds one consumer transaction's WAL messages, emitted at once
// before COMMIT.
type walQueue struct {
	w        *WALOutbox
	payloads [][]byte
}

// Flush emits the queued messages, in order, in one statement.
func (q *walQueue) Flush(ctx context.Context, tx pgx.Tx) error {
	if len(q.payloads) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, walFlushSQL, q.w.prefix, pgarray.Bytea(q.payloads)); err != nil {
		return fmt.Errorf("outbox: emitting %d WAL messages: %w", len(q.payloads), err)
	}
	return nil
}

// walMessage is a decoded payload.
type walMessage struct {
	id, topic  string
	key, value []byte
	headers    []handler.Header
}

// encodeWAL encodes msg: the version byte, then the message id, topic,
// key, value (each length-prefixed, a nil key or value as length 0 and a
// present one as length+1) and the headers (count, then name and value).
// A message-id among headers is dropped (only Message.ID chooses the id).
// It fails for a header name that is not valid UTF-8 or holds NUL.
func encodeWAL(msg Message, headers []handler.Header) ([]byte, error) {
	id := msg.ID
	if id == "" {
		id = newUUID()
	}
	b := make([]byte, 0, 64+len(msg.Topic)+len(msg.Key)+len(msg.Value))
	b = append(b, walVersion)
	b = appendBytes(b, []byte(id))
	b = appendBytes(b, []byte(msg.Topic))
	b = appendOptional(b, msg.Key)
	b = appendOptional(b, msg.Value)
	kept := make([]handler.Header, 0, len(headers))
	for _, h := range headers {
		if strings.ContainsRune(h.Key, 0) || !utf8.ValidString(h.Key) {
			return nil, &MessageError{Topic: msg.Topic, Reason: fmt.Sprintf("header name %q is not valid UTF-8 without NUL", h.Key)}
		}
		if h.Key != HeaderMessageID {
			kept = append(kept, h)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(kept)))
	for _, h := range kept {
		b = appendBytes(b, []byte(h.Key))
		b = appendBytes(b, h.Value)
	}
	return b, nil
}

func appendBytes(b, p []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(p))), p...)
}

func appendOptional(b, p []byte) []byte {
	if p == nil {
		return binary.AppendUvarint(b, 0)
	}
	return append(binary.AppendUvarint(b, uint64(len(p))+1), p...)
}

// decodeWAL decodes a payload written by encodeWAL. It fails, wrapping
// ErrBadWALPayload, on an unknown version or a truncated payload.
func decodeWAL(p []byte) (walMessage, error) {
	var m walMessage
	if len(p) == 0 || p[0] != walVersion {
		return m, fmt.Errorf("%w: unknown version (payload of %d bytes)", ErrBadWALPayload, len(p))
	}
	d := walDecoder{p: p[1:]}
	m.id = string(d.bytes(false))
	m.topic = string(d.bytes(false))
	m.key = d.bytes(true)
	m.value = d.bytes(true)
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.p)) {
		d.err = errors.New("header count over the payload's size")
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		k := string(d.bytes(false))
		v := d.bytes(false)
		m.headers = append(m.headers, handler.Header{Key: k, Value: v})
	}
	if d.err == nil && len(d.p) != 0 {
		d.err = fmt.Errorf("%d trailing bytes", len(d.p))
	}
	if d.err != nil {
		return walMessage{}, fmt.Errorf("%w: %w", ErrBadWALPayload, d.err)
	}
	return m, nil
}

// walDecoder reads length-prefixed fields, keeping the first error.
type walDecoder struct {
	p   []byte
	err error
}

func (d *walDecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.p)
	if n <= 0 {
		d.err = errors.New("truncated length")
		return 0
	}
	d.p = d.p[n:]
	return v
}

// bytes reads one field; optional fields encode nil as 0 and a length n
// as n+1.
func (d *walDecoder) bytes(optional bool) []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if optional {
		if n == 0 {
			return nil
		}
		n--
	}
	if n > uint64(len(d.p)) {
		d.err = fmt.Errorf("field of %d bytes, %d left", n, len(d.p))
		return nil
	}
	out := d.p[:n:n]
	d.p = d.p[n:]
	if out == nil {
		out = []byte{}
	}
	return out
}

// newUUID returns a random (version 4) UUID in its text form.
func newUUID() string {
	var u [16]byte
	_, _ = rand.Read(u[:]) // crypto/rand.Read never fails
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	const hexd = "0123456789abcdef"
	out := make([]byte, 0, 36)
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, hexd[c>>4], hexd[c&0x0f])
	}
	return string(out)
}
