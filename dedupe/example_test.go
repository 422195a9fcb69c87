package dedupe_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
)

// connect opens a pool on DATABASE_URL; the examples use a fresh scope each
// run so that their output does not depend on earlier runs.
func connect() (*pgxpool.Pool, string) {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	return pool, "example-" + rand.Text()
}

// A delivery claims its key in the transaction that performs its effect; a
// redelivery of the same operation finds the key taken and skips the work.
func Example() {
	ctx := context.Background()
	pool, scope := connect()
	defer pool.Close()
	if err := dedupe.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	guard := dedupe.New()

	deliver := func(orderID string) (dedupe.Outcome, error) {
		var outcome dedupe.Outcome
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			outcome, err = guard.Claim(ctx, tx, scope, dedupe.Key("credit", orderID))
			if err != nil || outcome == dedupe.Duplicate {
				return err
			}
			// The effect goes here, in tx: it commits with the guard row.
			return nil
		})
		return outcome, err
	}
	for range 3 {
		outcome, err := deliver("order-8812")
		fmt.Println(outcome, err)
	}
	_, found, _ := guard.Lookup(ctx, pool, scope, dedupe.Key("credit", "order-8812"))
	fmt.Println("claimed earlier:", found)
	// Output:
	// applied <nil>
	// duplicate <nil>
	// duplicate <nil>
	// claimed earlier: true
}

func ExampleKey() {
	fmt.Println(dedupe.Key("credit", "order-8812"))
	fmt.Println(dedupe.Key("fee", "account", 7, "2026-10"))
	// Output:
	// credit:order-8812
	// fee:account:7:2026-10
}

func ExampleNormalizeKey() {
	fmt.Println(dedupe.NormalizeKey("credit:order-8812"))
	fmt.Println(dedupe.NormalizeKey("nul\x00byte"))
	// Output:
	// credit:order-8812
	// sha256:a9512ba6902d2e41f0ff8e055f2c8ee7041a092a53d27b518cde6a91ea0facd5
}

func ExampleGuard_ClaimBatch() {
	ctx := context.Background()
	pool, scope := connect()
	defer pool.Close()
	guard := dedupe.New(dedupe.WithTable("", "exactly_guard"))
	if err := guard.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer tx.Rollback(ctx)
	outcomes, err := guard.ClaimBatch(ctx, tx, scope, []string{"credit:1", "credit:2", "credit:1"})
	fmt.Println(outcomes, err)
	// Record 2 failed and goes to the dead-letter topic: unclaim its key.
	if err := guard.Release(ctx, tx, scope, "credit:2"); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(tx.Commit(ctx))
	// Output:
	// [applied applied duplicate] <nil>
	// <nil>
}

func ExampleGuard_NewPruner() {
	pool, _ := connect()
	defer pool.Close()
	guard := dedupe.New()

	_, err := guard.NewPruner(pool, dedupe.PrunerConfig{Retention: 24 * time.Hour, RedeliveryHorizon: 72 * time.Hour})
	var short *dedupe.RetentionError
	fmt.Println(errors.As(err, &short), short.Retention, short.RedeliveryHorizon)

	// In a service: go pruner.Run(ctx)
	pruner, err := guard.NewPruner(pool, dedupe.PrunerConfig{Retention: 14 * 24 * time.Hour})
	fmt.Println(pruner != nil, err)
	// Output:
	// true 24h0m0s 72h0m0s
	// true <nil>
}
