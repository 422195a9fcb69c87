package bench

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/credit"
	"github.com/exactly-go/exactly/handler"
)

// pipelinedCredit is the credit effect as a pipelined handler: the ledger
// row queued, the event added to the outbox through the queue's write-only
// transaction. The executor sends every record's row, the outbox rows and
// the counters in one round trip.
func pipelinedCredit(f tables) *handler.Pipelined[credit.Command] {
	insert := `insert into ` + f.svc.Ledger().Sanitize() + ` (order_id, account, amount) values ($1, $2, $3)`
	return handler.NewPipelined("credit", handler.FromPayload(credit.Key),
		func(ctx context.Context, q handler.Queue, msg handler.Message[credit.Command]) error {
			c := msg.Value
			q.Queue(insert, c.OrderID, c.Account, c.Amount)
			if err := f.ob.AddJSON(ctx, q.Tx(), f.events, strconv.AppendInt(nil, c.Account, 10), credit.Credited(c)); err != nil {
				return fmt.Errorf("emitting account-credited for order %s: %w", c.OrderID, err)
			}
			return nil
		})
}

// setCredit is the credit effect as a set-based handler: one INSERT …
// SELECT unnest for the batch's ledger rows; the events are queued on the
// outbox, which inserts them in one statement before COMMIT.
func setCredit(f tables) *handler.Set[credit.Command] {
	insert := `insert into ` + f.svc.Ledger().Sanitize() + ` (order_id, account, amount)
		select * from unnest($1::text[], $2::bigint[], $3::bigint[])`
	return handler.NewSet("credit", handler.FromPayload(credit.Key),
		func(ctx context.Context, tx pgx.Tx, msgs []handler.Message[credit.Command]) error {
			ids, accounts, amounts := make([]string, len(msgs)), make([]int64, len(msgs)), make([]int64, len(msgs))
			for i, m := range msgs {
				c := m.Value
				ids[i], accounts[i], amounts[i] = c.OrderID, c.Account, c.Amount
				if err := f.ob.AddJSON(ctx, tx, f.events, strconv.AppendInt(nil, c.Account, 10), credit.Credited(c)); err != nil {
					return fmt.Errorf("emitting account-credited for order %s: %w", c.OrderID, err)
				}
			}
			if _, err := tx.Exec(ctx, insert, ids, accounts, amounts); err != nil {
				return fmt.Errorf("inserting %d ledger rows: %w", len(msgs), err)
			}
			return nil
		})
}
