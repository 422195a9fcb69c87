package handler_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
)

// Two command types on one topic, told apart by the "type" header. Each
// route is an ordinary typed handler with its own key; a record of an
// unknown type fails with a *handler.RouteError, which the consumer
// dead-letters with that reason. Pass the router to consumer.Handle.
func ExampleNewRouter() {
	type Deposit struct {
		DepositID string `json:"deposit_id"`
		Amount    int64  `json:"amount"`
	}
	type Transfer struct {
		TransferID string `json:"transfer_id"`
		From, To   string
		Amount     int64 `json:"amount"`
	}
	wallet := handler.NewRouter("wallet", handler.ByHeader("type"),
		handler.Route("deposit", handler.New("deposit",
			handler.FromPayload(func(d Deposit) string { return dedupe.Key("deposit", d.DepositID) }),
			func(ctx context.Context, tx pgx.Tx, msg handler.Message[Deposit]) error { return nil })),
		handler.Route("transfer", handler.New("transfer",
			handler.FromPayload(func(t Transfer) string { return dedupe.Key("transfer", t.TransferID) }),
			func(ctx context.Context, tx pgx.Tx, msg handler.Message[Transfer]) error { return nil })),
	)
	typed := func(typ, value string) handler.Record {
		return handler.Record{Topic: "wallet-commands", Value: []byte(value),
			Headers: []handler.Header{{Key: "type", Value: []byte(typ)}}}
	}
	for _, rec := range []handler.Record{
		typed("deposit", `{"deposit_id":"d-1","amount":100}`),
		typed("transfer", `{"transfer_id":"t-9","amount":30}`),
		typed("refund", `{"refund_id":"r-2"}`),
	} {
		key, err := wallet.Key(rec)
		if err != nil {
			fmt.Println("dead-lettered:", err)
			continue
		}
		fmt.Println("key:", key)
	}
	// Output:
	// key: deposit:d-1
	// key: transfer:t-9
	// dead-lettered: router wallet: unknown type "refund" in header type (known types: deposit, transfer)
}
