// Package jsonschema is the codec of JSON Schema payloads in the Confluent
// Schema Registry wire format: a JSON document after the 5-byte header,
// whose schema the registry holds. Failures are those of package
// schemaregistry.
package jsonschema
