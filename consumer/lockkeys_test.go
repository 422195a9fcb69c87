package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
	"github.com/exactly-go/exactly/internal/testenv"
)

type transfer struct {
	ID     string `json:"id"`
	From   int64  `json:"from"`
	To     int64  `json:"to"`
	Amount int64  `json:"amount"`
}

// Two partitions transfer among three hot accounts in opposite directions,
// in batches of 100, with the accounts declared as lock keys. Both
// partitions' first batches are made to overlap: each, having updated its
// first account, waits until the other has too (which deadlocks without
// the lock keys) or is seen waiting for an advisory lock (the lock keys at
// work). No transaction may be lost to a deadlock (PostgreSQL's own count,
// pg_stat_database.deadlocks, and the consumer's retries), every transfer
// is applied once, and the balances are conserved.
//
// The pipelined form gets the same test: its statements go to the server in
// one pipeline after the handlers ran, so the batches are made to overlap
// in the handler, before either pipeline is sent.
func TestLockKeysMakeHotRowsDeadlockFree(t *testing.T) {
	for _, form := range []string{"tx", "pipelined"} {
		t.Run(form, func(t *testing.T) { hotRowsDeadlockFree(t, form) })
	}
}

func hotRowsDeadlockFree(t *testing.T, form string) {
	ctx := context.Background()
	url := testenv.DBURL(t)
	control, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer control.Close()
	if err := dedupe.Migrate(ctx, control); err != nil {
		t.Fatal(err)
	}
	if _, err := control.Exec(ctx, `create table accounts (id bigint primary key, balance bigint not null);
		insert into accounts select g, 1000 from generate_series(0, 2) g;
		create table transfers (id text primary key)`); err != nil {
		t.Fatal(err)
	}
	deadlocksBefore := statDeadlocks(t, control)

	const perPartition = 300
	kc := testenv.Kafka(t, 2, "transfers")
	brokers := testenv.Brokers(kc)
	var recs []*kgo.Record
	want := map[int64]int64{0: 1000, 1: 1000, 2: 1000}
	for p := int32(0); p < 2; p++ {
		for i := range perPartition {
			tr := transfer{ID: fmt.Sprintf("p%d-%d", p, i), From: int64(i % 3), To: int64((i + 1) % 3), Amount: int64(1 + i%7)}
			if p == 1 {
				tr.From, tr.To = tr.To, tr.From // the other partition goes round backwards
			}
			want[tr.From] -= tr.Amount
			want[tr.To] += tr.Amount
			v, _ := json.Marshal(tr)
			recs = append(recs, &kgo.Record{Topic: "transfers", Partition: p, Key: []byte(tr.ID), Value: v})
		}
	}
	testenv.Produce(t, brokers, recs...)

	var arrived atomic.Int32
	both := make(chan struct{}) // closed when both batches arrived: they leave together
	overlap := func(ctx context.Context) error {
		if arrived.Add(1) == 2 {
			close(both)
		}
		deadline := time.Now().Add(30 * time.Second)
		for arrived.Load() < 2 {
			var waiting bool
			if err := control.QueryRow(ctx, `select exists (select 1 from pg_locks
				where locktype = 'advisory' and not granted and database = (select oid from pg_database where datname = current_database()))`).Scan(&waiting); err != nil {
				return err
			}
			if waiting {
				return nil
			}
			if time.Now().After(deadline) {
				t.Error("the other partition's batch neither ran nor waited for a lock key within 30s")
				return nil
			}
			select { // polling pg_locks for the awaited state
			case <-both:
			case <-time.After(5 * time.Millisecond):
			}
		}
		return nil
	}
	const update = `update accounts set balance = balance + $2 where id = $1`
	move := func(ctx context.Context, tx pgx.Tx, account, delta int64) error {
		_, err := tx.Exec(ctx, update, account, delta)
		return err
	}
	key := handler.FromPayload(func(tr transfer) string { return dedupe.Key("transfer", tr.ID) })
	lockKeys := handler.WithLockKeys(func(tr transfer) []string {
		return []string{"account:" + strconv.FormatInt(tr.From, 10), "account:" + strconv.FormatInt(tr.To, 10)}
	})
	var h handler.Any = handler.NewPipelined("transfer", key,
		func(ctx context.Context, q handler.Queue, msg handler.Message[transfer]) error {
			tr := msg.Value
			first := msg.Record.Offset == 0 && msg.Attempt == 1
			if first {
				if err := overlap(ctx); err != nil {
					return err
				}
			}
			q.Queue(update, tr.From, -tr.Amount)
			if first {
				// The pipelines run on the server with no step between
				// their statements to wait at: both batches hold their
				// first account a while, so that (without the lock keys)
				// each then waits for the other's.
				q.Queue(`select pg_sleep(0.2)`)
			}
			q.Queue(update, tr.To, tr.Amount)
			q.Queue(`insert into transfers (id) values ($1)`, tr.ID)
			return nil
		}, lockKeys)
	if form == "tx" {
		h = handler.New("transfer", key, func(ctx context.Context, tx pgx.Tx, msg handler.Message[transfer]) error {
			tr := msg.Value
			if err := move(ctx, tx, tr.From, -tr.Amount); err != nil {
				return err
			}
			if msg.Record.Offset == 0 && msg.Attempt == 1 {
				if err := overlap(ctx); err != nil {
					return err
				}
			}
			if err := move(ctx, tx, tr.To, tr.Amount); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `insert into transfers (id) values ($1)`, tr.ID)
			return err
		}, lockKeys)
	}

	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	var contention atomic.Int32
	o := newOutcomes()
	hooks := o.hooks()
	hooks.OnRetry = func(_ context.Context, d consumer.RetryData) {
		if apply.IsContention(d.Err) {
			contention.Add(1)
		}
	}
	cfg := testConfig(brokers, "hot", "transfers")
	cfg.BatchMaxRecords = 100
	stop := startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(hooks))
	o.await(t, 120*time.Second, "every transfer", func() bool { return o.total() >= 2*perPartition })
	stop()
	pool.Close() // its backends end and report their statistics

	if c := contention.Load(); c != 0 {
		t.Errorf("%d transactions lost to deadlocks or serialization failures, want none", c)
	}
	if d := awaitDeadlockStat(t, control) - deadlocksBefore; d != 0 {
		t.Errorf("pg_stat_database.deadlocks rose by %d, want 0", d)
	}
	if a := o.get("applied"); a != 2*perPartition {
		t.Errorf("applied %d, want %d", a, 2*perPartition)
	}
	if n := count(t, control, `select count(*) from transfers`); n != 2*perPartition {
		t.Errorf("%d transfers recorded, want %d", n, 2*perPartition)
	}
	rows, err := control.Query(ctx, `select id, balance from accounts`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]int64, error) {
		var v [2]int64
		return v, r.Scan(&v[0], &v[1])
	})
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, a := range got {
		total += a[1]
		if a[1] != want[a[0]] {
			t.Errorf("account %d: balance %d, want %d", a[0], a[1], want[a[0]])
		}
	}
	if total != 3000 {
		t.Errorf("balances sum to %d, want 3000 (conserved)", total)
	}
}

// statDeadlocks returns pg_stat_database.deadlocks of the current database,
// as of now (not a cached snapshot).
func statDeadlocks(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), `select pg_stat_clear_snapshot()::text, coalesce(deadlocks, 0)
		from pg_stat_database where datname = current_database()`).Scan(new(string), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// awaitDeadlockStat waits until pool's connections are the database's only
// ones (an ended backend has reported its statistics) and returns the
// deadlock count.
func awaitDeadlockStat(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var others int
		if err := pool.QueryRow(ctx, `select count(*) from pg_stat_activity
			where datname = current_database() and pid <> pg_backend_pid() and backend_type = 'client backend'`).Scan(&others); err != nil {
			t.Fatal(err)
		}
		if others <= int(pool.Stat().TotalConns())-1 {
			return statDeadlocks(t, pool)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d other connections still open after 20s", others)
		}
		time.Sleep(20 * time.Millisecond) // polling pg_stat_activity for the awaited state
	}
}
