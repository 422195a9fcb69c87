package apply_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
	"github.com/exactly-go/exactly/outbox"
)

// drive runs items through e as the consumer does: the committed prefix is
// done, a failed record's attempt is counted, and the rest is run again,
// until every record has an outcome. It fails t on an infrastructure error
// or after 50 runs.
func drive(t *testing.T, e *apply.Executor, items []apply.Item) []apply.Result {
	t.Helper()
	return driveWithin(t, e, items, 0)
}

// driveWithin is drive with each run bounded by deadline (0: none), as the
// consumer bounds its batches.
func driveWithin(t *testing.T, e *apply.Executor, items []apply.Item, deadline time.Duration) []apply.Result {
	t.Helper()
	var out []apply.Result
	for run := 0; len(items) > 0; run++ {
		if run == 50 {
			t.Fatalf("%d records still without an outcome after 50 runs", len(items))
		}
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if deadline > 0 {
			ctx, cancel = context.WithTimeout(ctx, deadline)
		}
		res, herr, err := e.Run(ctx, items)
		cancel()
		if err != nil {
			t.Fatalf("run %d: %v (want records' failures, not an outage)", run, err)
		}
		out = append(out, res...)
		items = items[len(res):]
		if herr != nil {
			items[herr.Index-len(res)].Attempt++
		}
	}
	return out
}

// createLate creates the table late, whose rows a constraint trigger
// deferred to COMMIT checks: a negative amount fails COMMIT with a check
// violation naming the row's id.
func createLate(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `create table late (id text primary key, amount bigint not null);
		create function late_check() returns trigger language plpgsql as $$
		begin
			if new.amount < 0 then
				raise exception 'negative amount for %', new.id using errcode = 'check_violation';
			end if;
			return null;
		end $$;
		create constraint trigger late_check after insert on late deferrable initially deferred
			for each row execute function late_check()`); err != nil {
		t.Fatal(err)
	}
}

// A check deferred to COMMIT (a deferrable constraint trigger) rejects the
// writes of one record of ten: shorter prefixes find it; it alone is
// retried, then dead-lettered with a reason naming COMMIT and the check's
// error; the other nine commit. The same holds for a pipelined handler
// whose statement is checked (QueueCheck), whose COMMIT goes alone after
// the checks.
func TestDeferredCheckFailsOnlyItsRecord(t *testing.T) {
	const insert = `insert into late (id, amount) values ($1, $2)`
	for _, c := range []struct {
		name string
		h    handler.Any
	}{
		{"tx", handler.New("entry", handler.FromPayload(entryKey),
			func(ctx context.Context, tx pgx.Tx, msg handler.Message[entry]) error {
				_, err := tx.Exec(ctx, insert, msg.Value.ID, msg.Value.Amount)
				return err
			})},
		{"pipelined checked", handler.NewPipelined("entry", handler.FromPayload(entryKey),
			func(_ context.Context, q handler.Queue, msg handler.Message[entry]) error {
				q.QueueCheck(handler.RowsAffected(1), insert, msg.Value.ID, msg.Value.Amount)
				return nil
			})},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, pool := newFormExecutor(t, c.h)
			createLate(t, pool)
			res := drive(t, e, entries(t, 10, 6, 1))
			for i, r := range res {
				want := dedupe.Applied
				if i == 6 {
					want = dedupe.DeadLettered
				}
				if r.Outcome != want {
					t.Errorf("record %d: %s (%v), want %s", i, r.Outcome, r.Reason, want)
				}
			}
			var dwe *apply.DeferredWriteError
			if len(res) != 10 || !errors.As(res[6].Reason, &dwe) || dwe.SQL != "commit" || !strings.Contains(res[6].Reason.Error(), "negative amount for e006") {
				t.Fatalf("results %+v, want record 6 dead-lettered with a *DeferredWriteError naming COMMIT and the check's error", res)
			}
			var rows int
			if err := pool.QueryRow(context.Background(), `select count(*) from late`).Scan(&rows); err != nil || rows != 9 {
				t.Errorf("%d rows (%v), want 9", rows, err)
			}
		})
	}
}

