package apply_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
	"github.com/exactly-go/exactly/internal/testenv"
)

type tagged struct {
	ID   string            `json:"id"`
	Tags []string          `json:"tags"`
	Meta map[string]string `json:"meta"`
	Fail bool              `json:"fail"`
}

// newTaggedExecutor migrates a fresh database and returns an executor over
// fn, with a dead-letter function that records reasons in "dead".
func newTaggedExecutor(t *testing.T, fn handler.Func[tagged]) *apply.Executor {
	t.Helper()
	ctx := context.Background()
	pool := testenv.DB(t)
	guard := dedupe.New()
	if err := guard.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `create table effects (id text primary key); create table dead (id text not null, attempts int not null, reason text not null)`); err != nil {
		t.Fatal(err)
	}
	h := handler.New("t", handler.FromPayload(func(c tagged) string { return c.ID }), fn)
	return &apply.Executor{Pool: pool, Guard: guard, Handler: h, MaxAttempts: 3,
		DeadLetter: func(ctx context.Context, tx pgx.Tx, rec handler.Record, _ string, attempts int, reason error) error {
			var v tagged
			_ = json.Unmarshal(rec.Value, &v)
			_, err := tx.Exec(ctx, `insert into dead (id, attempts, reason) values ($1, $2, $3)`, v.ID, attempts, reason.Error())
			return err
		}}
}

func taggedItems(t *testing.T, attempt int, vs ...tagged) []apply.Item {
	t.Helper()
	out := make([]apply.Item, len(vs))
	for i, v := range vs {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = apply.Item{Record: handler.Record{Topic: "t", Offset: int64(i), Value: b}, Attempt: attempt}
	}
	return out
}

// A handler that mutates its value (a slice, a map in it) and runs again
// when the batch is replayed after a later record failed sees the record
// as it was, not its own change.
func TestReplayDecodesAfresh(t *testing.T) {
	var seen []string
	e := newTaggedExecutor(t, func(ctx context.Context, tx pgx.Tx, msg handler.Message[tagged]) error {
		if msg.Value.Fail {
			return errors.New("fails")
		}
		seen = append(seen, strings.Join(msg.Value.Tags, ",")+"/"+msg.Value.Meta["k"])
		msg.Value.Tags[0] = "mutated"
		msg.Value.Tags = append(msg.Value.Tags, "appended")
		msg.Value.Meta["k"] = "mutated"
		msg.Value.Meta["extra"] = "x"
		_, err := tx.Exec(ctx, `insert into effects (id) values ($1)`, msg.Value.ID)
		return err
	})
	res, herr, err := e.Run(context.Background(), taggedItems(t, 1,
		tagged{ID: "a", Tags: []string{"x", "y"}, Meta: map[string]string{"k": "v"}}, tagged{ID: "b", Fail: true}))
	if err != nil || herr == nil || herr.Index != 1 || len(res) != 1 || res[0].Outcome != dedupe.Applied {
		t.Fatalf("results %v, handler error %v, error %v; want a applied and b failed", res, herr, err)
	}
	if strings.Join(seen, " ") != "x,y/v x,y/v" {
		t.Errorf("the handler of a saw %q over its run and replay, want the record's value both times", seen)
	}
}

// A handler that swallows a statement's error returns nil with its
// transaction aborted: that is its record's failure (an *AbortedTxError
// saying so), and the records before it commit.
func TestAbortedTransactionFailsItsRecord(t *testing.T) {
	e := newTaggedExecutor(t, func(ctx context.Context, tx pgx.Tx, msg handler.Message[tagged]) error {
		_, err := tx.Exec(ctx, `insert into effects (id) values ($1)`, strings.TrimSuffix(msg.Value.ID, "-again"))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			return nil
		}
		return err
	})
	res, herr, err := e.Run(context.Background(), taggedItems(t, 1, tagged{ID: "a"}, tagged{ID: "a-again"}, tagged{ID: "c"}))
	if err != nil {
		t.Fatalf("error %v: an aborted transaction must not count as an outage", err)
	}
	var aborted *handler.AbortedTxError
	if herr == nil || herr.Index != 1 || !errors.As(herr, &aborted) || len(res) != 1 {
		t.Fatalf("results %v, handler error %v; want a applied and a-again failed with *AbortedTxError", res, herr)
	}
	if !strings.Contains(herr.Error(), "returned nil but its transaction was aborted") {
		t.Errorf("error %q does not say what happened", herr)
	}
	// At its last attempt it is dead-lettered and c is applied.
	res, herr, err = e.Run(context.Background(), taggedItems(t, 3, tagged{ID: "a-again"}, tagged{ID: "c"})[0:2])
	if err != nil || herr != nil || len(res) != 2 || res[0].Outcome != dedupe.DeadLettered || res[1].Outcome != dedupe.Applied {
		t.Fatalf("last attempt: results %v, handler error %v, error %v", res, herr, err)
	}
}

