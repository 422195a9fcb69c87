// Package credit is the tools' copy of examples/credit/credit (the demo, the
// chaos harness and the benchmarks run it), so that nothing imports an
// example. TestSameAsExample keeps the two identical below the package
// clause: the chaos harness runs the example's binary and checks its tables
// with this copy.
package credit

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/outbox"
)

// Topics of the service.
const (
	// CommandsTopic carries credit commands.
	CommandsTopic = "credit-commands"
	// EventsTopic carries account-credited events.
	EventsTopic = "account-credited"
)

// Command credits Amount to Account for order OrderID. The order id names
// the business operation: the same order is credited once however often the
// command is sent or delivered.
type Command struct {
	OrderID string `json:"order_id"`
	Account int64  `json:"account"`
	Amount  int64  `json:"amount"`
}

// Credited is the event emitted once per applied credit.
type Credited struct {
	OrderID string `json:"order_id"`
	Account int64  `json:"account"`
	Amount  int64  `json:"amount"`
}

// Key is the deduplication key of a command: "credit:<order id>". A command
// without an order id has no key ("") and goes to the dead-letter topic.
func Key(c Command) string {
	if c.OrderID == "" {
		return ""
	}
	return dedupe.Key("credit", c.OrderID)
}

// Service holds the ledger table and the outbox the handler writes to.
type Service struct {
	ledger pgx.Identifier
	out    *outbox.Outbox
	emit   bool
	events string
}

// Option configures a Service.
type Option func(*Service)

// WithLedgerTable sets the ledger table (default "ledger").
func WithLedgerTable(schema, name string) Option {
	return func(s *Service) {
		if schema == "" {
			s.ledger = pgx.Identifier{name}
		} else {
			s.ledger = pgx.Identifier{schema, name}
		}
	}
}

// WithOutbox sets the outbox events are added to (default outbox.New()).
func WithOutbox(o *outbox.Outbox) Option { return func(s *Service) { s.out = o } }

// WithEventsTopic sets the topic of account-credited events (default
// EventsTopic).
func WithEventsTopic(topic string) Option { return func(s *Service) { s.events = topic } }

// WithoutEvents stops the handler from emitting account-credited events.
func WithoutEvents() Option { return func(s *Service) { s.emit = false } }

// New returns the credit service.
func New(opts ...Option) *Service {
	s := &Service{ledger: pgx.Identifier{"ledger"}, out: outbox.New(), emit: true, events: EventsTopic}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Migrate creates the ledger table, the guard table and the outbox table.
// It is idempotent, safe when several instances start at once, and fails
// with the wrapped database error.
func (s *Service) Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	// Two concurrent "create table if not exists" of one table can both
	// miss it and collide in the catalog (duplicate key in pg_type): the
	// DDL runs in one transaction holding an advisory lock, so a second
	// instance waits and then finds the table.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `select pg_advisory_xact_lock(hashtext('exactly example credit: schema'))`); err != nil {
			return fmt.Errorf("locking the ledger schema: %w", err)
		}
		if len(s.ledger) == 2 {
			if _, err := tx.Exec(ctx, `create schema if not exists `+pgx.Identifier{s.ledger[0]}.Sanitize()); err != nil {
				return fmt.Errorf("creating ledger schema: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, `create table if not exists `+s.ledger.Sanitize()+` (
			id         bigserial primary key,
			order_id   text        not null,
			account    bigint      not null,
			amount     bigint      not null,
			created_at timestamptz not null default now()
		)`); err != nil {
			return fmt.Errorf("creating ledger table: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := dedupe.Migrate(ctx, pool); err != nil {
		return err
	}
	return s.out.Migrate(ctx, pool)
}

// Apply credits c inside tx: one ledger row and, unless disabled, one
// account-credited event keyed by the account (so one account's events are
// published in order). It is the effect without the guard: the handler
// adds the guard, the naive consumer of the demo does not.
func (s *Service) Apply(ctx context.Context, tx pgx.Tx, c Command) error {
	if _, err := tx.Exec(ctx, `insert into `+s.ledger.Sanitize()+` (order_id, account, amount) values ($1, $2, $3)`,
		c.OrderID, c.Account, c.Amount); err != nil {
		return fmt.Errorf("inserting ledger row for order %s: %w", c.OrderID, err)
	}
	if !s.emit {
		return nil
	}
	ev := Credited(c)
	if err := s.out.AddJSON(ctx, tx, s.events, []byte(strconv.FormatInt(c.Account, 10)), ev); err != nil {
		return fmt.Errorf("emitting account-credited for order %s: %w", c.OrderID, err)
	}
	return nil
}

// Handler returns the guarded handler "credit": keyed by the order id.
func (s *Service) Handler() *handler.Handler[Command] {
	return handler.New("credit", handler.FromPayload(Key),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[Command]) error {
			return s.Apply(ctx, tx, msg.Value)
		})
}

// Ledger returns the ledger table.
func (s *Service) Ledger() pgx.Identifier { return s.ledger }
