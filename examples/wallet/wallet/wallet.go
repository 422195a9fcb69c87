// Package wallet is two command types on one topic: "deposit" and
// "transfer" commands share the topic wallet-commands, told apart by their
// "type" header, and each has its own payload type, key and scope. A
// handler.Router picks the handler per record; a record whose type is
// missing or unknown goes to the dead-letter topic with the reason.
package wallet

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/outbox"
)

// Topics and the discriminating header.
const (
	// CommandsTopic carries deposit and transfer commands.
	CommandsTopic = "wallet-commands"
	// EventsTopic carries transfer-completed and transfer-rejected events.
	EventsTopic = "wallet-events"
	// TypeHeader names a command's type: TypeDeposit or TypeTransfer.
	TypeHeader   = "type"
	TypeDeposit  = "deposit"
	TypeTransfer = "transfer"
)

// Deposit adds Amount to Account. DepositID names the operation: a deposit
// is applied once however often it is sent.
type Deposit struct {
	DepositID string `json:"deposit_id"`
	Account   string `json:"account"`
	Amount    int64  `json:"amount"`
}

// Transfer moves Amount from From to To, or is rejected (recorded, and
// announced on EventsTopic) when From has too little.
type Transfer struct {
	TransferID string `json:"transfer_id"`
	From       string `json:"from"`
	To         string `json:"to"`
	Amount     int64  `json:"amount"`
}

// TransferEvent announces a transfer's result.
type TransferEvent struct {
	TransferID string `json:"transfer_id"`
	Status     string `json:"status"` // "completed" or "rejected"
}

// Migrate creates the accounts and transfers tables. It is idempotent,
// safe when several instances start at once, and fails with the wrapped
// database error.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	// Two concurrent "create table if not exists" of one table can both
	// miss it and collide in the catalog (duplicate key in pg_type): the
	// DDL runs in one transaction holding an advisory lock, so a second
	// instance waits and then finds the tables.
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `select pg_advisory_xact_lock(hashtext('exactly example wallet: schema'))`); err != nil {
			return fmt.Errorf("wallet: locking the schema: %w", err)
		}
		if _, err := tx.Exec(ctx, `
create table if not exists wallet_accounts (
	account text primary key,
	balance bigint not null check (balance >= 0)
);
create table if not exists wallet_transfers (
	transfer_id text primary key,
	status      text not null
)`); err != nil {
			return fmt.Errorf("wallet: creating tables: %w", err)
		}
		return nil
	})
}

// Router returns the router of the commands topic: deposits and transfers,
// chosen by the "type" header.
func Router() *handler.Router {
	return handler.NewRouter("wallet", handler.ByHeader(TypeHeader),
		handler.Route(TypeDeposit, DepositHandler()),
		handler.Route(TypeTransfer, TransferHandler()))
}

// DepositHandler credits a deposit once, keyed "deposit:<deposit id>".
func DepositHandler() *handler.Handler[Deposit] {
	return handler.New("deposit",
		handler.FromPayload(func(d Deposit) string { return dedupe.Key("deposit", d.DepositID) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[Deposit]) error {
			d := msg.Value
			if d.Amount <= 0 {
				return fmt.Errorf("deposit %s: amount %d is not positive", d.DepositID, d.Amount)
			}
			_, err := tx.Exec(ctx, `insert into wallet_accounts (account, balance) values ($1, $2)
on conflict (account) do update set balance = wallet_accounts.balance + excluded.balance`, d.Account, d.Amount)
			if err != nil {
				return fmt.Errorf("deposit %s: crediting %s: %w", d.DepositID, d.Account, err)
			}
			return nil
		},
		handler.WithLockKeys(func(d Deposit) []string { return []string{accountLock(d.Account)} }))
}

// accountLock is the lock key of an account's row: every handler that
// writes the row declares it, so batches of different partitions that
// touch the same accounts wait for each other instead of deadlocking.
func accountLock(account string) string { return "wallet-account:" + account }

// errInsufficient is a business rejection: recorded, not retried.
var errInsufficient = errors.New("insufficient funds")

// TransferHandler moves money once, keyed "transfer:<transfer id>". A
// transfer the source account cannot cover is a business outcome, not a
// failure: it is recorded as rejected and announced, and the handler
// returns nil (retrying it could not help, and dead-lettering it would hide
// an expected result in an operator's queue).
func TransferHandler() *handler.Handler[Transfer] {
	return handler.New("transfer",
		handler.FromPayload(func(t Transfer) string { return dedupe.Key("transfer", t.TransferID) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[Transfer]) error {
			t := msg.Value
			status := "completed"
			if err := move(ctx, tx, t); errors.Is(err, errInsufficient) {
				status = "rejected"
			} else if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `insert into wallet_transfers (transfer_id, status) values ($1, $2)`, t.TransferID, status); err != nil {
				return fmt.Errorf("transfer %s: recording it: %w", t.TransferID, err)
			}
			return outbox.AddJSON(ctx, tx, EventsTopic, []byte(t.From), TransferEvent{TransferID: t.TransferID, Status: status})
		},
		handler.WithLockKeys(func(t Transfer) []string { return []string{accountLock(t.From), accountLock(t.To)} }))
}

// move debits t.From and credits t.To, locking both rows in account order
// (no deadlock between opposite transfers of one batch; the lock keys keep
// batches of different partitions apart). It fails with errInsufficient,
// changing nothing, when t.From cannot cover t.Amount.
func move(ctx context.Context, tx pgx.Tx, t Transfer) error {
	if t.Amount <= 0 || t.From == t.To {
		return fmt.Errorf("transfer %s: amount %d from %q to %q is not a transfer", t.TransferID, t.Amount, t.From, t.To)
	}
	if _, err := tx.Exec(ctx, `select 1 from wallet_accounts where account = any($1) order by account for update`, []string{t.From, t.To}); err != nil {
		return fmt.Errorf("transfer %s: locking accounts: %w", t.TransferID, err)
	}
	tag, err := tx.Exec(ctx, `update wallet_accounts set balance = balance - $2 where account = $1 and balance >= $2`, t.From, t.Amount)
	if err != nil {
		return fmt.Errorf("transfer %s: debiting %s: %w", t.TransferID, t.From, err)
	}
	if tag.RowsAffected() == 0 {
		return errInsufficient
	}
	if _, err := tx.Exec(ctx, `insert into wallet_accounts (account, balance) values ($1, $2)
on conflict (account) do update set balance = wallet_accounts.balance + excluded.balance`, t.To, t.Amount); err != nil {
		return fmt.Errorf("transfer %s: crediting %s: %w", t.TransferID, t.To, err)
	}
	return nil
}
