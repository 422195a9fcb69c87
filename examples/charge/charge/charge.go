// Package charge is the charge_order job of Making Background Jobs
// Idempotent as an exactly handler: a
// charge command charges an order through a payment provider's API and
// stores the charge id in the charges table, in one transaction with the
// guard row keyed "charge:<order id>". The provider cannot be part of that
// transaction, so the handler passes the key as the provider's
// Idempotency-Key: a worker that dies after the charge and before COMMIT
// is followed by one that gets the original charge back, not a second one.
// The handler declares its call once (handler.NewWithCall): the consumer
// makes it before the record's transaction, holding no database
// connection while the provider answers, and the transaction records the
// charge and stores its id.
//
// Refunds go through the provider's legacy endpoint, which has no
// idempotency keys, with the started/done state machine and a reconcile
// function that looks the refund up by its reference
// (dedupe.Effects.CallReconciled).
package charge

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/examples/charge/payments"
	"github.com/exactly-go/exactly/handler"
)

// Topics of the service.
const (
	// CommandsTopic carries charge commands.
	CommandsTopic = "charge-commands"
	// RefundsTopic carries refund commands.
	RefundsTopic = "refund-commands"
)

// Command charges Amount (in cents) for order OrderID, once however often
// it is sent or delivered.
type Command struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

// RefundCommand refunds Amount of the charge of order OrderID, once.
type RefundCommand struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

// Key is the deduplication key of a charge: "charge:<order id>" ("" without
// an order id: such commands go to the dead-letter topic). It is also the
// idempotency key sent to the provider.
func Key(c Command) string {
	if c.OrderID == "" {
		return ""
	}
	return dedupe.Key("charge", c.OrderID)
}

// RefundKey is the deduplication key of a refund: "refund:<order id>". It is
// also the refund's reference at the provider, which reconcile searches.
func RefundKey(c RefundCommand) string {
	if c.OrderID == "" {
		return ""
	}
	return dedupe.Key("refund", c.OrderID)
}

// Service charges and refunds orders through a payments client.
type Service struct {
	client  *payments.Client
	guard   *dedupe.Guard
	effects *dedupe.Effects
}

// New returns the service calling the provider through client, with the
// default guard and its effects table.
func New(client *payments.Client) *Service {
	g := dedupe.New()
	return &Service{client: client, guard: g, effects: dedupe.NewEffects(g)}
}

// Migrate creates the guard and effects tables and the service's charges
// and refunds tables. It is idempotent, safe when several instances start
// at once, and fails with the wrapped database error.
func (s *Service) Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := s.guard.Migrate(ctx, pool); err != nil {
		return err
	}
	// Two concurrent "create table if not exists" of one table can both
	// miss it and collide in the catalog (duplicate key in pg_type): the
	// DDL runs in one transaction holding an advisory lock, so a second
	// instance waits and then finds the tables.
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `select pg_advisory_xact_lock(hashtext('exactly example charge: schema'))`); err != nil {
			return fmt.Errorf("locking the charges schema: %w", err)
		}
		if _, err := tx.Exec(ctx, `create table if not exists charges (
			order_id   text primary key,
			charge_id  text        not null,
			amount     bigint      not null,
			created_at timestamptz not null default now()
		);
		create table if not exists refunds (
			order_id   text primary key,
			refund_id  text        not null,
			amount     bigint      not null,
			created_at timestamptz not null default now()
		)`); err != nil {
			return fmt.Errorf("creating charges and refunds tables: %w", err)
		}
		return nil
	})
}

// Charge charges c inside tx: the provider's charge, made with the
// idempotency key Key(c), and a charges row holding its id, which commits
// with the guard row. If tx rolls back, the next attempt gets the same
// charge from the provider.
func (s *Service) Charge(ctx context.Context, tx pgx.Tx, scope string, c Command) (payments.Charge, error) {
	ch, err := dedupe.CallJSON(ctx, s.effects, tx, scope, Key(c),
		func(ctx context.Context, idempotencyKey string) (payments.Charge, error) {
			return s.client.CreateCharge(ctx, idempotencyKey, payments.ChargeParams{Amount: c.Amount, Currency: "eur", OrderID: c.OrderID})
		})
	if err != nil {
		return payments.Charge{}, fmt.Errorf("charging order %s: %w", c.OrderID, err)
	}
	return ch, store(ctx, tx, c, ch)
}

