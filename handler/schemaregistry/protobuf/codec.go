package protobuf

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"

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
	c := &Codec{reg: reg, strategy: schemaregistry.TopicNameStrategy}
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
// schema (the .proto text of its file, printed from its descriptor) under
// the subject the codec's strategy names (or looks it up, with
// schemaregistry.WithLookupOnly), once per subject, then frames m's bytes
// with the schema id and m's message indexes. It fails with a
// *schemaregistry.SchemaError when the registry refuses the schema (not
// compatible with the subject's) or m's file imports a file that is not one
// of Protobuf's well-known types (references are not registered), and with
// an *handler.UnavailableError when the registry did not answer: a handler
// returning that error is retried as in an outage.
func (c *Codec) Encode(ctx context.Context, topic string, m proto.Message) ([]byte, error) {
	d := m.ProtoReflect().Descriptor()
	subject := c.strategy(topic, string(d.FullName()))
	text, err := SchemaText(d.ParentFile())
	if err != nil {
		return nil, &schemaregistry.SchemaError{Subject: subject, Err: err}
	}
	id, err := c.reg.ID(ctx, subject, sr.Schema{Schema: text, Type: sr.TypeProtobuf})
	if err != nil {
		return nil, err
	}
	body, err := proto.Marshal(m)
	if err != nil {
		return nil, &schemaregistry.SchemaError{ID: id, Subject: subject, Err: fmt.Errorf("encoding a %s: %w", d.FullName(), err)}
	}
	b := schemaregistry.AppendHeader(make([]byte, 0, 6+len(body)), id, Index(d))
	return append(b, body...), nil
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
