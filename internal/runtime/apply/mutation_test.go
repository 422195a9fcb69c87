package apply_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
)

// describe renders what a handler or a dead letter can see of a record's
// bytes: its key, value and headers.
func describe(rec handler.Record) string {
	var b strings.Builder
	fmt.Fprintf(&b, "key=%q value=%q", rec.Key, rec.Value)
	for _, h := range rec.Headers {
		fmt.Fprintf(&b, " %s=%q", h.Key, h.Value)
	}
	return b.String()
}

// scribble does to msg's record what careless handlers do: overwrites the
// key and value bytes in place (a decryption in place), overwrites a
// header's value and replaces another header, and appends a header.
func scribble(rec *handler.Record) {
	for _, b := range [][]byte{rec.Key, rec.Value} {
		for i := range b {
			b[i] = '#'
		}
	}
	if len(rec.Headers) > 0 {
		rec.Headers[0].Value[0] = '#'
		rec.Headers[len(rec.Headers)-1] = handler.Header{Key: "swapped", Value: []byte("by the handler")}
	}
	rec.Headers = append(rec.Headers, handler.Header{Key: "added", Value: []byte("by the handler")})
}

// mutationRun is what the handler under test saw in one run of a record.
type mutationRun struct {
	id, seen string
}

// A handler of every form that scribbles on its record's key, value and
// headers, in a batch where a later record fails (so the batch is replayed),
// and which fails once and then permanently for that record: every run,
// replays and retries included, sees the record as it came from Kafka, and
// its dead letter carries the original bytes. (The runtime used to hand the
// handler the record it kept: the replay decoded the scribbles and failed,
// and the dead letter carried them.)
func TestHandlerMutatingItsRecordChangesNothing(t *testing.T) {
	var mu sync.Mutex
	var runs []mutationRun
	// visit records what the handler saw, scribbles, and says how the
	// record ends: b fails once, then for good.
	visit := func(msg *handler.Message[entry]) error {
		mu.Lock()
		runs = append(runs, mutationRun{msg.Value.ID, describe(msg.Record)})
		mu.Unlock()
		scribble(&msg.Record)
		switch {
		case msg.Value.ID != "b":
			return nil
		case msg.Attempt == 1:
			return errors.New("fails once")
		default:
			return handler.Permanent(errors.New("gives up"))
		}
	}
	insert := `insert into entries (id, amount) values ($1, $2)`
	forms := []struct {
		name string
		h    handler.Any
	}{
		{"tx", handler.New("entry", handler.FromPayload(entryKey),
			func(ctx context.Context, tx pgx.Tx, msg handler.Message[entry]) error {
				if err := visit(&msg); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, insert, msg.Value.ID, msg.Value.Amount)
				return err
			})},
		{"pipelined", handler.NewPipelined("entry", handler.FromPayload(entryKey),
			func(ctx context.Context, q handler.Queue, msg handler.Message[entry]) error {
				if err := visit(&msg); err != nil {
					return err
				}
				q.Queue(insert, msg.Value.ID, msg.Value.Amount)
				return nil
			})},
		{"set", handler.NewSet("entry", handler.FromPayload(entryKey),
			func(ctx context.Context, tx pgx.Tx, msgs []handler.Message[entry]) error {
				var errs []error
				for i := range msgs {
					errs = append(errs, visit(&msgs[i]))
				}
				if err := errors.Join(errs...); err != nil {
					return err
				}
				for _, m := range msgs {
					if _, err := tx.Exec(ctx, insert, m.Value.ID, m.Value.Amount); err != nil {
						return err
					}
				}
				return nil
			})},
	}
	for _, form := range forms {
		t.Run(form.name, func(t *testing.T) {
			runs = nil
			ctx := context.Background()
			e, pool := newFormExecutor(t, form.h)
			var dead []string
			e.DeadLetter = func(_ context.Context, _ pgx.Tx, rec handler.Record, _ string, _ int, reason error) error {
				dead = append(dead, describe(rec)+" reason="+reason.Error())
				return nil
			}
			its := make([]apply.Item, 2)
			want := map[string]string{}
			for i, id := range []string{"a", "b"} {
				v, err := json.Marshal(entry{ID: id, Amount: 1})
				if err != nil {
					t.Fatal(err)
				}
				its[i] = apply.Item{Attempt: 1, Record: handler.Record{Topic: "entries", Offset: int64(i), Key: []byte("key-" + id), Value: v,
					Headers: []handler.Header{{Key: "h1", Value: []byte("one-" + id)}, {Key: "h2", Value: []byte("two-" + id)}}}}
				want[id] = describe(its[i].Record)
			}
			res, herr, err := e.Run(ctx, its)
			if err != nil || herr == nil || herr.Index != 1 || len(res) != 1 || res[0].Outcome != dedupe.Applied {
				t.Fatalf("first attempt: results %v, handler error %v, error %v; want a applied and b failed", res, herr, err)
			}
			// The retry of b, with the items the consumer keeps.
			its[1].Attempt = 2
			res, herr, err = e.Run(ctx, its[1:])
			if err != nil || herr != nil || len(res) != 1 || res[0].Outcome != dedupe.DeadLettered {
				t.Fatalf("second attempt: results %v, handler error %v, error %v; want b dead-lettered", res, herr, err)
			}
			if !strings.Contains(res[0].Reason.Error(), "gives up") {
				t.Errorf("b dead-lettered for %q, want the handler's permanent error (not a decoding error of its scribbles)", res[0].Reason)
			}
			ranA := 0
			for _, r := range runs {
				if r.id == "a" {
					ranA++
				}
				if r.seen != want[r.id] {
					t.Errorf("a run of %s saw %s, want the record as it came: %s", r.id, r.seen, want[r.id])
				}
			}
			if ranA < 2 {
				t.Errorf("a ran %d times, want at least 2 (its run and the replay after b failed)", ranA)
			}
			if len(dead) != 1 || !strings.HasPrefix(dead[0], want["b"]+" reason=") {
				t.Errorf("dead letters %q, want b's original record: %s", dead, want["b"])
			}
			for i, id := range []string{"a", "b"} {
				if got := describe(its[i].Record); got != want[id] {
					t.Errorf("the consumer's record of %s is now %s, want %s", id, got, want[id])
				}
			}
			var applied int
			if err := pool.QueryRow(ctx, `select count(*) from entries where id = 'a'`).Scan(&applied); err != nil || applied != 1 {
				t.Errorf("a applied %d times (%v), want 1", applied, err)
			}
		})
	}
}

