package v2reader_test

import (
	"testing"

	"github.com/exactly-go/exactly/handler/schemaregistry"
	"github.com/exactly-go/exactly/handler/schemaregistry/internal/interop"
	shopv2 "github.com/exactly-go/exactly/handler/schemaregistry/internal/shoppb/v2"
	"github.com/exactly-go/exactly/handler/schemaregistry/protobuf"
	"github.com/exactly-go/exactly/handler/schemaregistry/srtest"
)

// A v2 handler (its message has a field v1 lacks) reads records of a v1
// producer, the field at its zero value, and a v2 producer's with it.
func TestV2HandlerReadsV1Records(t *testing.T) {
	reg := srtest.New()
	defer reg.Close()
	interop.Seed(t, reg)
	r, err := schemaregistry.Dial(reg.URL())
	if err != nil {
		t.Fatal(err)
	}
	c := protobuf.New(r)
	for _, tc := range []struct {
		fixture, id, currency string
	}{{"pb-v1-o1.bin", "o-1", ""}, {"pb-v2-o3.bin", "o-3", "EUR"}} {
		var m *shopv2.OrderPaid
		if err := c.Unmarshal(interop.Fixture(t, tc.fixture), &m); err != nil {
			t.Fatalf("%s: %v", tc.fixture, err)
		}
		if m.GetOrderId() != tc.id || m.GetCurrency() != tc.currency {
			t.Errorf("%s decoded to %v; want order %s, currency %q", tc.fixture, m, tc.id, tc.currency)
		}
	}
}
