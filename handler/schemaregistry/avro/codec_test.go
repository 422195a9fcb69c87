package avro_test

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/schemaregistry"
	"github.com/exactly-go/exactly/handler/schemaregistry/avro"
	"github.com/exactly-go/exactly/handler/schemaregistry/internal/interop"
	"github.com/exactly-go/exactly/handler/schemaregistry/srtest"
)

// The handler's v1 and v2 views of the payment; v2 adds an optional field.
const (
	schemaV1 = `{"type":"record","name":"Payment","namespace":"shop","fields":[{"name":"payment_id","type":"string"},{"name":"amount","type":"long"}]}`
	schemaV2 = `{"type":"record","name":"Payment","namespace":"shop","fields":[{"name":"payment_id","type":"string"},{"name":"amount","type":"long"},{"name":"currency","type":["null","string"],"default":null}]}`
)

type paymentV1 struct {
	PaymentID string `avro:"payment_id"`
	Amount    int64  `avro:"amount"`
}

type paymentV2 struct {
	PaymentID string  `avro:"payment_id"`
	Amount    int64   `avro:"amount"`
	Currency  *string `avro:"currency"`
}

func registry(t *testing.T) (*srtest.Registry, *schemaregistry.Registry) {
	t.Helper()
	reg := srtest.New()
	t.Cleanup(reg.Close)
	interop.Seed(t, reg)
	r, err := schemaregistry.Dial(reg.URL())
	if err != nil {
		t.Fatal(err)
	}
	return reg, r
}

// Avro records framed by Confluent's serializer decode with schema
// resolution: a v1 handler reads v1 and v2 records (v2's added field
// skipped), a v2 handler reads v1 records (the field's default).
func TestDecodesAcrossVersions(t *testing.T) {
	_, r := registry(t)
	v1, err := avro.New(r, schemaV1)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := avro.New(r, schemaV2)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		fixture string
		id      string
		amount  int64
	}{{"avro-v1-p1.bin", "p-1", 500}, {"avro-v1-p2.bin", "p-2", 800}, {"avro-v2-p3.bin", "p-3", 300}} {
		var p paymentV1
		if err := v1.Unmarshal(interop.Fixture(t, tc.fixture), &p); err != nil || p.PaymentID != tc.id || p.Amount != tc.amount {
			t.Errorf("v1 handler, %s: %+v, %v; want %s, %d", tc.fixture, p, err, tc.id, tc.amount)
		}
	}
	var old paymentV2
	if err := v2.Unmarshal(interop.Fixture(t, "avro-v1-p1.bin"), &old); err != nil || old.PaymentID != "p-1" || old.Currency != nil {
		t.Errorf("v2 handler, a v1 record: %+v, %v; want p-1 without currency", old, err)
	}
	var cur paymentV2
	if err := v2.Unmarshal(interop.Fixture(t, "avro-v2-p3.bin"), &cur); err != nil || cur.Currency == nil || *cur.Currency != "EUR" {
		t.Errorf("v2 handler, a v2 record: %+v, %v; want currency EUR", cur, err)
	}
}

// A reader schema the writer's cannot be resolved against (a field
// without default the writer never wrote) refuses the record, naming the
// schema id and subject; so do an unknown id and a body cut short.
func TestIncompatibleAndUndecodableRecordsNameTheSchema(t *testing.T) {
	_, r := registry(t)
	strict, err := avro.New(r, `{"type":"record","name":"Payment","namespace":"shop","fields":[{"name":"payment_id","type":"string"},{"name":"region","type":"string"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	v1, err := avro.New(r, schemaV1)
	if err != nil {
		t.Fatal(err)
	}
	good := interop.Fixture(t, "avro-v1-p1.bin")
	unknown := append([]byte(nil), good...)
	binary.BigEndian.PutUint32(unknown[1:5], 4242)
	for _, tc := range []struct {
		name  string
		codec *avro.Codec
		value []byte
		want  string
	}{
		{"incompatible reader", strict, good, "schema id 3 (subject payments-value): the writer's schema is not compatible"},
		{"unknown id", v1, unknown, "schema id 4242"},
		{"body cut short", v1, good[:7], "schema id 3 (subject payments-value): decoding the body"},
		{"a protobuf schema", v1, interop.Fixture(t, "pb-v1-o1.bin"), "not AVRO"},
	} {
		var p paymentV1
		err := tc.codec.Unmarshal(tc.value, &p)
		var se *schemaregistry.SchemaError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v; want a *SchemaError saying %q", tc.name, err, tc.want)
		}
	}
}

// The codec's encoding reads back as Confluent's does, and a registry that
// is down makes encoding an outage.
func TestEncodeRoundTripAndOutage(t *testing.T) {
	reg, r := registry(t)
	c, err := avro.New(r, schemaV1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Encode(context.Background(), "payments", paymentV1{PaymentID: "p-1", Amount: 500})
	if err != nil {
		t.Fatal(err)
	}
	if theirs := interop.Fixture(t, "avro-v1-p1.bin"); string(b) != string(theirs) {
		t.Errorf("encoded % x; Confluent's serializer wrote % x for the same payment and schema", b, theirs)
	}
	reg.SetDown(true)
	if _, err := c.Encode(context.Background(), "payments.audit", paymentV1{PaymentID: "p-1"}); !handler.IsUnavailable(err) {
		t.Errorf("encoding for a new subject while the registry is down: %v; want an outage", err)
	}
}
