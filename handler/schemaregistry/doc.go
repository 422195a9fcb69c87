// Package schemaregistry reads and writes record values in the Confluent
// Schema Registry wire format (a magic byte 0, a 4-byte schema id, for
// Protobuf the message indexes, then the body), for the codecs of its
// subpackages: [github.com/exactly-go/exactly/handler/schemaregistry/protobuf],
// [github.com/exactly-go/exactly/handler/schemaregistry/avro] and
// [github.com/exactly-go/exactly/handler/schemaregistry/jsonschema]. The
// registry client is franz-go's pkg/sr; [Registry] adds a bounded cache of
// schemas by id, so a running consumer asks the registry only for ids it
// has not seen, and sorts the registry's failures into the two kinds the
// consumer treats apart:
//
//   - the record's fault, a [*SchemaError] naming the schema id and subject:
//     a value that is not in the wire format (wrong magic byte, too short),
//     an id the registry does not know, a schema of another format or one
//     the handler's type cannot read, a body that does not decode. A codec
//     returns it, the handler wraps it in a [handler.DecodeError], and the
//     consumer dead-letters the record at once with it as the reason;
//   - the registry's fault, an [*handler.UnavailableError]: it cannot be
//     reached, does not answer within [WithTimeout], or answers 5xx (or
//     429, 401, 403: nothing a record did). The consumer holds the
//     partition from that record on and retries it with backoff until the
//     registry answers, never dead-lettering it, and logs and counts it as
//     a transient retry, as in a database outage.
//
// The codecs also encode (for the outbox): they register the schema of the
// message's type under the subject a [SubjectNameStrategy] names for the
// topic ([TopicNameStrategy] unless told otherwise), or only look it up
// ([WithLookupOnly]), and frame the body with its id. Package srtest
// ([github.com/exactly-go/exactly/handler/schemaregistry/srtest]) serves an
// in-memory registry for tests, with outages on demand.
//
// The core packages (consumer, handler, dedupe, outbox) link none of this:
// a service that uses no registry carries no Protobuf or Avro code.
package schemaregistry
