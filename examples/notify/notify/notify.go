// Package notify consumes account-credited events with exactly, keyed by
// the message-id header the outbox relay sets, and records one notification
// per credit even when the relay publishes an event more than once.
package notify

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
)

// MessageIDHeader is the header the outbox relay sets on every record, stable
// across republishes.
const MessageIDHeader = "message-id"

// Credited is the account-credited event as this service reads it
// (examples/credit publishes it). A consumer declares its own view of the
// events it reads rather than importing the producer's package.
type Credited struct {
	OrderID string `json:"order_id"`
	Account int64  `json:"account"`
	Amount  int64  `json:"amount"`
}

// Service holds the notifications table.
type Service struct {
	table pgx.Identifier
}

// New returns the service writing to table (schema may be "") — default
// "notifications" when name is "".
func New(schema, name string) *Service {
	if name == "" {
		name = "notifications"
	}
	if schema == "" {
		return &Service{table: pgx.Identifier{name}}
	}
	return &Service{table: pgx.Identifier{schema, name}}
}

// Table returns the notifications table.
func (s *Service) Table() pgx.Identifier { return s.table }

// Migrate creates the notifications table and the guard table. It is
// idempotent, safe when several instances start at once, and fails with
// the wrapped database error.
func (s *Service) Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	// Two concurrent "create table if not exists" of one table can both
	// miss it and collide in the catalog (duplicate key in pg_type): the
	// DDL runs in one transaction holding an advisory lock, so a second
	// instance waits and then finds the table.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `select pg_advisory_xact_lock(hashtext('exactly example notify: schema'))`); err != nil {
			return fmt.Errorf("locking the notifications schema: %w", err)
		}
		if len(s.table) == 2 {
			if _, err := tx.Exec(ctx, `create schema if not exists `+pgx.Identifier{s.table[0]}.Sanitize()); err != nil {
				return fmt.Errorf("creating notifications schema: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, `create table if not exists `+s.table.Sanitize()+` (
			id         bigserial primary key,
			message_id text        not null,
			order_id   text        not null,
			account    bigint      not null,
			amount     bigint      not null,
			created_at timestamptz not null default now()
		)`); err != nil {
			return fmt.Errorf("creating notifications table: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return dedupe.Migrate(ctx, pool)
}

// Handler returns the guarded handler "notify", keyed by the message-id
// header: a republished event carries the same id and is skipped.
func (s *Service) Handler() *handler.Handler[Credited] {
	return handler.New("notify", handler.FromHeader[Credited](MessageIDHeader),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[Credited]) error {
			_, err := tx.Exec(ctx, `insert into `+s.table.Sanitize()+` (message_id, order_id, account, amount) values ($1, $2, $3, $4)`,
				msg.Key, msg.Value.OrderID, msg.Value.Account, msg.Value.Amount)
			if err != nil {
				return fmt.Errorf("recording notification for order %s: %w", msg.Value.OrderID, err)
			}
			return nil
		})
}
