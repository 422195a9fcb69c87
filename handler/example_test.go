package handler_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
)

type Credit struct {
	OrderID string `json:"order_id"`
	Account int64  `json:"account"`
	Amount  int64  `json:"amount"`
}

// A handler keyed by the business operation: every copy of the command for
// order 8812 has the key credit:order-8812, wherever and however often it
// is delivered.
func ExampleNew() {
	credit := handler.New("credit",
		handler.FromPayload(func(c Credit) string { return dedupe.Key("credit", c.OrderID) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[Credit]) error {
			_, err := tx.Exec(ctx, `insert into ledger(account, amount) values ($1, $2)`, msg.Value.Account, msg.Value.Amount)
			return err
		})

	for _, offset := range []int64{17, 942} { // the same command, delivered twice
		key, err := credit.Key(handler.Record{Topic: "credit-commands", Offset: offset,
			Value: []byte(`{"order_id":"order-8812","account":7,"amount":100}`)})
		fmt.Println(key, err)
	}
	fmt.Println(credit.Scope(), credit.Guarded())
	// Output:
	// credit:order-8812 <nil>
	// credit:order-8812 <nil>
	// credit true
}

// A consumer of events published by an exactly outbox keys them by the
// message-id header, which the relay keeps across republishes.
func ExampleFromHeader() {
	notify := handler.New("notify", handler.FromHeader[Credit]("message-id"),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[Credit]) error { return nil })

	rec := handler.Record{Value: []byte(`{"order_id":"order-8812"}`),
		Headers: []handler.Header{{Key: "message-id", Value: []byte("0b7e6a52-2d2f-4d5e-9a55-0a8e4d1f2c11")}}}
	key, err := notify.Key(rec)
	fmt.Println(key, err)

	_, err = notify.Key(handler.Record{Value: []byte(`{"order_id":"order-8813"}`)})
	fmt.Println(err)
	// Output:
	// 0b7e6a52-2d2f-4d5e-9a55-0a8e4d1f2c11 <nil>
	// deriving key from header:message-id: header "message-id" is missing
}

// Records that cannot become a message fail with a typed error, and the
// consumer sends them to the dead-letter topic with that reason.
func ExampleHandler_Key_errors() {
	credit := handler.New("credit",
		handler.FromPayload(func(c Credit) string {
			if c.OrderID == "" {
				return ""
			}
			return dedupe.Key("credit", c.OrderID)
		}),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[Credit]) error { return nil })

	for _, value := range []string{"", "garbage", `{"account": 7}`} {
		_, err := credit.Key(handler.Record{Value: []byte(value)})
		fmt.Println(err)
	}
	// Output:
	// decoding record value with codec json: empty value (tombstone)
	// decoding record value with codec json: decoding json: invalid character 'g' looking for beginning of value
	// deriving key from payload: the payload key function returned an empty key
}
