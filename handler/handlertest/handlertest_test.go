package handlertest_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/handlertest"
	"github.com/exactly-go/exactly/internal/tools/testenv"
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
	handlertest.AssertIdempotent(t, pool, h, snapshot, values...)
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
	handlertest.AssertIdempotent(ft, pool, h, func(ctx context.Context, pool *pgxpool.Pool) (any, error) {
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
	rep := handlertest.Deliver(t, pool, h, handlertest.Delivery{Copies: 2, Sequential: true}, values[0])
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
