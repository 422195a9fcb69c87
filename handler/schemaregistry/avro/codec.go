package avro

import (
	"context"
	"errors"
	"fmt"

	hamba "github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/schemaregistry"
)

// Codec decodes and encodes Avro records in the Confluent wire format, with
// github.com/hamba/avro/v2. It holds the handler's own schema (the reader's
// and, for encoding, the writer's); the payload type is a Go struct whose
// fields carry `avro:"name"` tags (or a map[string]any). Build it with
// [New]; it is safe for concurrent use.
type Codec struct {
	reg      *schemaregistry.Registry
	text     string
	schema   hamba.Schema
	strategy schemaregistry.SubjectNameStrategy
	topic    string // ForTopic's
	// key identifies the reader schema in a registry schema's Parsed
	// cache: one resolution per writer schema and reader.
	key *resolvedKey
}

type resolvedKey struct{ fingerprint [32]byte }

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

// New returns a Codec for the Avro schema schema (JSON text), reading and
// registering schemas through reg. It fails when schema does not parse.
func New(reg *schemaregistry.Registry, schema string, opts ...Option) (*Codec, error) {
	s, err := hamba.ParseWithCache(schema, "", &hamba.SchemaCache{})
	if err != nil {
		return nil, fmt.Errorf("parsing the handler's avro schema: %w", err)
	}
	c := &Codec{reg: reg, text: schema, schema: s, strategy: schemaregistry.TopicNameStrategy,
		key: &resolvedKey{fingerprint: s.Fingerprint()}}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Name returns "avro-sr".
func (*Codec) Name() string { return "avro-sr" }

// Schema returns the codec's schema.
func (c *Codec) Schema() hamba.Schema { return c.schema }

// Unmarshal decodes data, an Avro record in the Confluent wire format,
// into v with Avro's schema resolution: the writer's schema (read from the
// registry by the record's id) is resolved against the codec's, so a
// field the writer added is skipped and a field it lacks takes the
// reader's default. It fails with a *schemaregistry.SchemaError naming the
// schema id and subject when the value is not in the wire format, the id is
// unknown, the writer's schema is not Avro or not compatible with the
// codec's (a field without default missing, a type changed), or the body
// does not decode; and with an *handler.UnavailableError when the registry
// did not answer.
func (c *Codec) Unmarshal(data []byte, v any) error {
	f, s, err := c.reg.Decode(context.Background(), data)
	if err != nil {
		return err
	}
	fail := func(err error) error { return &schemaregistry.SchemaError{ID: s.ID, Subject: s.Subject(), Err: err} }
	if s.Type != sr.TypeAvro {
		return fail(fmt.Errorf("the schema is %s, not AVRO", s.Type))
	}
	resolved, err := s.Parsed(c.key, func(s *schemaregistry.Schema) (any, error) {
		writer, err := hamba.ParseWithCache(s.Schema.Schema, "", &hamba.SchemaCache{})
		if err != nil {
			return nil, fmt.Errorf("parsing the writer's avro schema: %w", err)
		}
		if writer.Fingerprint() == c.schema.Fingerprint() {
			return c.schema, nil
		}
		r, err := hamba.NewSchemaCompatibility().Resolve(c.schema, writer)
		if err != nil {
			return nil, fmt.Errorf("the writer's schema is not compatible with the handler's: %w", err)
		}
		return r, nil
	})
	if err != nil {
		return fail(err)
	}
	if err := hamba.Unmarshal(resolved.(hamba.Schema), f.Body, v); err != nil {
		return fail(fmt.Errorf("decoding the body: %w", err))
	}
	return nil
}

// Marshal fails: the subject, and so the schema id, depends on the topic.
// Encode through [Codec.ForTopic]'s codec, or [Codec.Encode].
func (c *Codec) Marshal(v any) ([]byte, error) {
	if c.topic == "" {
		return nil, errors.New("avro-sr needs the topic to choose the subject: use Codec.ForTopic(topic) or Codec.Encode")
	}
	return c.Encode(context.Background(), c.topic, v)
}

// ForTopic returns a codec that encodes for topic (its Marshal works),
// for outbox.AddValue.
func (c *Codec) ForTopic(topic string) *Codec {
	cp := *c
	cp.topic = topic
	return &cp
}

// Encode encodes v with the codec's schema for topic in the Confluent wire
// format: it registers the schema under the subject the codec's strategy
// names (its full name for the record strategies), or looks it up with
// schemaregistry.WithLookupOnly, once per subject, and frames the body with
// the id. It fails with a *schemaregistry.SchemaError when the registry
// refuses the schema or v does not fit it, and with an
// *handler.UnavailableError when the registry did not answer.
func (c *Codec) Encode(ctx context.Context, topic string, v any) ([]byte, error) {
	name := ""
	if n, ok := c.schema.(hamba.NamedSchema); ok {
		name = n.FullName()
	}
	subject := c.strategy(topic, name)
	id, err := c.reg.ID(ctx, subject, sr.Schema{Schema: c.text, Type: sr.TypeAvro})
	if err != nil {
		return nil, err
	}
	body, err := hamba.Marshal(c.schema, v)
	if err != nil {
		return nil, &schemaregistry.SchemaError{ID: id, Subject: subject, Err: fmt.Errorf("encoding a %T: %w", v, err)}
	}
	return append(schemaregistry.AppendHeader(make([]byte, 0, 5+len(body)), id, nil), body...), nil
}

var _ handler.Codec = (*Codec)(nil)
