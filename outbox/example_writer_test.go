package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/outbox"
)

// ExampleWriter writes through the Writer interface, so one function serves
// a single table, a sharded outbox and the WAL outbox alike; a message added
// in a transaction that rolls back is never published (its row goes with
// the transaction). It needs DATABASE_URL (set by the test harness).
func ExampleWriter() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	schema := fmt.Sprintf("example_writer_%d", time.Now().UnixNano())
	defer pool.Exec(context.WithoutCancel(ctx), "drop schema "+pgx.Identifier{schema}.Sanitize()+" cascade")

	// charge is a handler's step: it takes whichever writer it is given.
	charge := func(ctx context.Context, tx pgx.Tx, w outbox.Writer, order string) error {
		return w.AddJSON(ctx, tx, "payments", []byte(order), map[string]any{"order": order, "amount": 1200})
	}
	one := outbox.New(outbox.WithTable(schema, "outbox"))
	sharded, err := outbox.NewSharded(2, outbox.WithTable(schema, "outbox"))
	if err != nil {
		fmt.Println(err)
		return
	}
	var _ outbox.Writer = outbox.NewWAL() // the WAL outbox is one too (it needs wal_level=logical)
	errRolledBack := errors.New("rolled back")
	for _, w := range []interface {
		outbox.Writer
		Migrate(context.Context, *pgxpool.Pool) error
		Backlog(context.Context, outbox.Querier) (int64, time.Duration, error)
	}{one, sharded} {
		if err := w.Migrate(ctx, pool); err != nil {
			fmt.Println(err)
			return
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return charge(ctx, tx, w, "order-8812") }); err != nil {
			fmt.Println(err)
			return
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := charge(ctx, tx, w, "order-8813"); err != nil {
				return err
			}
			return errRolledBack // the handler fails: its message goes with the transaction
		})
		n, _, berr := w.Backlog(ctx, pool)
		fmt.Printf("%T: %d row awaiting the relay (second transaction: %v, %v)\n", w, n, err, berr)
	}
	// Output:
	// *outbox.Outbox: 1 row awaiting the relay (second transaction: rolled back, <nil>)
	// *outbox.Sharded: 1 row awaiting the relay (second transaction: rolled back, <nil>)
}
