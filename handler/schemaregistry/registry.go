package schemaregistry

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/exactly-go/exactly/handler"
)

// DefaultCacheSize is how many schemas a [Registry] keeps by id unless
// [WithCacheSize] says otherwise.
const DefaultCacheSize = 1000

// DefaultTimeout bounds each request to the registry unless [WithTimeout]
// says otherwise.
const DefaultTimeout = 10 * time.Second

// Service is the service name an [*handler.UnavailableError] of this
// package carries.
const Service = "schema registry"

// Registry reads schemas from a Confluent-compatible Schema Registry by id,
// keeping the most recently used ones (bounded, [WithCacheSize]), and
// registers or looks up the schemas of the messages the codecs encode. A
// running consumer asks the registry only for ids it has not seen. Build it
// with [New]; it is safe for concurrent use.
type Registry struct {
	cl      *sr.Client
	size    int
	timeout time.Duration
	lookup  bool

	mu   sync.Mutex
	byID map[int]*list.Element              // of *Schema
	lru  list.List                          // most recently used first
	ids  map[subjectSchema]sr.SubjectSchema // registered or looked up, for encoding
}

type subjectSchema struct {
	subject, schema string
	typ             sr.SchemaType
	refs            string // the references, as fmt prints them
}

// Option configures a [Registry].
type Option func(*Registry)

// WithCacheSize sets how many schemas the registry keeps by id (default
// [DefaultCacheSize]); the least recently used goes first. A value below 1
// keeps the default.
func WithCacheSize(n int) Option {
	return func(r *Registry) {
		if n > 0 {
			r.size = n
		}
	}
}

// WithTimeout bounds each request to the registry (default
// [DefaultTimeout]). A request that runs out of time is an outage: the
// record waits and is retried. A value below 1 keeps the default.
func WithTimeout(d time.Duration) Option {
	return func(r *Registry) {
		if d > 0 {
			r.timeout = d
		}
	}
}

// WithLookupOnly makes the encoders look the schema up under its subject
// instead of registering it (Confluent's auto.register.schemas=false): a
// schema nobody registered fails to encode with a [*SchemaError].
func WithLookupOnly() Option { return func(r *Registry) { r.lookup = true } }

// New returns a Registry reading through cl, a franz-go registry client
// (sr.NewClient(sr.URLs(...)), with its authentication options).
func New(cl *sr.Client, opts ...Option) *Registry {
	r := &Registry{cl: cl, size: DefaultCacheSize, timeout: DefaultTimeout, byID: map[int]*list.Element{}, ids: map[subjectSchema]sr.SubjectSchema{}}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Dial returns a Registry on a client of the registry at url ("http://host:8081").
// It fails when the client cannot be built from url.
func Dial(url string, opts ...Option) (*Registry, error) {
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		return nil, fmt.Errorf("schema registry client for %s: %w", url, err)
	}
	return New(cl, opts...), nil
}

// Schema is a schema read from the registry: its id, the subjects that
// hold it and its text. Codecs keep what they parse from it (Parsed).
type Schema struct {
	ID int
	// Subjects are the subjects under which the schema is registered, as
	// the registry lists them (empty when it lists none).
	Subjects []string
	sr.Schema

	mu     sync.Mutex
	parsed map[any]any
}

// Subject returns the schema's subjects joined with ",", or "unknown
// subject" when the registry listed none: what error messages name.
func (s *Schema) Subject() string {
	if len(s.Subjects) == 0 {
		return "unknown subject"
	}
	return strings.Join(s.Subjects, ",")
}

// Parsed returns what build made of s for key (a codec's own type),
// calling build the first time only: a codec parses a schema once for as
// long as the registry keeps it. An error is returned and not kept.
func (s *Schema) Parsed(key any, build func(*Schema) (any, error)) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.parsed[key]; ok {
		return v, nil
	}
	v, err := build(s)
	if err != nil {
		return nil, err
	}
	if s.parsed == nil {
		s.parsed = map[any]any{}
	}
	s.parsed[key] = v
	return v, nil
}

// SchemaError reports a record or message whose schema cannot be used: an
// id the registry does not know, a schema of another format, one that
// does not parse or is not compatible with the handler's type, a body that
// does not decode with it, or a schema the registry refuses to register.
// It is permanent: a handler's codec returns it and the consumer
// dead-letters the record with it as the reason (inside a
// [*handler.DecodeError]).
type SchemaError struct {
	// ID is the schema id (0 when none could be read).
	ID int
	// Subject names the schema's subject(s), or the subject an encoder
	// registered under.
	Subject string
	Err     error
}

// Error names the schema id, its subject and what was wrong.
func (e *SchemaError) Error() string {
	switch {
	case e.ID == 0 && e.Subject == "":
		return e.Err.Error()
	case e.ID == 0:
		return fmt.Sprintf("subject %s: %v", e.Subject, e.Err)
	}
	return fmt.Sprintf("schema id %d (subject %s): %v", e.ID, e.Subject, e.Err)
}

// Unwrap returns the cause.
func (e *SchemaError) Unwrap() error { return e.Err }

// ErrUnknownSchema is wrapped by the [*SchemaError] of an id the registry
// answered "not found" for.
var ErrUnknownSchema = errors.New("the registry has no schema with this id")

