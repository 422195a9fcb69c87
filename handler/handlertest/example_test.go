package handlertest_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/handlertest"
	"github.com/exactly-go/exactly/outbox"
)

type Credit struct {
	OrderID string `json:"order_id"`
	Account int64  `json:"account"`
	Amount  int64  `json:"amount"`
}

// A credit handler tested as you would in your own test: every command
// delivered three times at once, one ledger row per order, and one
// account-credited message per order in the outbox. In a test, pass your
// *testing.T where this example passes its reporter.
func Example() {
	ctx := context.Background()
	pool := exampleDatabase(ctx) // your test database
	defer pool.Close()
	t := reporter{} // your *testing.T
	if err := outbox.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `create table ledger(order_id text, account bigint, amount bigint)`); err != nil {
		log.Fatal(err)
	}
	credit := handler.New("credit",
		handler.FromPayload(func(c Credit) string { return dedupe.Key("credit", c.OrderID) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[Credit]) error {
			c := msg.Value
			if _, err := tx.Exec(ctx, `insert into ledger values ($1, $2, $3)`, c.OrderID, c.Account, c.Amount); err != nil {
				return err
			}
			return outbox.AddJSON(ctx, tx, "account-credited", []byte(strconv.FormatInt(c.Account, 10)), c)
		})

	rep := handlertest.Deliver(ctx, t, pool, credit, handlertest.Delivery{Copies: 3},
		Credit{OrderID: "order-1", Account: 7, Amount: 100}, Credit{OrderID: "order-2", Account: 8, Amount: 5})
	handlertest.AssertOneEffectPerKey(t, rep)
	ev := handlertest.RequireOutboxed[Credit](ctx, t, pool, "account-credited", &handlertest.OutboxOpts{Key: []byte("7")})
	handlertest.RequireOutboxCount(ctx, t, pool, "account-credited", 2, nil)
	fmt.Printf("applied=%d duplicates=%d\n", rep.Applied, rep.Duplicates)
	fmt.Printf("account 7 credited for %s\n", ev.Value.OrderID)
	// Output:
	// applied=2 duplicates=4
	// account 7 credited for order-1
}

// reporter stands in for *testing.T in the example: it prints failures.
type reporter struct{}

func (reporter) Helper()                           {}
func (reporter) Errorf(format string, args ...any) { fmt.Printf("FAIL: "+format+"\n", args...) }
func (reporter) Fatalf(format string, args ...any) { log.Fatalf("FAIL: "+format, args...) }

// exampleDatabase creates a fresh database on the server of DATABASE_URL
// (set by TestMain) and connects to it.
func exampleDatabase(ctx context.Context) *pgxpool.Pool {
	const name = "handlertest_example"
	admin, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `drop database if exists `+name+` with (force)`); err != nil {
		log.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `create database `+name); err != nil {
		log.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	return pool
}