// A handler overrunning the batch deadline is an attempt of its record
// (a *HandlerError at its index), not an outage; once its attempts are
// exhausted, the record is dead-lettered without running again, with the
// number of attempts it had.
func TestDeadlineOverrunIsAnAttempt(t *testing.T) {
	var slowRuns int
	e := newTaggedExecutor(t, func(ctx context.Context, tx pgx.Tx, msg handler.Message[tagged]) error {
		if msg.Value.ID == "slow" {
			slowRuns++
			<-ctx.Done()
			return ctx.Err()
		}
		_, err := tx.Exec(ctx, `insert into effects (id) values ($1)`, msg.Value.ID)
		return err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	its := taggedItems(t, 3, tagged{ID: "a"}, tagged{ID: "slow"}, tagged{ID: "c"})
	res, herr, err := e.Run(ctx, its)
	if err != nil || herr == nil || herr.Index != 1 || len(res) != 0 {
		t.Fatalf("results %v, handler error %v, error %v; want the overrun as a handler error at index 1", res, herr, err)
	}
	its[0].Attempt, its[1].Attempt, its[1].Exhausted = 1, 4, herr.Err
	res, herr, err = e.Run(context.Background(), its)
	if err != nil || herr != nil || len(res) != 3 || res[1].Outcome != dedupe.DeadLettered {
		t.Fatalf("results %v, handler error %v, error %v; want slow dead-lettered", res, herr, err)
	}
	if slowRuns != 1 {
		t.Errorf("the slow handler ran %d times, want 1", slowRuns)
	}
	var attempts int
	var reason string
	if err := e.Pool.QueryRow(context.Background(), `select attempts, reason from dead where id = 'slow'`).Scan(&attempts, &reason); err != nil ||
		attempts != 3 || !strings.Contains(reason, "did not finish within the batch deadline") {
		t.Errorf("dead letter: %d attempts, reason %q (%v); want 3 and the deadline", attempts, reason, err)
	}
}

// handler.Permanent dead-letters at once, whatever attempts are left.
func TestPermanentDeadLettersAtOnce(t *testing.T) {
	e := newTaggedExecutor(t, func(ctx context.Context, tx pgx.Tx, msg handler.Message[tagged]) error {
		if msg.Value.Fail {
			return handler.Permanent(errors.New("no such account"))
		}
		_, err := tx.Exec(ctx, `insert into effects (id) values ($1)`, msg.Value.ID)
		return err
	})
	res, herr, err := e.Run(context.Background(), taggedItems(t, 1, tagged{ID: "a"}, tagged{ID: "b", Fail: true}, tagged{ID: "c"}))
	if err != nil || herr != nil || len(res) != 3 || res[1].Outcome != dedupe.DeadLettered {
		t.Fatalf("results %v, handler error %v, error %v; want b dead-lettered at its first attempt", res, herr, err)
	}
	var pe *handler.PermanentError
	if !errors.As(res[1].Reason, &pe) {
		t.Errorf("reason %v is not a *handler.PermanentError", res[1].Reason)
	}
}

// Only the database's own failures are outages; errors a handler provokes
// with its own statements are failures of its record.
func TestOnlyDatabaseFailuresAreTransient(t *testing.T) {
	for code, want := range map[string]bool{
		"40001": true, "40P01": true, "57P01": true, "57P02": true, "57P03": true, "08006": true, "53300": true,
		"23505": false, "25P02": false, "55P03": false, "57014": false, "42P01": false, "55006": false,
	} {
		if got := apply.IsTransient(&pgconn.PgError{Code: code}); got != want {
			t.Errorf("IsTransient(%s) = %v, want %v", code, got, want)
		}
	}
}
