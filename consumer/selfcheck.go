package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
	"github.com/exactly-go/exactly/internal/runtime/deferred"
	"github.com/exactly-go/exactly/internal/runtime/pgarray"
	"github.com/exactly-go/exactly/outbox"
)

// StatementError reports that the pool's connections cannot send the
// statements every batch sends: their parameters cannot be encoded in the
// pool's query exec mode (a codec registered on the connections' type map
// that refuses them), or the mode prepares statements a transaction-mode
// pooler does not keep. It is a configuration error, found by Run before it
// joins the group, instead of every batch failing and being retried as if
// the database were down. Fix the pool's configuration (see "Poolers and
// connection limits" in docs/configuration.md).
type StatementError struct {
	// Statement names the statement that failed: "claim" (the guard's
	// claim of a batch's records), "mark dead-lettered" or "outbox rows".
	Statement string
	// Mode is the pool's default query exec mode, as pgx names it.
	Mode string
	// Err is pgx's or the server's error.
	Err error
}

func (e *StatementError) Error() string {
	hint := ""
	var pgErr *pgconn.PgError
	if errors.As(e.Err, &pgErr) && preparedCode(pgErr.Code) {
		hint = "; behind a transaction-mode pooler (PgBouncer) use default_query_exec_mode=exec or simple_protocol"
	}
	return fmt.Sprintf("consumer: the pool's connections (query exec mode %s) cannot send the %s statement every batch sends, so no record could be consumed: %v%s",
		e.Mode, e.Statement, e.Err, hint)
}

func (e *StatementError) Unwrap() error { return e.Err }

// preparedCode reports the errors of a connection whose prepared
// statements vanish or collide: another client's session behind a
// transaction-mode pooler (42P05 duplicate_prepared_statement, 26000
// invalid_sql_statement_name).
func preparedCode(code string) bool { return code == "42P05" || code == "26000" }

// checkTimeout bounds the start's check of the statements, so a lock wait
// or a slow database does not keep Run from joining the group.
const checkTimeout = 5 * time.Second

// checkStatements runs, in a transaction it rolls back, the statements of
// exactly's own that every batch sends with its array parameters (the
// claim of one and of several records, a dead-letter mark, the outbox's
// rows when the consumer writes to an outbox), on a connection readied as a
// batch's is, bounded by checkTimeout. It returns a [*StatementError] when
// one cannot be sent: an encoding error (all of it runs on one server
// connection, so a prepared statement lost between transactions behind a
// pooler does not show here). Any other failure (the database unreachable,
// a lock wait past the bound) is not the
// statements' fault and returns a plain error, which Run logs and moves on
// from: batches are then retried until the database is back.
func (c *Consumer) checkStatements(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquiring a connection: %w", err)
	}
	defer conn.Release()
	pgarray.Use(conn.Conn())
	mode := conn.Conn().Config().DefaultQueryExecMode.String()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("beginning the transaction: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // rolled back whatever happened
	var rnd [8]byte
	_, _ = rand.Read(rnd[:]) // never fails
	key := "exactly-self-check:" + hex.EncodeToString(rnd[:])
	topic := "exactly-self-check"
	if len(c.topics) > 0 {
		topic = c.topics[0]
	}
	claim := func(i int) dedupe.RecordClaim {
		return dedupe.RecordClaim{Scope: "exactly-self-check", Key: fmt.Sprintf("%s/%d", key, i), Topic: topic,
			Partition: 0, Offset: int64(i), TraceID: "0af7651916cd43dd8448eb211c80319c", Handler: "exactly-self-check"}
	}
	failed := func(statement string, err error) error {
		if err == nil {
			return nil
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && preparedCode(pgErr.Code) || !errors.As(err, &pgErr) && !apply.IsTransient(err) && ctx.Err() == nil {
			return &StatementError{Statement: statement, Mode: mode, Err: err}
		}
		return fmt.Errorf("checking the %s statement: %w", statement, err)
	}
	if _, err := c.guard.ClaimRecords(ctx, tx, []dedupe.RecordClaim{claim(0), claim(1)}); err != nil {
		return failed("claim", err)
	}
	if _, err := c.guard.ClaimRecords(ctx, tx, []dedupe.RecordClaim{claim(2)}); err != nil {
		return failed("claim", err)
	}
	if err := c.guard.MarkDeadLettered(ctx, tx, claim(3)); err != nil {
		return failed("mark dead-lettered", err)
	}
	if c.outbox != nil {
		buf := deferred.New(tx)
		bctx := deferred.With(ctx, buf)
		for i := range 2 {
			msg := outbox.Message{Topic: topic, Key: []byte(key), Value: []byte("{}"),
				Headers: []handler.Header{{Key: "exactly-self-check", Value: []byte{byte(i)}}}}
			if i == 1 {
				msg.Key, msg.Headers = nil, nil
			}
			if err := c.outbox.Add(bctx, tx, msg); err != nil {
				return failed("outbox rows", err)
			}
		}
		if err := buf.Flush(ctx); err != nil {
			return failed("outbox rows", err)
		}
	}
	return nil
}
