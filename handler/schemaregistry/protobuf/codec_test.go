package protobuf_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/schemaregistry"
	"github.com/exactly-go/exactly/handler/schemaregistry/internal/interop"
	shopv1 "github.com/exactly-go/exactly/handler/schemaregistry/internal/shoppb/v1"
	"github.com/exactly-go/exactly/handler/schemaregistry/protobuf"
	"github.com/exactly-go/exactly/handler/schemaregistry/srtest"
)

func setup(t testing.TB, opts ...schemaregistry.Option) (*srtest.Registry, *protobuf.Codec) {
	t.Helper()
	reg := srtest.New()
	t.Cleanup(reg.Close)
	interop.Seed(t, reg)
	r, err := schemaregistry.Dial(reg.URL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return reg, protobuf.New(r)
}

// decode decodes b as a handler of *shopv1.OrderPaid would.
func decode(c handler.Codec, b []byte) (*shopv1.OrderPaid, error) {
	var m *shopv1.OrderPaid
	err := c.Unmarshal(b, &m)
	return m, err
}

// Records framed by Confluent's JavaScript serializer decode into the
// generated type: v1 records, and a v2 record (an added field) that the v1
// handler reads without the field.
func TestDecodesConfluentFramedRecords(t *testing.T) {
	_, c := setup(t)
	for _, tc := range []struct {
		fixture string
		id      string
		cents   int64
	}{{"pb-v1-o1.bin", "o-1", 1250}, {"pb-v1-o2.bin", "o-2", 990}, {"pb-v2-o3.bin", "o-3", 700}} {
		m, err := decode(c, interop.Fixture(t, tc.fixture))
		if err != nil {
			t.Fatalf("%s: %v", tc.fixture, err)
		}
		if m.GetOrderId() != tc.id || m.GetAmountCents() != tc.cents {
			t.Errorf("%s decoded to %v; want order %s, %d cents", tc.fixture, m, tc.id, tc.cents)
		}
	}
}

// The codec's own encoding reads back, and its header is the one
// Confluent's serializer wrote for the same message (magic byte, id,
// the zero-length index list of the first message), so that Confluent's
// deserializer reads it too.
func TestEncodesWhatConfluentWrites(t *testing.T) {
	_, c := setup(t)
	b, err := c.Encode(context.Background(), "orders.audit", &shopv1.OrderPaid{OrderId: "o-1", AmountCents: 1250})
	if err != nil {
		t.Fatal(err)
	}
	m, err := decode(c, b)
	if err != nil || m.GetOrderId() != "o-1" || m.GetAmountCents() != 1250 {
		t.Fatalf("decoded %v, %v; want o-1, 1250", m, err)
	}
	theirs := interop.Fixture(t, "pb-v1-o1.bin")
	if string(b[5:]) != string(theirs[5:]) || b[0] != 0 {
		t.Errorf("encoded % x; Confluent's serializer wrote % x (after the schema id)", b, theirs)
	}
	// A second encoding asks the registry nothing: the id is kept.
	if _, err := c.ForTopic("orders.audit").Marshal(&shopv1.OrderPaid{OrderId: "o-2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Marshal(&shopv1.OrderPaid{}); err == nil {
		t.Error("Marshal without a topic succeeded; it cannot choose the subject")
	}
}

// The subject strategies name the subject the schema is registered under.
func TestSubjectNameStrategies(t *testing.T) {
	reg, _ := setup(t)
	r, err := schemaregistry.Dial(reg.URL())
	if err != nil {
		t.Fatal(err)
	}
	for strategy, want := range map[string]struct {
		s       schemaregistry.SubjectNameStrategy
		subject string
	}{
		"topic":        {schemaregistry.TopicNameStrategy, "audit-value"},
		"record":       {schemaregistry.RecordNameStrategy, "shop.OrderPaid"},
		"topic-record": {schemaregistry.TopicRecordNameStrategy, "audit-shop.OrderPaid"},
	} {
		c := protobuf.New(r, protobuf.WithSubjectNameStrategy(want.s))
		if _, err := c.Encode(context.Background(), "audit", &shopv1.OrderPaid{OrderId: "x"}); err != nil {
			t.Fatalf("%s: %v", strategy, err)
		}
		if !reg.SubjectExists(want.subject) {
			t.Errorf("%s strategy: no subject %s registered", strategy, want.subject)
		}
	}
}

// Records that cannot be decoded fail with a *SchemaError naming the
// schema id and subject; the handler makes it a permanent DecodeError.
func TestUndecodableRecordsNameTheSchema(t *testing.T) {
	_, c := setup(t)
	good := interop.Fixture(t, "pb-v1-o1.bin")
	unknown := append([]byte(nil), good...)
	binary.BigEndian.PutUint32(unknown[1:5], 999)
	avroID := append([]byte(nil), good...)
	binary.BigEndian.PutUint32(avroID[1:5], uint32(interop.ID(t, "payments-value", 1)))
	badBody := append(append([]byte(nil), good[:6]...), 0xff, 0xff, 0xff)
	badIndex := append(append([]byte(nil), good[:5]...), 2, 6) // index [3]: no such message
	for _, tc := range []struct {
		name  string
		value []byte
		want  []string
	}{
		{"unknown id", unknown, []string{"schema id 999", "no schema with this id"}},
		{"wrong magic byte", append([]byte{1}, good[1:]...), []string{"magic byte"}},
		{"bare json", []byte(`{"order_id":"o-1"}`), []string{"magic byte"}},
		{"too short", good[:3], []string{"shorter than"}},
		{"an avro schema", avroID, []string{"schema id 3 (subject payments-value)", "not PROTOBUF"}},
		{"body does not decode", badBody, []string{"schema id 1 (subject orders.paid-value)", "decoding the body"}},
		{"no message at the index", badIndex, []string{"schema id 1", "no message at index [3]"}},
	} {
		_, err := decode(c, tc.value)
		var se *schemaregistry.SchemaError
		if !errors.As(err, &se) {
			t.Errorf("%s: error %v; want a *SchemaError", tc.name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", tc.name, err, w)
			}
		}
		if handler.IsUnavailable(err) {
			t.Errorf("%s: %v is an outage; want the record's fault", tc.name, err)
		}
	}
	if _, err := schemaregistry.Split([]byte{0, 0, 0, 0, 1}); err != nil {
		t.Errorf("a bare header: %v", err)
	}
}

// A handler of another message type refuses the record, naming both types.
func TestAnotherMessageTypeIsRefused(t *testing.T) {
	reg, c := setup(t)
	id, _, err := reg.RegisterSchema("other-value", sr.Schema{Type: sr.TypeProtobuf,
		Schema: "syntax = \"proto3\";\npackage shop;\nmessage Refund { string id = 1; }\n"})
	if err != nil {
		t.Fatal(err)
	}
	b := schemaregistry.AppendHeader(nil, id, []int{0})
	_, err = decode(c, append(b, 0x0a, 0x01, 'x'))
	if err == nil || !strings.Contains(err.Error(), "holds a shop.Refund") || !strings.Contains(err.Error(), "reads a shop.OrderPaid") {
		t.Errorf("error %v; want it to name shop.Refund and shop.OrderPaid", err)
	}
}

// The registry down: an *handler.UnavailableError, never a SchemaError. A
// schema read before is served from the cache, and the cache is bounded.
func TestRegistryDownIsAnOutage(t *testing.T) {
	reg, c := setup(t, schemaregistry.WithCacheSize(1))
	if _, err := decode(c, interop.Fixture(t, "pb-v1-o1.bin")); err != nil {
		t.Fatal(err)
	}
	reg.SetDown(true)
	before := reg.Requests()
	if _, err := decode(c, interop.Fixture(t, "pb-v1-o2.bin")); err != nil {
		t.Fatalf("a cached schema id while the registry is down: %v", err)
	}
	if reg.Requests() != before {
		t.Errorf("decoding a cached id asked the registry %d times", reg.Requests()-before)
	}
	_, err := decode(c, interop.Fixture(t, "pb-v2-o3.bin"))
	var se *schemaregistry.SchemaError
	if !handler.IsUnavailable(err) || errors.As(err, &se) {
		t.Fatalf("an unseen id while the registry is down: %v; want only an *handler.UnavailableError", err)
	}
	reg.SetDown(false)
	if _, err := decode(c, interop.Fixture(t, "pb-v2-o3.bin")); err != nil {
		t.Fatal(err)
	}
	// Size 1: id 2 pushed id 1 out.
	reg.SetDown(true)
	if _, err := decode(c, interop.Fixture(t, "pb-v1-o1.bin")); !handler.IsUnavailable(err) {
		t.Errorf("an evicted id while the registry is down: %v; want an outage", err)
	}
}

// SchemaText prints a file the registry's text form reads back: every
// message at the index Index gives it.
func TestSchemaTextNamesMessagesAtTheirIndexes(t *testing.T) {
	d := (&shopv1.OrderPaid{}).ProtoReflect().Descriptor()
	text, err := protobuf.SchemaText(d.ParentFile())
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`syntax = "proto3";`, "package shop;", "message OrderPaid {", "string order_id = 1;", "int64 amount_cents = 2;"} {
		if !strings.Contains(text, w) {
			t.Errorf("schema text lacks %q:\n%s", w, text)
		}
	}
	if idx := protobuf.Index(d); len(idx) != 1 || idx[0] != 0 {
		t.Errorf("Index = %v; want [0]", idx)
	}
}

// A registry that refuses connections, or answers 404 without Confluent's
// "schema not found" code (a wrong URL, a proxy's page), is an outage, not
// an unknown schema: the records wait instead of being dead-lettered.
func TestUnreachableRegistryIsAnOutage(t *testing.T) {
	gone := srtest.New()
	url := gone.URL()
	gone.Close()
	r, err := schemaregistry.Dial(url, schemaregistry.WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decode(protobuf.New(r), interop.Fixture(t, "pb-v1-o1.bin")); !handler.IsUnavailable(err) {
		t.Errorf("a registry refusing connections: %v; want an outage", err)
	}

	reg, c := setup(t)
	reg.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
		http.Error(w, "404 page not found", http.StatusNotFound)
		return true
	})
	_, err = decode(c, interop.Fixture(t, "pb-v1-o1.bin"))
	var se *schemaregistry.SchemaError
	if !handler.IsUnavailable(err) || errors.As(err, &se) {
		t.Errorf("a plain 404: %v; want an outage", err)
	}
}

