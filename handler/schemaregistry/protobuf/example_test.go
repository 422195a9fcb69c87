package protobuf_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/schemaregistry"
	shopv1 "github.com/exactly-go/exactly/handler/schemaregistry/internal/shoppb/v1"
	"github.com/exactly-go/exactly/handler/schemaregistry/protobuf"
	"github.com/exactly-go/exactly/handler/schemaregistry/srtest"
)

// A handler of a generated message type reads records in the Confluent
// wire format; the same codec, bound to a topic, encodes what the handler
// emits through the outbox (outbox.AddValue(ctx, tx, topic, key, ev,
// codec.ForTopic(topic))).
func Example() {
	reg := srtest.New() // in a service: schemaregistry.Dial("http://registry:8081")
	defer reg.Close()
	r, err := schemaregistry.Dial(reg.URL())
	if err != nil {
		panic(err)
	}
	codec := protobuf.New(r)
	h := handler.New("audit", handler.FromPayload(func(m *shopv1.OrderPaid) string { return "paid:" + m.GetOrderId() }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[*shopv1.OrderPaid]) error {
			return nil // the handler's writes and outbox.AddValue
		}, handler.WithCodec(codec))

	// What a producer would write (subject orders.paid-value).
	value, err := codec.Encode(context.Background(), "orders.paid", &shopv1.OrderPaid{OrderId: "o-1", AmountCents: 1250})
	if err != nil {
		panic(err)
	}
	key, err := h.Key(handler.Record{Topic: "orders.paid", Value: value})
	fmt.Println(key, err, reg.SubjectExists("orders.paid-value"))

	// A value that is not in the wire format is refused, for the
	// dead-letter topic.
	_, err = h.Key(handler.Record{Topic: "orders.paid", Value: []byte(`{"order_id":"o-1"}`)})
	fmt.Println(err)
	// Output:
	// paid:o-1 <nil> true
	// decoding record value with codec protobuf-sr: value is not in the Confluent wire format: first byte 0x7b, want the magic byte 0x00
}
