package handlertest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/handlertest"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type avatar struct {
	UserID int64  `json:"user_id"`
	URL    string `json:"url"`
}

func avatars(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `create table profiles(user_id bigint primary key, avatar_url text not null)`); err != nil {
		t.Fatal(err)
	}
}

func snapshot(ctx context.Context, pool *pgxpool.Pool) (any, error) {
	rows, err := pool.Query(ctx, `select user_id, avatar_url from profiles order by user_id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[avatar])
}

var values = []avatar{{1, "a.png"}, {2, "b.png"}, {3, "c.png"}}

// An upsert by natural key is naturally idempotent: two runs leave the
// state of one.
func TestNaturallyIdempotentUpsertTwiceEqualsOnce(t *testing.T) {
	pool := testenv.DB(t)
	avatars(t, pool)
	h := handler.New("set-avatar", handler.FromPayload(func(a avatar) string { return dedupe.Key("avatar", a.UserID, a.URL) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[avatar]) error {
			_, err := tx.Exec(ctx, `insert into profiles(user_id, avatar_url) values ($1, $2)
				on conflict (user_id) do update set avatar_url = excluded.avatar_url`, msg.Value.UserID, msg.Value.URL)
			return err
		}, handler.NaturallyIdempotent())
	handlertest.AssertIdempotent(context.Background(), t, pool, h, snapshot, values...)
}

// The check fails a handler that is not idempotent (an append declared
// idempotent): two runs double the rows.
func TestAssertIdempotentCatchesAnAppend(t *testing.T) {
	pool := testenv.DB(t)
	if _, err := pool.Exec(context.Background(), `create table profiles(id bigserial, user_id bigint, avatar_url text)`); err != nil {
		t.Fatal(err)
	}
	h := handler.New("append-avatar", handler.FromPayload(func(a avatar) string { return dedupe.Key("avatar", a.UserID) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[avatar]) error {
			_, err := tx.Exec(ctx, `insert into profiles(user_id, avatar_url) values ($1, $2)`, msg.Value.UserID, msg.Value.URL)
			return err
		}, handler.NaturallyIdempotent())
	ft := &fakeT{TB: t}
	handlertest.AssertIdempotent(context.Background(), ft, pool, h, func(ctx context.Context, pool *pgxpool.Pool) (any, error) {
		var n int
		err := pool.QueryRow(ctx, `select count(*) from profiles`).Scan(&n)
		return n, err
	}, values...)
	if !ft.failed.Load() {
		t.Error("AssertIdempotent passed an appending handler")
	}
}

// A first delivery that rolls back leaves the key unclaimed: the next one
// applies.
func TestFirstDeliveryRollsBackSecondApplies(t *testing.T) {
	pool := testenv.DB(t)
	avatars(t, pool)
	var calls atomic.Int32
	h := handler.New("set-avatar", handler.FromPayload(func(a avatar) string { return dedupe.Key("avatar", a.UserID) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[avatar]) error {
			if _, err := tx.Exec(ctx, `insert into profiles(user_id, avatar_url) values ($1, $2)`, msg.Value.UserID, msg.Value.URL); err != nil {
				return err
			}
			if calls.Add(1) == 1 {
				return errors.New("crash before commit")
			}
			return nil
		})
	rep := handlertest.Deliver(context.Background(), t, pool, h, handlertest.Delivery{Copies: 2, Sequential: true}, values[0])
	if rep.Applied != 1 || len(rep.Errors) != 1 || rep.Duplicates != 0 {
		t.Fatalf("applied %d, duplicates %d, errors %v; want the first to fail and the second to apply", rep.Applied, rep.Duplicates, rep.Errors)
	}
	var n int
	if err := pool.QueryRow(context.Background(), `select count(*) from profiles`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d profile rows (%v), want 1", n, err)
	}
}

// fakeT records failures instead of failing the real test.
type fakeT struct {
	testing.TB
	failed atomic.Bool
}

func (f *fakeT) Errorf(string, ...any) { f.failed.Store(true) }
func (f *fakeT) Fatalf(string, ...any) { f.failed.Store(true) }
func (f *fakeT) Helper()               {}

// recorder is a handlertest.TB that records failures instead of failing
// the test, so a test can check that an assertion fails.
type recorder struct{ failures []string }

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
	runtime.Goexit()
}

// run calls fn with r on its own goroutine, as testing does, so Fatalf can
// stop it.
func (r *recorder) run(fn func(handlertest.TB)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
}

// RequireOutboxed returns the one row of a topic (and key) with its value
// decoded; it fails when there are none or two, naming the count.
func TestRequireOutboxed(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	type event struct {
		N int `json:"n"`
	}
	emit := handler.New("emit", handler.FromPayload(func(e event) string { return strconv.Itoa(e.N) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[event]) error {
			return outbox.AddJSON(ctx, tx, "events", []byte("k"+strconv.Itoa(msg.Value.N%2)), msg.Value,
				handler.Header{Key: "h", Value: []byte("v")})
		})
	rep := handlertest.Deliver(ctx, t, pool, emit, handlertest.Delivery{Copies: 2}, event{1}, event{2}, event{3})
	handlertest.AssertOneEffectPerKey(t, rep)

	got := handlertest.RequireOutboxed[event](ctx, t, pool, "events", &handlertest.OutboxOpts{Key: []byte("k0")})
	if got.Value.N != 2 || string(got.Key) != "k0" || got.Topic != "events" {
		t.Errorf("RequireOutboxed = %+v, want event 2 keyed k0", got)
	}
	var hv string
	for _, h := range got.Headers {
		if h.Key == "h" {
			hv = string(h.Value)
		}
	}
	if hv != "v" {
		t.Errorf("headers %v lack h=v", got.Headers)
	}
	handlertest.RequireOutboxCount(ctx, t, pool, "events", 3, nil)
	handlertest.RequireOutboxCount(ctx, t, pool, "other", 0, nil)

	var r recorder
	r.run(func(tb handlertest.TB) {
		handlertest.RequireOutboxed[event](ctx, tb, pool, "events", &handlertest.OutboxOpts{Key: []byte("k1")}) // events 1 and 3
	})
	r.run(func(tb handlertest.TB) { handlertest.RequireOutboxCount(ctx, tb, pool, "events", 2, nil) })
	r.run(func(tb handlertest.TB) { handlertest.RequireOutboxed[event](ctx, tb, pool, "missing", nil) })
	if len(r.failures) != 3 || !strings.Contains(r.failures[0], `2 outbox rows for topic "events" and key "k1", want exactly one`) ||
		!strings.Contains(r.failures[1], "3 outbox rows") || !strings.Contains(r.failures[2], "0 outbox rows") {
		t.Errorf("failures %q, want the three wrong counts named", r.failures)
	}
}