// accounts is a record of the lock-key test: its lock keys are its Accounts
// field itself, as a lock-key function may well return.
type accounts struct {
	ID       string   `json:"id"`
	Accounts []string `json:"accounts"`
}

// heldLocks returns the transaction-level advisory locks tx's backend
// holds, as the 64-bit keys they were taken with, sorted.
func heldLocks(ctx context.Context, tx pgx.Tx) ([]int64, error) {
	rows, err := tx.Query(ctx, `select (classid::bigint << 32) | objid::bigint from pg_locks
		where locktype = 'advisory' and objsubid = 1 and pid = pg_backend_pid() order by 1`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// A handler that changes the slice its lock keys came from (the payload's
// Accounts, returned as is by the lock-key function) does not change the
// locks the batch takes when it is replayed. (The runtime used to keep that
// very slice as the record's lock keys: the replay locked the handler's
// scribble instead of the record's accounts.)
func TestHandlerMutatingItsLockKeysChangesNoLock(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var seen [][]int64 // the locks held in each run of a
	h := handler.New("acct", handler.FromPayload(func(a accounts) string { return a.ID }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[accounts]) error {
			if msg.Value.ID == "b" {
				return errors.New("b fails")
			}
			locks, err := heldLocks(ctx, tx)
			if err != nil {
				return err
			}
			mu.Lock()
			seen = append(seen, locks)
			mu.Unlock()
			msg.Value.Accounts[0] = "account:scribbled"
			msg.Value.Accounts = append(msg.Value.Accounts[:1], "account:appended")
			return nil
		},
		handler.WithLockKeys(func(a accounts) []string { return a.Accounts }))
	e, _ := newFormExecutor(t, h)
	its := make([]apply.Item, 2)
	for i, a := range []accounts{{ID: "a", Accounts: []string{"account:1", "account:2"}}, {ID: "b", Accounts: []string{"account:3"}}} {
		v, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		its[i] = apply.Item{Attempt: 1, Record: handler.Record{Topic: "accounts", Offset: int64(i), Value: v}}
	}
	res, herr, err := e.Run(ctx, its)
	if err != nil || herr == nil || herr.Index != 1 || len(res) != 1 || res[0].Outcome != dedupe.Applied {
		t.Fatalf("results %v, handler error %v, error %v; want a applied and b failed", res, herr, err)
	}
	lockOf := func(keys ...string) []int64 {
		var out []int64
		for _, k := range keys {
			out = append(out, apply.LockKey(k))
		}
		slices.Sort(out)
		return out
	}
	want := [][]int64{lockOf("account:1", "account:2", "account:3"), lockOf("account:1", "account:2")}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Errorf("a's runs held locks %v, want %v (its run with b's, then its replay alone; the scribbled key is %d)",
			seen, want, apply.LockKey("account:scribbled"))
	}
}
