// Command creditsvc is the chaos harness's credit service: examples/credit
// (the same guard scope, ledger and account-credited events, through the
// tools' copy of its package) plus the user-code faults `exactly chaos`
// injects, each switched on from the environment:
//
//   - CHAOS_SWALLOW_ORDERS (comma-separated order ids): for these orders
//     the handler inserts a row twice, catches the unique violation
//     (SQLSTATE 23505) and returns nil, as "it already exists" code does.
//     Its transaction is aborted: the framework must count an attempt and
//     dead-letter the record, and nothing else may stall.
//   - CHAOS_AUDIT_TOPIC: every credit of accounts 0 and 1 also emits an
//     audit event, keyed by the account, to this topic (the harness denies
//     produce to it for a while: the relay must park these keys only).
//   - a command carrying a "pad" field emits an audit event holding the pad
//     twice, over the outbox's record limit: outbox.Add refuses it, the
//     handler fails, and the (large) command is dead-lettered.
//
// It fails at start-up like examples/credit: missing DATABASE_URL or
// EXACTLY_KAFKA_BROKERS, an unreachable database, a failed migration.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/credit"
	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/outbox"
)

// Environment variables of the faults.
const (
	EnvSwallowOrders = "CHAOS_SWALLOW_ORDERS"
	EnvAuditTopic    = "CHAOS_AUDIT_TOPIC"
)

// command is a credit command with an optional pad (the oversized
// records of a chaos run).
type command struct {
	credit.Command
	Pad string `json:"pad,omitempty"`
}

// audit is the event emitted to the audit topic.
type audit struct {
	credit.Credited
	Note string `json:"note,omitempty"`
	Echo string `json:"echo,omitempty"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		slog.Error("chaos credit service failed", "error", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	cfg, err := consumer.ConfigFromEnv(ctx)
	if err != nil {
		return err
	}
	if len(cfg.Topics) == 0 {
		cfg.Topics = []string{credit.CommandsTopic}
	}
	if cfg.DatabaseURL == "" || len(cfg.Brokers) == 0 {
		return errors.New("set DATABASE_URL and EXACTLY_KAFKA_BROKERS")
	}
	pool, err := consumer.NewPool(ctx, cfg.DatabaseURL, 6)
	if err != nil {
		return err
	}
	defer pool.Close()

	ob := outbox.New()
	credits := credit.New(credit.WithOutbox(ob))
	if err := credits.Migrate(ctx, pool); err != nil {
		return err
	}
	// The harness creates it first (chaos.ChaosSeenTableSQL): processes
	// starting together could fail to create it at once.
	if _, err := pool.Exec(ctx, `create table if not exists chaos_seen (order_id text primary key)`); err != nil {
		return fmt.Errorf("creating chaos_seen: %w", err)
	}
	f := faults{svc: credits, out: ob, audit: os.Getenv(EnvAuditTopic), swallow: map[string]bool{}}
	for _, o := range strings.Split(os.Getenv(EnvSwallowOrders), ",") {
		if o != "" {
			f.swallow[o] = true
		}
	}
	svc, err := consumer.NewService(cfg, pool, consumer.Handle(f.handler()), consumer.WithOutbox(ob))
	if err != nil {
		return err
	}
	if err := svc.Migrate(ctx); err != nil {
		return err
	}
	return svc.Run(ctx)
}

type faults struct {
	svc     *credit.Service
	out     *outbox.Outbox
	audit   string
	swallow map[string]bool
}

// handler is the credit handler (scope "credit", keyed by order id) with
// the faults.
func (f faults) handler() *handler.Handler[command] {
	return handler.New("credit", handler.FromPayload(func(c command) string { return credit.Key(c.Command) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[command]) error {
			c := msg.Value
			if f.swallow[c.OrderID] {
				// "Insert; on a unique violation it already exists":
				// the second insert violates, and the error is swallowed
				// with the transaction aborted.
				for range 2 {
					_, err := tx.Exec(ctx, `insert into chaos_seen (order_id) values ($1)`, c.OrderID)
					var pgErr *pgconn.PgError
					if errors.As(err, &pgErr) && pgErr.Code == "23505" {
						return nil
					}
					if err != nil {
						return err
					}
				}
			}
			if err := f.svc.Apply(ctx, tx, c.Command); err != nil {
				return err
			}
			if f.audit == "" || (c.Account >= 2 && c.Pad == "") {
				return nil
			}
			ev := audit{Credited: credit.Credited(c.Command), Note: c.Pad, Echo: c.Pad}
			if err := f.out.AddJSON(ctx, tx, f.audit, []byte(strconv.FormatInt(c.Account, 10)), ev); err != nil {
				return fmt.Errorf("emitting the audit event of order %s: %w", c.OrderID, err)
			}
			return nil
		})
}
