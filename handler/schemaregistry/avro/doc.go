// Package avro is the codec of Avro payloads in the Confluent Schema
// Registry wire format, on github.com/hamba/avro/v2. The codec holds the
// handler's own schema; each record's writer schema, read from the
// registry by its id, is resolved against it (Avro's schema resolution:
// fields the writer added are skipped, fields it lacks take their
// defaults), once per schema id. Bound to a topic ([Codec.ForTopic]), it
// encodes for the outbox with its schema, registered under the topic's
// subject. Failures are those of package schemaregistry.
package avro
