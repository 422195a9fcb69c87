package handlertest_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/handlertest"
	"github.com/exactly-go/exactly/outbox"
)

// A pipelined credit handler: it queues its ledger row and adds its event
// through the queue's write-only transaction. Nothing is sent while it
// runs; the executor sends every record's statements, the outbox rows and
// the outcome counters of a batch in one round trip before COMMIT.
func Example_pipelined() {
	ctx := context.Background()
	pool := exampleDatabase(ctx)
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `create table ledger(order_id text, account bigint, amount bigint)`); err != nil {
		log.Fatal(err)
	}
	credit := handler.NewPipelined("credit",
		handler.FromPayload(func(c Credit) string { return dedupe.Key("credit", c.OrderID) }),
		func(ctx context.Context, q handler.Queue, msg handler.Message[Credit]) error {
			c := msg.Value
			q.Queue(`insert into ledger values ($1, $2, $3)`, c.OrderID, c.Account, c.Amount)
			return outbox.AddJSON(ctx, q.Tx(), "account-credited", []byte(strconv.FormatInt(c.Account, 10)), c)
		})

	rep := handlertest.Deliver(ctx, reporter{}, pool, credit, handlertest.Delivery{Copies: 3},
		Credit{OrderID: "order-1", Account: 7, Amount: 100}, Credit{OrderID: "order-2", Account: 8, Amount: 5})
	handlertest.AssertOneEffectPerKey(reporter{}, rep)
	var rows int
	if err := pool.QueryRow(ctx, `select count(*) from ledger`).Scan(&rows); err != nil {
		log.Fatal(err)
	}
	handlertest.RequireOutboxCount(ctx, reporter{}, pool, "account-credited", 2, nil)
	fmt.Printf("applied=%d duplicates=%d ledger rows=%d\n", rep.Applied, rep.Duplicates, rows)
	// Output:
	// applied=2 duplicates=4 ledger rows=2
}

// A pipelined transfer handler whose credit must touch exactly one row: it
// queues the UPDATE with handler.RowsAffected(1). Deliver runs the check as
// the consumer does, before COMMIT: the transfer to an account that does
// not exist fails (its debit rolls back with it) instead of silently doing
// nothing, and its error says so.
func Example_pipelinedCheck() {
	ctx := context.Background()
	pool := exampleDatabase(ctx)
	defer pool.Close()
	if _, err := pool.Exec(ctx, `create table accounts(id bigint primary key, balance bigint);
		insert into accounts values (7, 100), (8, 0)`); err != nil {
		log.Fatal(err)
	}
	type Transfer struct {
		ID       string `json:"id"`
		From, To int64
		Amount   int64
	}
	const update = `update accounts set balance = balance + $2 where id = $1`
	transfer := handler.NewPipelined("transfer",
		handler.FromPayload(func(t Transfer) string { return dedupe.Key("transfer", t.ID) }),
		func(ctx context.Context, q handler.Queue, msg handler.Message[Transfer]) error {
			t := msg.Value
			q.QueueCheck(handler.RowsAffected(1), update, t.From, -t.Amount)
			q.QueueCheck(handler.RowsAffected(1), update, t.To, t.Amount)
			return nil
		})

	rep := handlertest.Deliver(ctx, reporter{}, pool, transfer, handlertest.Delivery{Copies: 1, Sequential: true},
		Transfer{ID: "t-1", From: 7, To: 8, Amount: 30}, Transfer{ID: "t-2", From: 7, To: 9, Amount: 50})
	var rae *handler.RowsAffectedError
	for _, err := range rep.Errors {
		if errors.As(err, &rae) {
			fmt.Printf("refused: want %d row, got %d\n", rae.Want, rae.Got)
		}
	}
	var from, to int64
	if err := pool.QueryRow(ctx, `select (select balance from accounts where id = 7), (select balance from accounts where id = 8)`).Scan(&from, &to); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("applied=%d failed=%d balances 7=%d 8=%d\n", rep.Applied, len(rep.Errors), from, to)
	// Output:
	// refused: want 1 row, got 0
	// applied=1 failed=1 balances 7=70 8=30
}

// A set-based credit handler: one call per batch with every message that is
// not a duplicate, one INSERT … SELECT FROM unnest for all their ledger
// rows. Its events are queued by outbox.Add and inserted in one statement
// before COMMIT.
func Example_set() {
	ctx := context.Background()
	pool := exampleDatabase(ctx)
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `create table ledger(order_id text, account bigint, amount bigint)`); err != nil {
		log.Fatal(err)
	}
	credit := handler.NewSet("credit",
		handler.FromPayload(func(c Credit) string { return dedupe.Key("credit", c.OrderID) }),
		func(ctx context.Context, tx pgx.Tx, msgs []handler.Message[Credit]) error {
			ids, accounts, amounts := make([]string, len(msgs)), make([]int64, len(msgs)), make([]int64, len(msgs))
			for i, m := range msgs {
				ids[i], accounts[i], amounts[i] = m.Value.OrderID, m.Value.Account, m.Value.Amount
				if err := outbox.AddJSON(ctx, tx, "account-credited", []byte(strconv.FormatInt(m.Value.Account, 10)), m.Value); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `insert into ledger select * from unnest($1::text[], $2::bigint[], $3::bigint[])`, ids, accounts, amounts)
			return err
		})

	rep := handlertest.Deliver(ctx, reporter{}, pool, credit, handlertest.Delivery{Copies: 3},
		Credit{OrderID: "order-1", Account: 7, Amount: 100}, Credit{OrderID: "order-2", Account: 8, Amount: 5})
	handlertest.AssertOneEffectPerKey(reporter{}, rep)
	var rows int
	if err := pool.QueryRow(ctx, `select count(*) from ledger`).Scan(&rows); err != nil {
		log.Fatal(err)
	}
	handlertest.RequireOutboxCount(ctx, reporter{}, pool, "account-credited", 2, nil)
	fmt.Printf("applied=%d duplicates=%d ledger rows=%d\n", rep.Applied, rep.Duplicates, rows)
	// Output:
	// applied=2 duplicates=4 ledger rows=2
}
