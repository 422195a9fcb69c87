// Package protobuf is the codec of Protobuf payloads in the Confluent
// Schema Registry wire format, on google.golang.org/protobuf. A handler
// declares its payload as a generated message pointer
// (handler.New[*orderpb.OrderPaid](…, handler.WithCodec(protobuf.New(reg))));
// the codec reads the record's schema id and message indexes, checks that
// the message at those indexes is the handler's type, and unmarshals the
// body. Bound to a topic ([Codec.ForTopic]), it encodes for the outbox,
// registering the message's file under the topic's subject. Failures are
// those of package schemaregistry: a schemaregistry.SchemaError for a
// record at fault (dead-lettered), a handler.UnavailableError for a
// registry that did not answer (an outage).
package protobuf
