package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
)

// A batch's transaction runs at READ COMMITTED even when the database's
// default_transaction_isolation is REPEATABLE READ: a claim that waited
// for a rotation of the guard's generations must take its snapshot after
// the wait, or it misses the key the sealed generation holds.
func TestBatchesRunAtReadCommitted(t *testing.T) {
	ctx := context.Background()
	admin := testenv.DB(t)
	var db string
	if err := admin.QueryRow(ctx, `select current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `alter database `+pgx.Identifier{db}.Sanitize()+` set default_transaction_isolation = 'repeatable read'`); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, admin.Config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var def string
	if err := pool.QueryRow(ctx, `show default_transaction_isolation`).Scan(&def); err != nil || def != "repeatable read" {
		t.Fatalf("default_transaction_isolation = %q, %v; the test needs repeatable read", def, err)
	}
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "credits")
	brokers := testenv.Brokers(kc)
	var recs []*kgo.Record
	for i := range 5 {
		v, _ := json.Marshal(credit{OrderID: fmt.Sprintf("order-%d", i), Account: 1, Amount: 1})
		recs = append(recs, &kgo.Record{Topic: "credits", Value: v})
	}
	produceManual(t, brokers, recs...)
	var mu sync.Mutex
	seen := map[string]int{}
	h := handler.New("credit", creditKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
		var level string
		if err := tx.QueryRow(ctx, `select current_setting('transaction_isolation')`).Scan(&level); err != nil {
			return err
		}
		mu.Lock()
		seen[level]++
		mu.Unlock()
		return insertCredit(ctx, tx, msg.Value)
	})
	o := newOutcomes()
	startConsumer(t, testConfig(brokers, "g", "credits"), pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	o.await(t, 60*time.Second, "every record", func() bool { return o.total() >= len(recs) })
	mu.Lock()
	defer mu.Unlock()
	if seen["read committed"] == 0 || len(seen) != 1 {
		t.Fatalf("handlers ran at %v, want read committed only", seen)
	}
}
