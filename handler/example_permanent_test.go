package handler_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
)

var errNoSuchAccount = errors.New("no such account")

// A handler that fails for good: a command for an account that can never
// exist is dead-lettered at once with handler.Permanent, while insufficient
// funds, a business decision, is recorded and the handler returns nil.
func ExamplePermanent() {
	credit := func(ctx context.Context, tx pgx.Tx, msg handler.Message[Credit]) error {
		switch {
		case msg.Value.Account <= 0:
			return handler.Permanent(fmt.Errorf("account %d: %w", msg.Value.Account, errNoSuchAccount))
		case msg.Value.Amount > 1000:
			_, err := tx.Exec(ctx, `insert into rejections(order_id, reason) values ($1, 'insufficient funds')`, msg.Value.OrderID)
			return err
		}
		_, err := tx.Exec(ctx, `insert into ledger(account, amount) values ($1, $2)`, msg.Value.Account, msg.Value.Amount)
		return err
	}
	_ = handler.New("credit", handler.FromPayload(func(c Credit) string { return dedupe.Key("credit", c.OrderID) }), credit)

	err := credit(context.Background(), nil, handler.Message[Credit]{Value: Credit{OrderID: "order-1", Account: -3}})
	var perm *handler.PermanentError
	fmt.Println(errors.As(err, &perm), errors.Is(err, errNoSuchAccount))
	fmt.Println(err)
	fmt.Println(handler.Permanent(nil) == nil)
	// Output:
	// true true
	// permanent: account -3: no such account
	// true
}
