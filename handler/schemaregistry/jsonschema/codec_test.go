package jsonschema_test

import (
	"context"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/handler/schemaregistry"
	"github.com/exactly-go/exactly/handler/schemaregistry/internal/interop"
	"github.com/exactly-go/exactly/handler/schemaregistry/jsonschema"
	"github.com/exactly-go/exactly/handler/schemaregistry/srtest"
)

type refund struct {
	RefundID string `json:"refund_id"`
	Amount   int64  `json:"amount"`
}

const refundSchema = `{"type":"object","properties":{"refund_id":{"type":"string"},"amount":{"type":"integer"}},"required":["refund_id","amount"]}`

// A JSON Schema record framed by Confluent's serializer decodes, the
// codec's own encoding is byte for byte what that serializer wrote, and a
// record of an Avro schema is refused naming it.
func TestJSONSchemaRecords(t *testing.T) {
	reg := srtest.New()
	defer reg.Close()
	interop.Seed(t, reg)
	r, err := schemaregistry.Dial(reg.URL())
	if err != nil {
		t.Fatal(err)
	}
	c, err := jsonschema.New(r, refundSchema, jsonschema.DisallowUnknownFields())
	if err != nil {
		t.Fatal(err)
	}
	theirs := interop.Fixture(t, "json-r1.bin")
	var got refund
	if err := c.Unmarshal(theirs, &got); err != nil || got != (refund{"r-1", 40}) {
		t.Fatalf("decoded %+v, %v; want r-1, 40", got, err)
	}
	ours, err := c.Encode(context.Background(), "refunds", got)
	if err != nil {
		t.Fatal(err)
	}
	if string(ours) != string(theirs) {
		t.Errorf("encoded %q; Confluent's serializer wrote %q", ours, theirs)
	}
	err = c.Unmarshal(interop.Fixture(t, "avro-v1-p1.bin"), &got)
	if err == nil || !strings.Contains(err.Error(), "schema id 3 (subject payments-value): the schema is AVRO, not JSON") {
		t.Errorf("an avro record: %v; want it refused naming schema id 3", err)
	}
	if _, err := jsonschema.New(r, "not json"); err == nil {
		t.Error("New accepted a schema that is not JSON")
	}
}
