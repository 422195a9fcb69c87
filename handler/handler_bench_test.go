package handler_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
)

type benchCommand struct {
	OrderID string `json:"order_id"`
	Account int64  `json:"account"`
	Amount  int64  `json:"amount"`
}

// BenchmarkPrepareJSON decodes one JSON credit command and derives its key,
// the per-record work before the transaction.
func BenchmarkPrepareJSON(b *testing.B) {
	h := handler.New("credit", handler.FromPayload(func(c benchCommand) string { return dedupe.Key("credit", c.OrderID) }),
		func(context.Context, pgx.Tx, handler.Message[benchCommand]) error { return nil })
	rec := handler.Record{Topic: "credit-commands", Partition: 3, Offset: 12345,
		Key: []byte("order-8812"), Value: []byte(`{"order_id":"order-8812","account":42,"amount":1250}`)}
	b.ReportAllocs()
	for b.Loop() {
		p, err := h.PrepareUnit(rec)
		if err != nil || p.Key != "credit:order-8812" {
			b.Fatalf("%q %v", p.Key, err)
		}
	}
}
