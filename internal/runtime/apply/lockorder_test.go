package apply_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
)

// Two batches declare the same two lock keys in opposite arrival orders (a
// record locking account:x then one locking account:y; the other batch
// the reverse) and both wait inside the statement that takes them: a
// third connection holds both keys until each batch is seen waiting for
// one, then releases both at once. Since every batch takes its keys in one
// global (sorted) order, both apply and PostgreSQL counts no deadlock.
// (Taken in arrival order, each batch gets its first key on the release
// and then waits for the other's: PostgreSQL ends one of them with a
// deadlock within deadlock_timeout.)
func TestLockKeysTakenInOneOrderAcrossBatches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := handler.New("acct", handler.FromPayload(func(a accounts) string { return dedupe.Key("acct", a.ID) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[accounts]) error {
			_, err := tx.Exec(ctx, `insert into entries (id, amount) values ($1, 0)`, msg.Value.ID)
			return err
		},
		handler.WithLockKeys(func(a accounts) []string { return a.Accounts }))
	e, pool := newFormExecutor(t, h)
	// Each batch runs on an executor of its own, over the same pool.
	other := &apply.Executor{Pool: e.Pool, Guard: e.Guard, Handler: e.Handler, MaxAttempts: e.MaxAttempts}
	batch := func(prefix string, keys ...string) []apply.Item {
		items := make([]apply.Item, len(keys))
		for i, k := range keys {
			v, err := json.Marshal(accounts{ID: fmt.Sprintf("%s%d", prefix, i), Accounts: []string{k}})
			if err != nil {
				t.Fatal(err)
			}
			items[i] = apply.Item{Attempt: 1, Record: handler.Record{Topic: "accounts", Offset: int64(i), Value: v}}
		}
		return items
	}
	forward, backward := batch("f", "account:x", "account:y"), batch("b", "account:y", "account:x")
	var deadlocksBefore int64
	if err := pool.QueryRow(ctx, `select pg_stat_clear_snapshot()::text, coalesce(deadlocks, 0)
		from pg_stat_database where datname = current_database()`).Scan(new(string), &deadlocksBefore); err != nil {
		t.Fatal(err)
	}

	holder, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `select pg_advisory_lock($1), pg_advisory_lock($2)`,
		apply.LockKey("account:x"), apply.LockKey("account:y")); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		res  []apply.Result
		herr *apply.HandlerError
		err  error
	}
	done := make(chan outcome, 2)
	for _, run := range []struct {
		e     *apply.Executor
		items []apply.Item
	}{{e, forward}, {other, backward}} {
		go func() {
			res, herr, err := run.e.Run(ctx, run.items)
			done <- outcome{res, herr, err}
		}()
	}
	// Both batches wait inside their lock statement (for the holder's
	// keys) before the holder lets go of both in one call.
	for {
		var waiting int
		if err := pool.QueryRow(ctx, `select count(*) from pg_locks where locktype = 'advisory' and not granted
			and database = (select oid from pg_database where datname = current_database())`).Scan(&waiting); err != nil {
			t.Fatalf("waiting for both batches to wait for a lock key: %v", err)
		}
		if waiting == 2 {
			break
		}
		select { // polling pg_locks for the awaited state
		case o := <-done:
			t.Fatalf("a batch ended before the held keys were released: results %v, handler error %v, error %v", o.res, o.herr, o.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if _, err := holder.Exec(ctx, `select pg_advisory_unlock_all()`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case o := <-done:
			if o.err != nil || o.herr != nil || len(o.res) != 2 {
				t.Errorf("results %v, handler error %v, error %v (contention: %t); want both records applied",
					o.res, o.herr, o.err, apply.IsContention(o.err))
			}
		case <-ctx.Done():
			t.Fatal("the batches did not end within 30 s")
		}
	}
	var deadlocks int64
	if err := pool.QueryRow(context.Background(), `select pg_stat_clear_snapshot()::text, coalesce(deadlocks, 0)
		from pg_stat_database where datname = current_database()`).Scan(new(string), &deadlocks); err != nil {
		t.Fatal(err)
	}
	if d := deadlocks - deadlocksBefore; d != 0 {
		t.Errorf("pg_stat_database.deadlocks rose by %d, want 0", d)
	}
}
