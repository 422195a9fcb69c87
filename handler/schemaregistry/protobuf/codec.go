package protobuf

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/schemaregistry"
)

// Codec decodes and encodes Protobuf messages in the Confluent wire
// format. The payload type of a handler that uses it is a generated
// message pointer (handler.New[*orderpb.OrderPaid]). Build it with [New];
// it is safe for concurrent use.
type Codec struct {
	reg      *schemaregistry.Registry
	strategy schemaregistry.SubjectNameStrategy
	topic    string // ForTopic's
	// ids holds the schema id of each subject and message type encoded
	// (a subjectType), shared with the codecs ForTopic returns.
	ids *sync.Map
}

// subjectType is a key of Codec.ids.
type subjectType struct {
	subject string
	name    protoreflect.FullName
}

// Option configures a [Codec].
type Option func(*Codec)

// WithSubjectNameStrategy sets how the encoder names the subject of a
// topic's values (default schemaregistry.TopicNameStrategy).
func WithSubjectNameStrategy(s schemaregistry.SubjectNameStrategy) Option {
	return func(c *Codec) {
		if s != nil {
			c.strategy = s
		}
	}
}

// New returns a Codec reading and registering schemas through reg.
func New(reg *schemaregistry.Registry, opts ...Option) *Codec {
	c := &Codec{reg: reg, strategy: schemaregistry.TopicNameStrategy, ids: &sync.Map{}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Name returns "protobuf-sr".
func (*Codec) Name() string { return "protobuf-sr" }

// namesKey is the key of a schema's parsed message names (Schema.Parsed).
type namesKey struct{}

// Unmarshal decodes data, a Protobuf message in the Confluent wire format,
// into v, a pointer to a generated message pointer (or a message). The
// writer's schema must be a Protobuf schema whose message at the record's
// indexes has the full name of v's type; Protobuf's own rules do the rest
// (a field the reader does not know is kept as unknown, one the writer
// did not send reads as its zero value), so a producer may add fields and a
// handler may read a newer or older version of its message. It fails with
// a *schemaregistry.SchemaError naming the schema id and subject for a
// record that cannot be decoded, and with an *handler.UnavailableError when
// the registry did not answer.
func (c *Codec) Unmarshal(data []byte, v any) error {
	m, err := message(v)
	if err != nil {
		return err
	}
	f, s, err := c.reg.Decode(context.Background(), data)
	if err != nil {
		return err
	}
	fail := func(err error) error { return &schemaregistry.SchemaError{ID: s.ID, Subject: s.Subject(), Err: err} }
	if s.Type != sr.TypeProtobuf {
		return fail(fmt.Errorf("the schema is %s, not PROTOBUF", s.Type))
	}
	var idx []int
	key, body := "0", f.Body[min(1, len(f.Body)):]
	if len(f.Body) == 0 || f.Body[0] != 0 { // not the common [0], a zero-length list
		var err error
		if idx, body, err = schemaregistry.SplitIndex(f); err != nil {
			return fail(err)
		}
		key = indexKey(idx)
	}
	names, err := s.Parsed(namesKey{}, func(s *schemaregistry.Schema) (any, error) { return messageNames(s.Schema.Schema) })
	if err != nil {
		return fail(err)
	}
	want := m.ProtoReflect().Descriptor().FullName()
	got, ok := names.(map[string]protoreflect.FullName)[key]
	switch {
	case !ok:
		return fail(fmt.Errorf("the schema has no message at index [%s]", strings.ReplaceAll(key, ".", " ")))
	case got != want:
		return fail(fmt.Errorf("the record holds a %s (index [%s]), the handler reads a %s", got, strings.ReplaceAll(key, ".", " "), want))
	}
	if err := proto.Unmarshal(body, m); err != nil {
		return fail(fmt.Errorf("decoding the body as %s: %w", want, err))
	}
	return nil
}

// message returns the message v points to, allocating it when v points
// to a nil message pointer.
func message(v any) (proto.Message, error) {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return nil, fmt.Errorf("protobuf-sr decodes into a pointer to a message pointer, not a %T", v)
	}
	if e := rv.Elem(); e.Kind() == reflect.Pointer && e.Type().Implements(protoMessage) {
		if e.IsNil() {
			e.Set(reflect.New(e.Type().Elem()))
			return e.Interface().(proto.Message), nil
		}
		m := e.Interface().(proto.Message)
		proto.Reset(m)
		return m, nil
	}
	if m, ok := v.(proto.Message); ok {
		proto.Reset(m)
		return m, nil
	}
	return nil, fmt.Errorf("protobuf-sr decodes Protobuf messages, not a %T", v)
}

var protoMessage = reflect.TypeFor[proto.Message]()

// Marshal fails: the subject, and so the schema id, depends on the topic.
// Encode through [Codec.ForTopic]'s codec, or [Codec.Encode].
func (c *Codec) Marshal(v any) ([]byte, error) {
	if c.topic == "" {
		return nil, errors.New("protobuf-sr needs the topic to choose the subject: use Codec.ForTopic(topic) or Codec.Encode")
	}
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("protobuf-sr encodes Protobuf messages, not a %T", v)
	}
	return c.Encode(context.Background(), c.topic, m)
}

