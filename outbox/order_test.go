package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/deferred"
	"github.com/exactly-go/exactly/outbox"
)

// account creates the table accounts with one row, A, at balance 0.
func (e *env) account(t *testing.T) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), `create table accounts(id text primary key, balance bigint not null);
insert into accounts values ('A', 0)`); err != nil {
		t.Fatal(err)
	}
}

// credit adds 1 to account A in tx (waiting for its row lock) and returns
// the new balance.
func credit(ctx context.Context, tx pgx.Tx) (int64, error) {
	var b int64
	err := tx.QueryRow(ctx, `update accounts set balance = balance + 1 where id = 'A' returning balance`).Scan(&b)
	return b, err
}

// pid returns tx's backend pid.
func pid(t *testing.T, tx pgx.Tx) uint32 {
	t.Helper()
	var p uint32
	if err := tx.QueryRow(context.Background(), "select pg_backend_pid()").Scan(&p); err != nil {
		t.Fatal(err)
	}
	return p
}

// awaitLockWait waits until backend pid waits for a lock.
func (e *env) awaitLockWait(t *testing.T, pid uint32) {
	t.Helper()
	eventually(t, 10*time.Second, fmt.Sprintf("backend %d to wait for a lock", pid), func() bool {
		var waiting bool
		err := e.pool.QueryRow(context.Background(), "select exists(select 1 from pg_locks where pid = $1 and not granted)", pid).Scan(&waiting)
		return err == nil && waiting
	})
}

// values returns the values of recs of key, in the order read.
func values(recs []*kgo.Record, key string) []string {
	var vs []string
	for _, r := range recs {
		if string(r.Key) == key {
			vs = append(vs, string(r.Value))
		}
	}
	return vs
}

// TestFlushKeepsDependentRowsInCommitOrder is the consumer's path (rows
// queued as deferred writes and flushed just before COMMIT, no key locks): T1
// begins first and queues an event for key A before touching account A; T2
// then locks account A first, queues its event and commits first; T1, which
// waited for T2's row lock and read T2's balance, commits second. The relay
// must publish T2's event before both of T1's. Drawing ids when the row is
// queued (as a direct Add does) fails this: T1's first id is smaller.
func TestFlushKeepsDependentRowsInCommitOrder(t *testing.T) {
	e := setup(t, 1, "t")
	e.account(t)
	ctx := context.Background()
	wake := func(buf *deferred.Buffer) { buf.Committed(e.pool) }

	t1 := e.begin(t)
	buf1 := deferred.New(t1)
	ctx1 := deferred.With(ctx, buf1)
	if err := e.ob.Add(ctx1, t1, outbox.Message{Topic: "t", Key: []byte("A"), Value: []byte("t1: crediting")}); err != nil {
		t.Fatal(err)
	}

	t2 := e.begin(t)
	buf2 := deferred.New(t2)
	b2, err := credit(ctx, t2)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.ob.Add(deferred.With(ctx, buf2), t2, outbox.Message{Topic: "t", Key: []byte("A"), Value: fmt.Appendf(nil, "t2: balance %d", b2)}); err != nil {
		t.Fatal(err)
	}

	p1 := pid(t, t1)
	done1 := make(chan error, 1)
	go func() {
		b1, err := credit(ctx, t1) // waits for t2's row lock
		if err == nil {
			err = e.ob.Add(ctx1, t1, outbox.Message{Topic: "t", Key: []byte("A"), Value: fmt.Appendf(nil, "t1: balance %d", b1)})
		}
		if err == nil {
			err = buf1.Flush(ctx)
		}
		if err == nil {
			err = t1.Commit(ctx)
		}
		done1 <- err
	}()
	e.awaitLockWait(t, p1)
	if err := buf2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := t2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wake(buf2)
	if err := <-done1; err != nil {
		t.Fatalf("T1: %v", err)
	}
	wake(buf1)

	e.startRelay(t, e.fastConfig(t))
	got := values(e.consume(t, "t").waitFor(3, 10*time.Second), "A")
	want := []string{"t2: balance 1", "t1: crediting", "t1: balance 2"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("key A published as %q, want %q (commit order)", got, want)
	}
}

