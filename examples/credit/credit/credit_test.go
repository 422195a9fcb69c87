package credit_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/exactly-go/exactly/examples/credit/credit"
	"github.com/exactly-go/exactly/handler/handlertest"
	"github.com/exactly-go/exactly/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func commands(n int) []credit.Command {
	cmds := make([]credit.Command, n)
	for i := range cmds {
		cmds[i] = credit.Command{OrderID: fmt.Sprintf("order-%d", 8800+i), Account: int64(i % 7), Amount: int64(10 + i)}
	}
	return cmds
}

// The check of Making Background Jobs Idempotent: every command delivered three times at once, one ledger
// row and one event per order.
func TestCreditConcurrentDeliveriesApplyOnce(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	svc := credit.New()
	if err := svc.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	const n = 100
	rep := handlertest.Deliver(context.Background(), t, pool, svc.Handler(), handlertest.Delivery{Copies: 3}, commands(n)...)
	handlertest.AssertOneEffectPerKey(t, rep)
	if rep.Applied != n || rep.Duplicates != 2*n {
		t.Errorf("applied %d, duplicates %d; want %d and %d", rep.Applied, rep.Duplicates, n, 2*n)
	}
	var rows, events int
	if err := pool.QueryRow(ctx, `select count(*) from ledger`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `select count(*) from exactly_outbox where topic = $1`, credit.EventsTopic).Scan(&events); err != nil {
		t.Fatal(err)
	}
	if rows != n || events != n {
		t.Errorf("%d ledger rows and %d account-credited events, want %d of each", rows, events, n)
	}
}

// The same order sent from two code paths (a checkout and a retrying
// webhook) builds the same key.
func TestTwoCodePathsBuildTheSameKey(t *testing.T) {
	fromCheckout := credit.Key(credit.Command{OrderID: "order-8812", Account: 7, Amount: 100})
	webhook := struct{ Order string }{Order: "order-8812"}
	fromWebhook := credit.Key(credit.Command{OrderID: webhook.Order})
	if fromCheckout != fromWebhook || fromCheckout != "credit:order-8812" {
		t.Errorf("keys %q and %q, want both credit:order-8812", fromCheckout, fromWebhook)
	}
}

// Instances that start at once all set up the schema: none fails on the
// catalog race of concurrent "create table if not exists" (duplicate key
// in pg_type_typname_nsp_index), which hit about half of the starts of two
// instances before the set-up took an advisory lock.
func TestMigrateWhenInstancesStartAtOnce(t *testing.T) {
	const instances = 6
	for round := range 4 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			pool := testenv.DB(t)
			start := make(chan struct{})
			errs := make(chan error, instances)
			for range instances {
				go func() {
					<-start
					errs <- credit.New().Migrate(context.Background(), pool)
				}()
			}
			close(start)
			for range instances {
				if err := <-errs; err != nil {
					t.Errorf("one of %d concurrent set-ups failed: %v", instances, err)
				}
			}
		})
	}
}
