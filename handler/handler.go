package handler

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime/debug"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/runtime/workunit"
)

// Func is a handler function. It runs inside the transaction that also holds
// the record's guard row: everything it writes through tx (and every
// outbox.Add it makes with tx) commits or rolls back together with that row.
//
// Returning an error rolls back the handler's writes; the record is retried
// with backoff and, after the configured attempts, sent to the dead-letter
// topic. Errors from the database that signal an outage (lost connection,
// serialization failure, deadlock) are retried until the database is back
// and never count as attempts. A panic is recovered and counts as an error.
// Wrap an error with [Permanent] to dead-letter the record at once.
//
// A handler that swallows a statement's error (a unique violation answered
// with "already exists, return nil") leaves tx aborted; returning nil then
// still fails the record ("handler returned nil but its transaction was
// aborted"). Use a savepoint (tx.Begin) or "on conflict do nothing"
// instead. A handler may run more than once per applied effect (its earlier
// run rolled back); each run gets its value decoded afresh and its own copy
// of msg.Record's key, value and headers, which it may change (decrypt the
// value in place, append a header): later runs decode, and the dead-letter
// topic receives, the record as it came from Kafka.
//
// The handler must not commit or roll back tx, and must not keep it after
// returning.
type Func[T any] func(ctx context.Context, tx pgx.Tx, msg Message[T]) error

// Handler is a typed handler: a name, a key source, a codec and a [Func]
// over payload type T. Build it with [New]; it is immutable and safe for
// concurrent use.
type Handler[T any] struct {
	core[T]
	fn Func[T]
}

// core is what every handler form shares: name, key source, options and
// the validation result.
type core[T any] struct {
	// unitHook gives the handler the runtime's PrepareUnit method (see
	// [Any]); its form's constructor sets it.
	unitHook
	name     string
	key      KeySource[T]
	opts     options
	lockKeys func(T) []string
	call     func(context.Context, Message[T]) error
	valid    error
	// json decodes first with the fast path when the codec is a JSON.
	json *fastJSON
	// spare holds prepared records the runtime released (Release), for
	// the next records.
	spare *sync.Pool
}

// Option configures a handler.
type Option func(*options)

type options struct {
	scope      string
	codec      Codec
	idempotent bool
	lockKeys   any // a func(T) []string, checked against T by newCore
	call       any // a func(context.Context, Message[T]) error (WithCall), checked likewise
}

// WithScope sets the namespace of the handler's keys in the guard table.
// The default is the handler's name. Two handlers with the same scope
// deduplicate each other, which is what you want when a handler is renamed
// or split, and not what you want otherwise. Rename a handler with
// WithScope(old name): consumer.Run refuses to start a member whose handler
// brings another scope than its group recorded for the topic.
func WithScope(scope string) Option { return func(o *options) { o.scope = scope } }

// WithCodec sets the codec that decodes record values; the default is [JSON].
func WithCodec(c Codec) Option { return func(o *options) { o.codec = c } }

// NaturallyIdempotent declares that the handler's effect is the same however
// many times it runs (set a value, upsert by natural key, delete if
// exists), so exactly skips the guard row for it and saves one write per
// record. A handler that appends, increments or sends anything is NOT
// naturally idempotent: one such step makes the whole handler need the
// guard. handlertest.AssertIdempotent checks the claim in tests.
func NaturallyIdempotent() Option { return func(o *options) { o.idempotent = true } }

// New builds a handler called name (stable: it is the default scope of its
// keys, and renaming it starts a fresh scope) whose keys come from key.
//
// New never fails; an invalid handler (empty name, nil fn, unset key
// source) reports the problem from [Handler.Validate], which the consumer
// calls at start-up.
func New[T any](name string, key KeySource[T], fn Func[T], opts ...Option) *Handler[T] {
	h := &Handler[T]{core: newCore(name, key, fn == nil, opts), fn: fn}
	h.unitHook = workunit.NewHook(h.prepareUnit, h.hasCall)
	return h
}

// newCore applies opts and validates the parts every form shares; nilFn
// reports that the handler's function is nil.
func newCore[T any](name string, key KeySource[T], nilFn bool, opts []Option) core[T] {
	c := core[T]{name: name, key: key, spare: &sync.Pool{}}
	c.opts.codec = JSON{}
	for _, o := range opts {
		o(&c.opts)
	}
	if c.opts.scope == "" {
		c.opts.scope = name
	}
	if j, ok := c.opts.codec.(JSON); ok {
		c.json = newFastJSON(j, reflect.TypeFor[T]())
	}
	var lockErr error
	switch lk := c.opts.lockKeys.(type) {
	case nil:
	case func(T) []string:
		c.lockKeys = lk
		if lk == nil {
			lockErr = errors.New("WithLockKeys was given a nil function")
		}
	default:
		var zero T
		lockErr = fmt.Errorf("WithLockKeys was given a %T, not a func(%T) []string", lk, zero)
	}
	callErr := c.setCall()
	switch {
	case name == "":
		c.valid = errors.New("handler has an empty name")
	case nilFn:
		c.valid = fmt.Errorf("handler %q has a nil function", name)
	case c.opts.codec == nil:
		c.valid = fmt.Errorf("handler %q has a nil codec", name)
	case lockErr != nil:
		c.valid = fmt.Errorf("handler %q: %w", name, lockErr)
	case callErr != nil:
		c.valid = fmt.Errorf("handler %q: %w", name, callErr)
	default:
		if err := key.validate(); err != nil {
			c.valid = fmt.Errorf("handler %q: %w", name, err)
		}
	}
	return c
}

