package apply_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

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
	var out []apply.Result
	for run := 0; len(items) > 0; run++ {
		if run == 50 {
			t.Fatalf("%d records still without an outcome after 50 runs", len(items))
		}
		res, herr, err := e.Run(context.Background(), items)
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

// A check deferred to COMMIT (a deferrable constraint trigger) rejects the
// writes of one record of ten: shorter prefixes find it; it alone is
// retried, then dead-lettered with a reason naming COMMIT and the check's
// error; the other nine commit.
func TestDeferredCheckFailsOnlyItsRecord(t *testing.T) {
	ctx := context.Background()
	h := handler.New("entry", handler.FromPayload(entryKey),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[entry]) error {
			_, err := tx.Exec(ctx, `insert into late (id, amount) values ($1, $2)`, msg.Value.ID, msg.Value.Amount)
			return err
		})
	e, pool := newFormExecutor(t, h)
	if _, err := pool.Exec(ctx, `create table late (id text primary key, amount bigint not null);
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
	if !errors.As(res[6].Reason, &dwe) || dwe.SQL != "commit" || !strings.Contains(res[6].Reason.Error(), "negative amount for e006") {
		t.Errorf("reason %v, want a *DeferredWriteError naming COMMIT and the check's error", res[6].Reason)
	}
	var rows int
	if err := pool.QueryRow(ctx, `select count(*) from late`).Scan(&rows); err != nil || rows != 9 {
		t.Errorf("%d rows (%v), want 9", rows, err)
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