// store writes the charges row of c's charge ch in tx.
func store(ctx context.Context, tx pgx.Tx, c Command, ch payments.Charge) error {
	if _, err := tx.Exec(ctx, `insert into charges (order_id, charge_id, amount) values ($1, $2, $3)`,
		c.OrderID, ch.ID, c.Amount); err != nil {
		return fmt.Errorf("storing charge %s of order %s: %w", ch.ID, c.OrderID, err)
	}
	return nil
}

// Refund refunds c inside tx through the legacy endpoint (no idempotency
// keys): "started" commits through db before the call, the refunds row and
// "done" commit with tx, and a redelivery that finds "started" looks the
// refund up by its reference before refunding again.
func (s *Service) Refund(ctx context.Context, db dedupe.Beginner, tx pgx.Tx, scope string, c RefundCommand) (payments.Refund, error) {
	var chargeID string
	if err := tx.QueryRow(ctx, `select charge_id from charges where order_id = $1`, c.OrderID).Scan(&chargeID); err != nil {
		return payments.Refund{}, fmt.Errorf("finding the charge of order %s: %w", c.OrderID, err)
	}
	rf, err := dedupe.CallReconciledJSON(ctx, s.effects, db, tx, scope, RefundKey(c),
		func(ctx context.Context, key string) (payments.Refund, error) {
			return s.client.CreateLegacyRefund(ctx, payments.RefundParams{ChargeID: chargeID, Amount: c.Amount, Reference: key})
		},
		func(ctx context.Context, key string) (payments.Refund, bool, error) {
			return s.client.FindLegacyRefund(ctx, key)
		})
	if err != nil {
		return payments.Refund{}, fmt.Errorf("refunding order %s: %w", c.OrderID, err)
	}
	if _, err := tx.Exec(ctx, `insert into refunds (order_id, refund_id, amount) values ($1, $2, $3)`,
		c.OrderID, rf.ID, c.Amount); err != nil {
		return payments.Refund{}, fmt.Errorf("storing refund %s of order %s: %w", rf.ID, c.OrderID, err)
	}
	return rf, nil
}

// Handler returns the guarded handler "charge", keyed by the order id. Its
// provider call is declared once (handler.NewWithCall): the consumer makes
// it before the record's transaction, with Key(c) as the Idempotency-Key,
// its context ending at EXACTLY_CALL_TIMEOUT; the transaction records the
// charge with the guard row and stores its id. A duplicate (its guard row
// exists) makes no call. [Service.Charge] is the same charge made inside
// the transaction.
func (s *Service) Handler() *handler.Handler[Command] {
	return handler.NewWithCall("charge", handler.FromPayload(Key),
		func(ctx context.Context, msg handler.Message[Command], idempotencyKey string) (payments.Charge, error) {
			c := msg.Value
			ch, err := s.client.CreateCharge(ctx, idempotencyKey, payments.ChargeParams{Amount: c.Amount, Currency: "eur", OrderID: c.OrderID})
			if err != nil {
				return payments.Charge{}, fmt.Errorf("charging order %s: %w", c.OrderID, err)
			}
			return ch, nil
		},
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[Command], ch payments.Charge) error {
			return store(ctx, tx, msg.Value, ch)
		})
}

// RefundHandler returns the guarded handler "refund", keyed by the order
// id. db commits the "started" rows outside the handler's transaction: a
// pool with a connection to spare beside the consumer's (or a dedicated
// one).
func (s *Service) RefundHandler(db dedupe.Beginner) *handler.Handler[RefundCommand] {
	return handler.New("refund", handler.FromPayload(RefundKey),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[RefundCommand]) error {
			_, err := s.Refund(ctx, db, tx, msg.Scope, msg.Value)
			return err
		})
}