// Name returns the handler's name.
func (h *core[T]) Name() string { return h.name }

// Scope returns the namespace of the handler's keys in the guard table.
func (h *core[T]) Scope() string { return h.opts.scope }

// Guarded reports whether the handler claims a guard row per record (false
// only for [NaturallyIdempotent] handlers).
func (h *core[T]) Guarded() bool { return !h.opts.idempotent }

// KeySource describes where the handler's keys come from.
func (h *core[T]) KeySource() string { return h.key.String() }

// Validate reports why the handler cannot run, or nil.
func (h *core[T]) Validate() error { return h.valid }

// prepareUnit decodes rec and derives its key, for the runtime (see
// [Any]). It fails with a [*DecodeError] or a [*KeyError], both permanent.
// The prepared record runs the handler with its panics recovered as a
// [*PanicError].
func (h *Handler[T]) prepareUnit(rec Record) (workunit.Prepared, error) {
	p, m, err := h.prepare(rec)
	if err != nil {
		return workunit.Prepared{}, err
	}
	m.fn = h.fn
	p.Run = m
	return p, nil
}

// Run runs the record's handler fn inside tx (workunit.Runner); a panic in
// it is recovered into a *PanicError.
func (m *prepared[T]) Run(ctx context.Context, tx pgx.Tx, attempt int) (err error) {
	defer recoverPanic(&err)
	msg, err := m.message(attempt)
	if err != nil {
		return err
	}
	return m.fn(ctx, tx, msg)
}

// recoverPanic turns a panic into a *PanicError in *err; defer it.
func recoverPanic(err *error) {
	if r := recover(); r != nil {
		*err = &PanicError{Value: r, Stack: debug.Stack()}
	}
}

// prepared is a decoded and keyed record of a handler with payload T.
type prepared[T any] struct {
	h   *core[T]
	rec Record // as it came: never handed to the handler
	key string
	// first is the first run's copy of rec ([own]) and v the value decoded
	// from it, until that run takes them.
	first   Record
	v       T
	decoded bool // v and first are fresh: the first run gets them
	called  bool // its WithCall call succeeded
	// fn is the tx-form handler function that Run calls, pipe the
	// pipelined one that Pipe calls (each nil for the other forms).
	fn   Func[T]
	pipe PipeFunc[T]
	// set is a set-based handler's membership of the record
	// (workunit.Prepared.Set points to it).
	set workunit.SetMember
}

// newPrepared returns a prepared record of h whose first is a copy of rec
// (own): one the runtime released (Release), or a new one. The copy's
// bytes are always new: the handler may keep them, so they are never
// reused.
func (h *core[T]) newPrepared(rec Record) *prepared[T] {
	var m *prepared[T]
	if h.spare != nil {
		m, _ = h.spare.Get().(*prepared[T])
	}
	if m == nil {
		m = &prepared[T]{}
	}
	m.first = own(rec)
	return m
}

// Release hands m back to its handler for a later record, cleared. The
// runtime calls it once the record finished and nothing refers to m any
// more (see workunit.Prepared.Release); the bytes and values its runs were
// given are not m's and stay as they are.
func (m *prepared[T]) Release() {
	h := m.h
	*m = prepared[T]{}
	if h != nil && h.spare != nil {
		h.spare.Put(m)
	}
}

// message returns the record's message for attempt. The first run gets the
// value decoded by prepare; every later run (an attempt, or a replay of the
// batch after a later record failed) decodes afresh, so a handler that
// mutated its value, or a slice or map in it, never sees its own change.
// Each run gets its own copy of the record's bytes, and its value is
// decoded from that copy: a handler that mutates msg.Record (or a codec
// whose values alias their input) cannot change what later runs decode or
// what the runtime dead-letters.
func (m *prepared[T]) message(attempt int) (Message[T], error) {
	msg := Message[T]{Value: m.v, Key: m.key, Scope: m.h.opts.scope, Record: m.first, Attempt: attempt}
	if !m.decoded {
		msg.Record = own(m.rec)
		var fresh T // not msg.Value: decoding into it would merge maps
		if err := m.h.decode(msg.Record.Value, &fresh); err != nil {
			return Message[T]{}, m.h.decodeError(err)
		}
		msg.Value = fresh
	}
	m.decoded, m.first = false, Record{}
	var zero T
	m.v = zero // the run owns it; let it go with the run
	return msg, nil
}