// Lookup returns the schema of id, from the cache or the registry. It
// fails with a [*SchemaError] wrapping [ErrUnknownSchema] when the
// registry does not know id (404, error code 40403), and with an [*handler.UnavailableError]
// when the registry does not answer in time, cannot be reached, or
// answers anything but a schema or "not found" (5xx, 429, and 401/403
// too: a credential is configuration, not the record's fault, and the
// records wait until it is fixed).
func (r *Registry) Lookup(ctx context.Context, id int) (*Schema, error) {
	r.mu.Lock()
	if el, ok := r.byID[id]; ok {
		r.lru.MoveToFront(el)
		r.mu.Unlock()
		return el.Value.(*Schema), nil
	}
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	s, err := r.cl.SchemaByID(ctx, id)
	if err != nil {
		if schemaNotFound(err) {
			return nil, &SchemaError{ID: id, Subject: "unknown subject", Err: ErrUnknownSchema}
		}
		return nil, unavailable(fmt.Sprintf("reading schema id %d", id), err)
	}
	subjects, err := r.cl.SubjectsByID(ctx, id)
	if err != nil && !notFound(err) {
		return nil, unavailable(fmt.Sprintf("reading the subjects of schema id %d", id), err)
	}
	if s.Type == 0 && s.Schema != "" {
		s.Type = sr.TypeAvro // the registry leaves out the type of an Avro schema
	}
	sch := &Schema{ID: id, Subjects: subjects, Schema: s}
	r.mu.Lock()
	defer r.mu.Unlock()
	if el, ok := r.byID[id]; ok { // another lookup was first
		return el.Value.(*Schema), nil
	}
	r.byID[id] = r.lru.PushFront(sch)
	for r.lru.Len() > r.size {
		old := r.lru.Back()
		r.lru.Remove(old)
		delete(r.byID, old.Value.(*Schema).ID)
	}
	return sch, nil
}

// Cached returns how many schemas the registry keeps by id now.
func (r *Registry) Cached() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lru.Len()
}

// ID returns the id of s under subject: registered (or found, when it is
// registered already; with [WithLookupOnly], only found). It fails as
// [Registry.Register].
func (r *Registry) ID(ctx context.Context, subject string, s sr.Schema) (int, error) {
	ss, err := r.Register(ctx, subject, s)
	return ss.ID, err
}

// Register registers s (with its references) under subject, or finds it
// there when it is registered already (with [WithLookupOnly], only finds
// it), and returns its id and version. What it learnt is kept, so a running
// producer asks the registry once per subject and schema. It fails with a
// [*SchemaError] when the registry refuses the schema (incompatible with
// the subject's, invalid, a reference it does not hold) or, lookup only,
// does not hold it, and with an [*handler.UnavailableError] as
// [Registry.Lookup].
func (r *Registry) Register(ctx context.Context, subject string, s sr.Schema) (sr.SubjectSchema, error) {
	k := subjectSchema{subject: subject, schema: s.Schema, typ: s.Type}
	if len(s.References) > 0 {
		k.refs = fmt.Sprint(s.References)
	}
	r.mu.Lock()
	ss, ok := r.ids[k]
	r.mu.Unlock()
	if ok {
		return ss, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	var err error
	if !r.lookup {
		_, err = r.cl.RegisterSchema(ctx, subject, s, -1, -1)
	}
	if err == nil {
		ss, err = r.cl.LookupSchema(ctx, subject, s)
	}
	if err != nil {
		var re *sr.ResponseError
		// The registry refuses a schema with a 4xx and its own error code
		// (40401 no subject, 40403 no schema in lookup-only mode, 409
		// incompatible, 42201 invalid); a 404 without a code is a wrong URL
		// or a proxy's page, and, like 401, 403, 408 and 429, not the
		// schema's fault: an outage.
		if errors.As(err, &re) && re.StatusCode >= 400 && re.StatusCode < 500 && re.StatusCode != http.StatusTooManyRequests &&
			re.StatusCode != http.StatusUnauthorized && re.StatusCode != http.StatusForbidden && re.StatusCode != http.StatusRequestTimeout &&
			(re.StatusCode != http.StatusNotFound || re.ErrorCode != 0) {
			return sr.SubjectSchema{}, &SchemaError{Subject: subject, Err: fmt.Errorf("the registry refused the schema: %w", err)}
		}
		return sr.SubjectSchema{}, unavailable("registering a schema under subject "+subject, err)
	}
	r.mu.Lock()
	r.ids[k] = ss
	r.mu.Unlock()
	return ss, nil
}

// notFound reports whether the registry answered 404.
func notFound(err error) bool {
	var re *sr.ResponseError
	return errors.As(err, &re) && re.StatusCode == http.StatusNotFound
}

// schemaNotFound reports whether the registry answered that it has no
// such schema (404 with Confluent's error code 40403). A 404 without it
// (a wrong URL, a proxy's page) is not the record's fault.
func schemaNotFound(err error) bool {
	var re *sr.ResponseError
	return errors.As(err, &re) && re.StatusCode == http.StatusNotFound && re.ErrorCode == 40403
}

// unavailable wraps err, a failure of the registry, as an outage.
func unavailable(doing string, err error) error {
	return &handler.UnavailableError{Service: Service, Err: fmt.Errorf("%s: %w", doing, err)}
}