// TestDirectAddKeyLockKeepsCommitOrder decides whether a direct Add needs
// its per-key lock. It draws the id at once, before the transaction's later
// row locks: T2 locks account A; T1 adds an event for key A, then waits for
// A's row lock; T2 adds its own event for A and commits; T1 commits after
// it. Without the key lock T1's row has the smaller id and is published
// first, against commit order. With it, T2's Add waits for T1's key lock
// while T1 waits for T2's row lock: PostgreSQL aborts one as a deadlock,
// the test retries it as a caller would, and the relay must publish A's
// events in commit order.
func TestDirectAddKeyLockKeepsCommitOrder(t *testing.T) {
	e := setup(t, 1, "t")
	e.account(t)
	ctx := context.Background()
	var mu sync.Mutex
	var committed []string // the transactions' names, in commit order
	commit := func(tx pgx.Tx, name string) error {
		mu.Lock()
		defer mu.Unlock()
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		committed = append(committed, name)
		return nil
	}
	event := func(name string) outbox.Message {
		return outbox.Message{Topic: "t", Key: []byte("A"), Value: []byte(name)}
	}
	// retry runs name's whole transaction again, as a caller does after a
	// deadlock: lock A, add the event, commit.
	retry := func(name string) {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			if _, err := credit(ctx, tx); err != nil {
				return err
			}
			return e.ob.Add(ctx, tx, event(name))
		})
		if err != nil {
			t.Fatalf("retrying %s: %v", name, err)
		}
		mu.Lock()
		committed = append(committed, name)
		mu.Unlock()
	}
	deadlock := func(err error) bool {
		var pe *pgconn.PgError
		return errors.As(err, &pe) && pe.Code == "40P01"
	}

	t2 := e.begin(t)
	if _, err := credit(ctx, t2); err != nil {
		t.Fatal(err)
	}
	t1 := e.begin(t)
	if err := e.ob.Add(ctx, t1, event("T1")); err != nil {
		t.Fatal(err)
	}
	p1 := pid(t, t1)
	done1 := make(chan error, 1)
	go func() {
		_, err := credit(ctx, t1) // waits for T2's row lock
		if err == nil {
			err = commit(t1, "T1")
		}
		done1 <- err
	}()
	e.awaitLockWait(t, p1)

	deadlocks := 0
	err := e.ob.Add(ctx, t2, event("T2"))
	if err == nil {
		err = commit(t2, "T2")
	}
	if err != nil {
		if !deadlock(err) {
			t.Fatalf("T2: %v", err)
		}
		deadlocks++
		if err := t2.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	err1 := <-done1
	if err1 != nil {
		if !deadlock(err1) {
			t.Fatalf("T1: %v", err1)
		}
		deadlocks++
		if err := t1.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err != nil {
		retry("T2")
	}
	if err1 != nil {
		retry("T1")
	}
	t.Logf("commit order %v after %d deadlock(s)", committed, deadlocks)

	e.startRelay(t, e.fastConfig(t))
	got := values(e.consume(t, "t").waitFor(2, 10*time.Second), "A")
	if fmt.Sprint(got) != fmt.Sprint(committed) {
		t.Fatalf("key A published as %v, committed as %v: a direct Add without its key lock reorders dependent rows", got, committed)
	}
}

// A transaction that queues one row flushes it with a statement of its
// own (a VALUES insert, not unnest): the row it writes must be the one
// the many-row flush writes, keyless or not, with headers or without.
func TestFlushOfOneRowWritesWhatManyRowsWrite(t *testing.T) {
	e := setup(t, 1, "t")
	ctx := context.Background()
	msgs := []outbox.Message{
		{Topic: "t", Key: []byte("k"), Value: []byte("v"), Headers: []handler.Header{{Key: "h", Value: []byte("x")}}},
		{Topic: "t", Value: []byte("keyless")},
		{Topic: "t", Key: []byte{}, Value: nil},
	}
	// rows returns the rows written by flushing msgs queued in one
	// transaction, after deleting every row.
	rows := func(msgs ...outbox.Message) []string {
		t.Helper()
		if _, err := e.pool.Exec(ctx, `delete from exactly_outbox`); err != nil {
			t.Fatal(err)
		}
		tx := e.begin(t)
		buf := deferred.New(tx)
		for _, m := range msgs {
			if err := e.ob.Add(deferred.With(ctx, buf), tx, m); err != nil {
				t.Fatal(err)
			}
		}
		if err := buf.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		r, err := e.pool.Query(ctx, `select format('%s|%s|%s|%s', topic, coalesce(encode(key, 'escape'), '<null>'),
	coalesce(encode(value, 'escape'), '<null>'), coalesce(headers::text, '<null>')) from exactly_outbox order by id`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(r, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	many := rows(msgs...)
	if len(many) != len(msgs) {
		t.Fatalf("the many-row flush wrote %d rows, want %d", len(many), len(msgs))
	}
	for i, m := range msgs {
		one := rows(m)
		if len(one) != 1 || one[0] != many[i] {
			t.Errorf("message %d flushed alone wrote %q, flushed with the others %q", i, one, many[i])
		}
	}
}

// A handler that builds each message in one reused buffer (a common way to
// save allocations) must get each message's own row: a queued row is
// written at COMMIT, after the buffer was overwritten. Before the queue
// copied key and value, every row carried the last message's bytes.
func TestQueuedRowsKeepTheirBytesWhenTheBufferIsReused(t *testing.T) {
	e := setup(t, 1, "t")
	ctx := context.Background()
	tx := e.begin(t)
	buf := deferred.New(tx)
	key, value := make([]byte, 2), make([]byte, 2)
	for i := range 3 {
		key[0], key[1] = 'k', byte('0'+i)
		value[0], value[1] = 'v', byte('0'+i)
		if err := e.ob.Add(deferred.With(ctx, buf), tx, outbox.Message{Topic: "t", Key: key, Value: value}); err != nil {
			t.Fatal(err)
		}
	}
	if err := buf.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := e.pool.Query(ctx, `select convert_from(key, 'UTF8') || '=' || convert_from(value, 'UTF8') from exactly_outbox order by id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"k0=v0", "k1=v1", "k2=v2"}; !slices.Equal(got, want) {
		t.Errorf("rows %q, want %q", got, want)
	}
}