// A record whose dead letter itself is rejected (a trigger on the outbox
// table refuses its value) cannot be blamed for the failure as a handler's
// would be: the batch fails as a transaction, naming the statement and the
// record, instead of looping or dropping the record.
func TestRejectedDeadLetterIsNotARecordFailure(t *testing.T) {
	ctx := context.Background()
	h := handler.New("entry", handler.FromPayload(entryKey),
		func(context.Context, pgx.Tx, handler.Message[entry]) error {
			return handler.Permanent(errors.New("no such account"))
		})
	e, pool := newFormExecutor(t, h)
	e.DeadLetter = outbox.DeadLetters(nil, "")
	if _, err := pool.Exec(ctx, `create function reject_all() returns trigger language plpgsql as $$
		begin
			raise exception 'no dead letters here' using errcode = 'check_violation';
		end $$;
		create trigger reject_all before insert on exactly_outbox for each row execute function reject_all()`); err != nil {
		t.Fatal(err)
	}
	res, herr, err := e.Run(ctx, entries(t, 1, -1, 1))
	if err == nil || herr != nil || len(res) != 0 || !strings.Contains(err.Error(), "exactly_outbox") ||
		!strings.Contains(err.Error(), "dead_lettered") || !strings.Contains(err.Error(), "no dead letters here") {
		t.Fatalf("%d results, handler error %v, error %v; want the batch failed, naming the outbox statement and the dead-lettered record", len(res), herr, err)
	}
}

// The batch's outbox rows failing for a reason that is no record's doing
// (the outbox table dropped, or locked past the role's lock_timeout by an
// operator's maintenance) is an outage: the batch fails as a transaction
// and nothing commits. Blaming the first record instead would charge it an
// attempt per pass and, at its last attempt, dead-letter a healthy record
// (here through the dead table, which still works).
func TestOutboxOutageIsNotARecordFailure(t *testing.T) {
	h := handler.New("entry", handler.FromPayload(entryKey),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[entry]) error {
			return outbox.Add(ctx, tx, outbox.Message{Topic: "entered", Key: []byte(msg.Value.ID), Value: msg.Record.Value})
		})
	for _, tc := range []struct {
		name    string
		breakIt func(t *testing.T, pool *pgxpool.Pool)
		code    string
	}{
		{"table dropped", func(t *testing.T, pool *pgxpool.Pool) {
			if _, err := pool.Exec(context.Background(), `drop table exactly_outbox`); err != nil {
				t.Fatal(err)
			}
		}, "42P01"},
		{"table locked past lock_timeout", func(t *testing.T, pool *pgxpool.Pool) {
			ctx := context.Background()
			if _, err := pool.Exec(ctx, `do $$ begin execute format('alter database %I set lock_timeout = 100', current_database()); end $$`); err != nil {
				t.Fatal(err)
			}
			pool.Reset() // new connections take the setting
			locker, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { locker.Rollback(context.Background()) }) //nolint:errcheck // test cleanup
			if _, err := locker.Exec(ctx, `lock table exactly_outbox in access exclusive mode`); err != nil {
				t.Fatal(err)
			}
		}, "55P03"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			e, pool := newFormExecutor(t, h)
			tc.breakIt(t, pool)
			// The records' last attempt: a record failed now is dead-lettered.
			res, herr, err := e.Run(ctx, entries(t, 4, -1, 3))
			var pgErr *pgconn.PgError
			if err == nil || herr != nil || len(res) != 0 || !errors.As(err, &pgErr) || pgErr.Code != tc.code {
				t.Fatalf("%d results %+v, handler error %v, error %v; want the batch failed as an outage (%s), nothing committed", len(res), res, herr, err, tc.code)
			}
			var dead int
			if err := pool.QueryRow(ctx, `select count(*) from dead`).Scan(&dead); err != nil || dead != 0 {
				t.Fatalf("%d records dead-lettered (%v), want 0", dead, err)
			}
		})
	}
}
