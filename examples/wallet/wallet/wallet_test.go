package wallet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/examples/wallet/wallet"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func command(t *testing.T, typ string, v any) *kgo.Record {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	rec := &kgo.Record{Topic: wallet.CommandsTopic, Value: b}
	if typ != "" {
		rec.Headers = []kgo.RecordHeader{{Key: wallet.TypeHeader, Value: []byte(typ)}}
	}
	return rec
}

// Deposits and transfers on one topic, end to end on the embedded broker
// through consumer.Service: each command applies once however often it is
// sent, each through its own handler and key; a transfer the account
// cannot cover is recorded as rejected; a record with an unknown type and
// one with no type are dead-lettered with the reason, no handler run.
func TestDepositAndTransferOnOneTopic(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	if err := wallet.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	kc := testenv.Kafka(t, 1, wallet.CommandsTopic, wallet.CommandsTopic+".dlq", wallet.EventsTopic)
	brokers := testenv.Brokers(kc)

	var mu sync.Mutex
	outcomes := map[string]int{}
	applied := map[string]bool{}
	finished := make(chan struct{}, 64)
	cfg := consumer.Config{Brokers: brokers, Group: "wallet", CommitInterval: 100 * time.Millisecond}
	svc, err := consumer.NewService(cfg, pool, consumer.Handle(wallet.Router(), wallet.CommandsTopic),
		consumer.WithHooks(consumer.Hooks{OnOutcome: func(_ context.Context, d consumer.OutcomeData) {
			key, outcome := d.Key, d.Outcome
			mu.Lock()
			outcomes[string(outcome)]++
			if outcome == "applied" {
				applied[key] = true
			}
			mu.Unlock()
			finished <- struct{}{}
		}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	recs := []*kgo.Record{
		command(t, wallet.TypeDeposit, wallet.Deposit{DepositID: "d1", Account: "alice", Amount: 100}),
		command(t, wallet.TypeDeposit, wallet.Deposit{DepositID: "d1", Account: "alice", Amount: 100}), // sent twice
		command(t, wallet.TypeDeposit, wallet.Deposit{DepositID: "d2", Account: "bob", Amount: 10}),
		command(t, wallet.TypeTransfer, wallet.Transfer{TransferID: "t1", From: "alice", To: "bob", Amount: 30}),
		command(t, wallet.TypeTransfer, wallet.Transfer{TransferID: "t1", From: "alice", To: "bob", Amount: 30}), // twice
		command(t, wallet.TypeTransfer, wallet.Transfer{TransferID: "t2", From: "bob", To: "alice", Amount: 1000}),
		command(t, "refund", wallet.Deposit{DepositID: "r1", Account: "alice", Amount: 5}),
		command(t, "", wallet.Deposit{DepositID: "x1", Account: "alice", Amount: 5}),
	}
	testenv.Produce(t, brokers, recs...)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	timeout := time.After(60 * time.Second)
	for i := range recs {
		select {
		case <-finished:
		case err := <-done:
			t.Fatalf("Service.Run returned %v after %d of %d records", err, i, len(recs))
		case <-timeout:
			t.Fatalf("only %d of %d records finished", i, len(recs))
		}
	}
	dead := testenv.ReadTopic(t, brokers, wallet.CommandsTopic+".dlq", 2)
	events := testenv.ReadTopic(t, brokers, wallet.EventsTopic, 2)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	if outcomes["applied"] != 4 || outcomes["duplicate"] != 2 || outcomes["dead_lettered"] != 2 {
		t.Errorf("outcomes %v, want applied 4 (d1, d2, t1, t2), duplicate 2, dead_lettered 2", outcomes)
	}
	// Each command was keyed by its own handler's key source.
	for _, k := range []string{"deposit:d1", "deposit:d2", "transfer:t1", "transfer:t2"} {
		if !applied[k] {
			t.Errorf("no applied record keyed %s; applied keys %v", k, applied)
		}
	}
	mu.Unlock()
	balances := map[string]int64{}
	rows, err := pool.Query(ctx, `select account, balance from wallet_accounts`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var a string
		var b int64
		if err := rows.Scan(&a, &b); err != nil {
			t.Fatal(err)
		}
		balances[a] = b
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if balances["alice"] != 70 || balances["bob"] != 40 {
		t.Errorf("balances %v, want alice 70, bob 40", balances)
	}
	var rejected string
	if err := pool.QueryRow(ctx, `select status from wallet_transfers where transfer_id = 't2'`).Scan(&rejected); err != nil || rejected != "rejected" {
		t.Errorf("t2 status = %q, %v; want rejected", rejected, err)
	}
	statuses := map[string]string{}
	for _, e := range events {
		var ev wallet.TransferEvent
		if err := json.Unmarshal(e.Value, &ev); err != nil {
			t.Fatal(err)
		}
		statuses[ev.TransferID] = ev.Status
	}
	if statuses["t1"] != "completed" || statuses["t2"] != "rejected" {
		t.Errorf("events %v, want t1 completed and t2 rejected", statuses)
	}
	var reasons []string
	for _, d := range dead {
		for _, h := range d.Headers {
			if h.Key == outbox.HeaderError {
				reasons = append(reasons, string(h.Value))
			}
		}
	}
	joined := strings.Join(reasons, "\n")
	if len(reasons) != 2 || !strings.Contains(joined, `unknown type "refund" in header type (known types: deposit, transfer)`) ||
		!strings.Contains(joined, "no type in header type") {
		t.Errorf("dead-letter reasons:\n%s\nwant the unknown type and the missing type named", joined)
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
					errs <- wallet.Migrate(context.Background(), pool)
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