// A message whose file imports another file is registered with a schema
// reference to it (the imported file under its path, as Confluent's
// serializers do; a well-known type needs none), and reads back.
func TestEncodeRegistersImportsAsReferences(t *testing.T) {
	reg, c := setup(t)
	ev := &shopv1.OrderRefunded{OrderId: "o-1", Amount: &shopv1.Money{Cents: 1250, Currency: "EUR"},
		At: timestamppb.New(time.Unix(1_800_000_000, 0)), Labels: map[string]string{"by": "support"},
		Reason: &shopv1.OrderRefunded_Code{Code: 7}}
	b, err := c.Encode(context.Background(), "orders.refunded", ev)
	if err != nil {
		t.Fatal(err)
	}
	money, ok := reg.GetSchema("shop/money.proto", 1)
	if !ok || !strings.Contains(money.Schema.Schema, "message Money {") {
		t.Fatalf("shop/money.proto: %+v, %v; want Money's file registered under its path", money, ok)
	}
	refunded, ok := reg.GetSchema("orders.refunded-value", 1)
	if !ok {
		t.Fatal("nothing registered under orders.refunded-value")
	}
	if refs := refunded.Schema.References; len(refs) != 1 || refs[0].Name != "shop/money.proto" || refs[0].Subject != "shop/money.proto" || refs[0].Version != 1 {
		t.Errorf("references %+v; want one to shop/money.proto version 1", refs)
	}
	for _, w := range []string{`import "shop/money.proto";`, `import "google/protobuf/timestamp.proto";`, ".shop.Money amount = 2;",
		"map<string, string> labels = 4;", "oneof reason {", "int32 code = 6;"} {
		if !strings.Contains(refunded.Schema.Schema, w) {
			t.Errorf("the registered schema lacks %q:\n%s", w, refunded.Schema.Schema)
		}
	}
	var got *shopv1.OrderRefunded
	if err := c.Unmarshal(b, &got); err != nil || !proto.Equal(got, ev) {
		t.Errorf("decoded %v, %v; want %v", got, err, ev)
	}
}
