package jsonschema

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/schemaregistry"
)

// Codec decodes and encodes JSON payloads in the Confluent wire format. It
// checks that the record's schema id is known to the registry and is a
// JSON Schema, then decodes the document with [handler.JSON] (its
// DisallowUnknownFields as configured); it does not validate the document
// against the JSON Schema: the payload type's shape is the contract the
// handler reads by. Build it with [New]; it is safe for concurrent use.
type Codec struct {
	reg      *schemaregistry.Registry
	schema   string
	json     handler.JSON
	strategy schemaregistry.SubjectNameStrategy
	title    string
	topic    string // ForTopic's
}

// Option configures a [Codec].
type Option func(*Codec)

// WithSubjectNameStrategy sets how the encoder names the subject of a
// topic's values (default schemaregistry.TopicNameStrategy); the record
// name the record strategies use is the schema's "title".
func WithSubjectNameStrategy(s schemaregistry.SubjectNameStrategy) Option {
	return func(c *Codec) {
		if s != nil {
			c.strategy = s
		}
	}
}

// DisallowUnknownFields makes a document carrying a field the payload type
// does not have fail to decode (and the record be dead-lettered).
func DisallowUnknownFields() Option {
	return func(c *Codec) { c.json.DisallowUnknownFields = true }
}

// New returns a Codec whose encoder registers schema (a JSON Schema
// document) and reads through reg. It fails when schema is not a JSON
// object.
func New(reg *schemaregistry.Registry, schema string, opts ...Option) (*Codec, error) {
	var doc map[string]any
	if err := json.Unmarshal([]byte(schema), &doc); err != nil {
		return nil, fmt.Errorf("the handler's json schema is not a JSON object: %w", err)
	}
	title, _ := doc["title"].(string)
	c := &Codec{reg: reg, schema: schema, strategy: schemaregistry.TopicNameStrategy, title: title}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Name returns "jsonschema-sr".
func (*Codec) Name() string { return "jsonschema-sr" }

// Unmarshal decodes data, a JSON document in the Confluent wire format, into
// v. It fails with a *schemaregistry.SchemaError naming the schema id and
// subject when the value is not in the wire format, the id is unknown or
// not a JSON Schema, or the document does not decode into v; and with an
// *handler.UnavailableError when the registry did not answer.
func (c *Codec) Unmarshal(data []byte, v any) error {
	f, s, err := c.reg.Decode(context.Background(), data)
	if err != nil {
		return err
	}
	if s.Type != sr.TypeJSON {
		return &schemaregistry.SchemaError{ID: s.ID, Subject: s.Subject(), Err: fmt.Errorf("the schema is %s, not JSON", s.Type)}
	}
	if err := c.json.Unmarshal(f.Body, v); err != nil {
		return &schemaregistry.SchemaError{ID: s.ID, Subject: s.Subject(), Err: err}
	}
	return nil
}

// Marshal fails: the subject, and so the schema id, depends on the topic.
// Encode through [Codec.ForTopic]'s codec, or [Codec.Encode].
func (c *Codec) Marshal(v any) ([]byte, error) {
	if c.topic == "" {
		return nil, errors.New("jsonschema-sr needs the topic to choose the subject: use Codec.ForTopic(topic) or Codec.Encode")
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

// Encode encodes v as JSON for topic in the Confluent wire format,
// registering the codec's schema under the subject its strategy names
// (once per subject). It fails with a *schemaregistry.SchemaError when the
// registry refuses the schema or v cannot be encoded, and with an
// *handler.UnavailableError when the registry did not answer.
func (c *Codec) Encode(ctx context.Context, topic string, v any) ([]byte, error) {
	subject := c.strategy(topic, c.title)
	id, err := c.reg.ID(ctx, subject, sr.Schema{Schema: c.schema, Type: sr.TypeJSON})
	if err != nil {
		return nil, err
	}
	body, err := c.json.Marshal(v)
	if err != nil {
		return nil, &schemaregistry.SchemaError{ID: id, Subject: subject, Err: err}
	}
	return append(schemaregistry.AppendHeader(make([]byte, 0, 5+len(body)), id, nil), body...), nil
}

var _ handler.Codec = (*Codec)(nil)
