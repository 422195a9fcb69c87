package handler_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
)

// Charge is what a payment provider answers.
type Charge struct {
	ID string `json:"id"`
}

// chargeCard stands for a payment provider's client: it would send
// idempotencyKey as the request's Idempotency-Key header.
func chargeCard(_ context.Context, idempotencyKey string, amount int64) (Charge, error) {
	return Charge{ID: "ch_" + idempotencyKey}, nil
}

// A handler whose provider call is declared once: the consumer makes the
// call before the record's transaction, with the record's key as the
// idempotency key and a deadline (EXACTLY_CALL_TIMEOUT); the transaction
// records the result with the guard row and gets it typed. The call's
// validation (a permanent error dead-letters the record) is written once.
func ExampleNewWithCall() {
	h := handler.NewWithCall("charge", handler.FromPayload(func(c Credit) string { return dedupe.Key("charge", c.OrderID) }),
		func(ctx context.Context, msg handler.Message[Credit], idempotencyKey string) (Charge, error) {
			if msg.Value.Amount <= 0 {
				return Charge{}, handler.Permanent(errors.New("amount must be positive"))
			}
			return chargeCard(ctx, idempotencyKey, msg.Value.Amount) // must honour ctx
		},
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[Credit], ch Charge) error {
			_, err := tx.Exec(ctx, `insert into charges(order_id, charge_id) values ($1, $2)`, msg.Value.OrderID, ch.ID)
			return err
		})
	fmt.Println(h.Name(), h.Validate())
	// Output:
	// charge <nil>
}