// ForTopic returns a codec that encodes for topic (its Marshal works),
// for outbox.AddValue: outbox.AddValue(ctx, tx, topic, key, ev,
// codec.ForTopic(topic)).
func (c *Codec) ForTopic(topic string) *Codec {
	cp := *c
	cp.topic = topic
	return &cp
}

// Encode encodes m for topic in the Confluent wire format: it registers m's
// schema (the .proto text of its file, printed from its descriptor by
// [SchemaText]) under the subject the codec's strategy names (or looks it
// up, with schemaregistry.WithLookupOnly), each file it imports first
// (but Protobuf's well-known types) under the file's path as a schema
// reference, as Confluent's serializers do; then it frames m's bytes with
// the schema id and m's message indexes. The id is kept: a subject and
// message type cost the registry once. It fails with a
// *schemaregistry.SchemaError when the registry refuses a schema (not
// compatible with the subject's), and with an *handler.UnavailableError
// when the registry did not answer: a handler returning that error is
// retried as in an outage.
func (c *Codec) Encode(ctx context.Context, topic string, m proto.Message) ([]byte, error) {
	d := m.ProtoReflect().Descriptor()
	subject := c.strategy(topic, string(d.FullName()))
	k := subjectType{subject, d.FullName()}
	var id int
	if v, ok := c.ids.Load(k); ok {
		id = v.(int)
	} else {
		refs, err := c.references(ctx, d.ParentFile())
		if err != nil {
			return nil, err
		}
		text, err := SchemaText(d.ParentFile())
		if err != nil {
			return nil, &schemaregistry.SchemaError{Subject: subject, Err: err}
		}
		if id, err = c.reg.ID(ctx, subject, sr.Schema{Schema: text, Type: sr.TypeProtobuf, References: refs}); err != nil {
			return nil, err
		}
		c.ids.Store(k, id)
	}
	body, err := proto.Marshal(m)
	if err != nil {
		return nil, &schemaregistry.SchemaError{ID: id, Subject: subject, Err: fmt.Errorf("encoding a %s: %w", d.FullName(), err)}
	}
	b := schemaregistry.AppendHeader(make([]byte, 0, 6+len(body)), id, Index(d))
	return append(b, body...), nil
}

// references registers the files fd imports (and theirs, first), but
// Protobuf's well-known types, each under its path, and returns the
// references to them.
func (c *Codec) references(ctx context.Context, fd protoreflect.FileDescriptor) ([]sr.SchemaReference, error) {
	var refs []sr.SchemaReference
	imps := fd.Imports()
	for i := range imps.Len() {
		imp := imps.Get(i).FileDescriptor
		if strings.HasPrefix(imp.Path(), "google/protobuf/") {
			continue
		}
		sub, err := c.references(ctx, imp)
		if err != nil {
			return nil, err
		}
		text, err := SchemaText(imp)
		if err != nil {
			return nil, &schemaregistry.SchemaError{Subject: imp.Path(), Err: err}
		}
		ss, err := c.reg.Register(ctx, imp.Path(), sr.Schema{Schema: text, Type: sr.TypeProtobuf, References: sub})
		if err != nil {
			return nil, err
		}
		refs = append(refs, sr.SchemaReference{Name: imp.Path(), Subject: imp.Path(), Version: ss.Version})
	}
	return refs, nil
}

// Index returns the message indexes of d: its path among the messages of
// its file ([0] for the file's first top-level message, [1, 0] for the
// first message nested in the second).
func Index(d protoreflect.MessageDescriptor) []int {
	var idx []int
	for p := protoreflect.Descriptor(d); ; {
		idx = append(idx, p.Index())
		p = p.Parent()
		if _, ok := p.(protoreflect.MessageDescriptor); !ok {
			break
		}
	}
	for i, j := 0, len(idx)-1; i < j; i, j = i+1, j-1 {
		idx[i], idx[j] = idx[j], idx[i]
	}
	return idx
}

var _ handler.Codec = (*Codec)(nil)