// prepare decodes rec and derives its key and lock keys. It fails with a
// [*DecodeError] or a [*KeyError], both permanent, or with the codec's
// [*UnavailableError] (an outage).
func (h *core[T]) prepare(rec Record) (workunit.Prepared, *prepared[T], error) {
	if h.valid != nil {
		return workunit.Prepared{}, nil, h.valid
	}
	if len(rec.Value) == 0 {
		return workunit.Prepared{}, nil, &DecodeError{Codec: h.opts.codec.Name(), Err: errors.New("empty value (tombstone)")}
	}
	// The value is decoded in place: one allocation, not a value that
	// escapes to the codec and a copy of it.
	m := h.newPrepared(rec)
	m.h, m.rec, m.decoded = h, rec, true // m.first is the first run's copy: v may alias it
	if err := h.decode(m.first.Value, &m.v); err != nil {
		return workunit.Prepared{}, nil, h.decodeError(err)
	}
	key, err := h.deriveKey(&m.first, m.v)
	if err != nil {
		return workunit.Prepared{}, nil, err
	}
	m.key = key
	p := workunit.Prepared{Key: key, Scope: h.opts.scope, Handler: h.name, Unguarded: h.opts.idempotent, Release: m}
	if h.lockKeys != nil {
		if p.LockKeys, err = h.deriveLockKeys(m.v); err != nil {
			return workunit.Prepared{}, nil, err
		}
	}
	if h.call != nil {
		p.Call, p.Called = m.preCall, m.preCalled
	}
	return p, m, nil
}

// decode runs the codec, turning a panic into an error: a record that makes
// a codec panic is as undecodable as one it rejects.
func (h *core[T]) decode(data []byte, v *T) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("codec panicked: %v", r)
		}
	}()
	if h.json != nil && h.json.decode(data, v) {
		return nil
	}
	if h.json != nil {
		var zero T
		*v = zero // what the fast path left
	}
	return h.opts.codec.Unmarshal(data, v)
}

// decodeError is the error of a record the codec could not decode: a
// [*DecodeError] (permanent), or the codec's error as it is when it is an
// [*UnavailableError] (an outage, retried).
func (h *core[T]) decodeError(err error) error {
	if IsUnavailable(err) {
		return err
	}
	return &DecodeError{Codec: h.opts.codec.Name(), Err: err}
}

// deriveKey runs the key source, turning a panic in a payload key function
// (a nil field dereferenced, say) into a *KeyError.
func (h *core[T]) deriveKey(rec *Record, v T) (key string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &KeyError{Source: h.key.String(), Reason: fmt.Sprintf("the key function panicked: %v", r)}
		}
	}()
	return h.key.derive(rec, v)
}

// Any is a handler of any payload type, as consumer.Handle and [Route]
// take it: a [*Handler], [*Pipelined], [*Set] or [*Router]. Only this
// package implements it (its sealed method is unexported), so its method
// set can grow.
type Any interface {
	// Name returns the handler's name.
	Name() string
	// Scope returns the namespace of its keys in the guard table.
	Scope() string
	// Guarded reports whether it claims a guard row per record.
	Guarded() bool
	// KeySource describes where its keys come from.
	KeySource() string
	// Validate reports why it cannot run, or nil.
	Validate() error
	// Key decodes rec and derives its key as the consumer does, without
	// running anything: tests call it to check decoding and keys. It fails
	// with the error the consumer dead-letters rec with: a [*DecodeError],
	// a [*KeyError] or (a router's) a [*RouteError].
	Key(rec Record) (string, error)
	// unitPreparer is the runtime's entry point (it decodes and keys a
	// record into the executor's unit of work); unexported, so the
	// public documentation does not name the internal type.
	unitPreparer
	sealed()
}

// unitPreparer and unitHook are unexported aliases of the runtime's types:
// go doc documents neither them nor the method they carry.
type (
	unitPreparer = workunit.Preparer[Record]
	unitHook     = workunit.Hook[Record]
)

func (h *core[T]) sealed() {}

// Key decodes rec and derives its key as the consumer does, without
// running the handler; see [Any]. It fails with a [*DecodeError] or a
// [*KeyError], both permanent (the record would be dead-lettered).
func (h *core[T]) Key(rec Record) (string, error) {
	p, _, err := h.prepare(rec)
	return p.Key, err
}

// Encode encodes v with the handler's codec, as a producer of its records
// would. It fails when the codec cannot encode v.
func (h *core[T]) Encode(v T) ([]byte, error) {
	return h.opts.codec.Marshal(v)
}
