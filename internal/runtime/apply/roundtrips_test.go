package apply_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
	"github.com/exactly-go/exactly/outbox"
)

// sends counts what a connection sends to the server: single statements
// (each a round trip) and batches (one round trip each). The relay's wake
// (a pg_notify sent after COMMIT, outside the batch's transaction, on
// another connection) is counted apart: it is not part of the batch.
type sends struct{ queries, batches, notifies atomic.Int64 }

func (s *sends) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pg_notify") {
		s.notifies.Add(1)
		return ctx
	}
	s.queries.Add(1)
	return ctx
}
func (s *sends) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (s *sends) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	s.batches.Add(1)
	return ctx
}
func (s *sends) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (s *sends) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// A batch of 100 fresh records costs two round trips with the pipelined and
// set-based forms (BEGIN + lock keys + claim; queued statements + outbox
// rows + counters + COMMIT), and two plus one per handler statement with
// the tx form: the counters, the outbox rows and COMMIT never cost a round
// trip of their own, except after checked statements: a pipelined handler
// that checks a result (QueueCheck) costs exactly one more round trip per
// batch, COMMIT sent alone once the checks passed.
func TestBatchRoundTrips(t *testing.T) {
	insert := `insert into entries (id, amount) values ($1, $2)`
	event := func(m handler.Message[entry]) outbox.Message {
		return outbox.Message{Topic: "entered", Key: []byte(m.Value.ID), Value: m.Record.Value}
	}
	lockKeys := handler.WithLockKeys(func(e entry) []string { return []string{"account:" + e.ID} })
	for _, c := range []struct {
		name             string
		h                handler.Any
		queries, batches int64
	}{
		{"tx", handler.New("entry", handler.FromPayload(entryKey), func(ctx context.Context, tx pgx.Tx, m handler.Message[entry]) error {
			if _, err := tx.Exec(ctx, insert, m.Value.ID, m.Value.Amount); err != nil {
				return err
			}
			return outbox.Add(ctx, tx, event(m))
		}, lockKeys), 100, 2},
		{"pipelined", handler.NewPipelined("entry", handler.FromPayload(entryKey), func(ctx context.Context, q handler.Queue, m handler.Message[entry]) error {
			q.Queue(insert, m.Value.ID, m.Value.Amount)
			return outbox.Add(ctx, q.Tx(), event(m))
		}, lockKeys), 0, 2},
		{"pipelined checked", handler.NewPipelined("entry", handler.FromPayload(entryKey), func(ctx context.Context, q handler.Queue, m handler.Message[entry]) error {
			q.QueueCheck(handler.RowsAffected(1), insert, m.Value.ID, m.Value.Amount)
			return outbox.Add(ctx, q.Tx(), event(m))
		}, lockKeys), 1, 2},
		{"set", handler.NewSet("entry", handler.FromPayload(entryKey), func(ctx context.Context, tx pgx.Tx, msgs []handler.Message[entry]) error {
			ids, amounts := make([]string, len(msgs)), make([]int64, len(msgs))
			for i, m := range msgs {
				ids[i], amounts[i] = m.Value.ID, m.Value.Amount
				if err := outbox.Add(ctx, tx, event(m)); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `insert into entries (id, amount) select * from unnest($1::text[], $2::bigint[])`, ids, amounts)
			return err
		}), 1, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			_, setup := newFormExecutor(t, c.h) // migrates the test's database
			cfg, err := pgxpool.ParseConfig(setup.Config().ConnString())
			if err != nil {
				t.Fatal(err)
			}
			s := &sends{}
			cfg.ConnConfig.Tracer = s
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			e := &apply.Executor{Pool: pool, Guard: dedupe.New(), Handler: c.h}
			res, herr, err := e.Run(ctx, entries(t, 100, -1, 1))
			if err != nil || herr != nil || len(res) != 100 {
				t.Fatalf("%d results, handler error %v, error %v", len(res), herr, err)
			}
			if q, b := s.queries.Load(), s.batches.Load(); q != c.queries || b != c.batches {
				t.Errorf("%d statements and %d batches sent, want %d and %d", q, b, c.queries, c.batches)
			}
			if n := s.notifies.Load(); n > 1 {
				t.Errorf("%d wake notifications for one batch, want at most 1", n)
			}
			var rows, events, counterRows int64
			if err := setup.QueryRow(ctx, `select (select count(*) from entries), (select count(*) from exactly_outbox),
				(select count(*) from exactly_guard_outcomes)`).Scan(&rows, &events, &counterRows); err != nil {
				t.Fatal(err)
			}
			counted, err := e.Guard.Outcomes(ctx, setup, c.h.Scope())
			if err != nil {
				t.Fatal(err)
			}
			if rows != 100 || events != 100 || counted.Applied != 100 {
				t.Errorf("%d entries, %d outbox rows, %d counted applied; want 100 of each", rows, events, counted.Applied)
			}
			// Every record was applied and claimed: the guard rows count
			// them, and no counter row is written.
			if counterRows != 0 {
				t.Errorf("%d outcome counter rows for a batch of applied records, want 0", counterRows)
			}
		})
	}
}
