package protobuf_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/schemaregistry/internal/interop"
	shopv1 "github.com/exactly-go/exactly/handler/schemaregistry/internal/shoppb/v1"
)

// The decode of one record by a handler, JSON (handler.JSON, with its fast
// path) beside Protobuf in the wire format (the schema id cached): what a
// registry codec costs a record, before the transaction.
func BenchmarkDecode(b *testing.B) {
	type orderPaid struct {
		OrderID     string `json:"order_id"`
		AmountCents int64  `json:"amount_cents"`
	}
	jsonValue, _ := json.Marshal(orderPaid{"o-1", 1250})
	b.Run("json", func(b *testing.B) {
		h := handler.New("audit", handler.FromPayload(func(m orderPaid) string { return m.OrderID }), noop[orderPaid])
		rec := handler.Record{Topic: "orders.paid", Value: jsonValue}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := h.Key(rec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("protobuf", func(b *testing.B) {
		_, c := setup(b)
		h := handler.New("audit", handler.FromPayload(func(m *shopv1.OrderPaid) string { return m.GetOrderId() }), noop[*shopv1.OrderPaid],
			handler.WithCodec(c))
		rec := handler.Record{Topic: "orders.paid", Value: interop.Fixture(b, "pb-v1-o1.bin")}
		if _, err := h.Key(rec); err != nil { // the schema, into the cache
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := h.Key(rec); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func noop[T any](context.Context, pgx.Tx, handler.Message[T]) error { return nil }
