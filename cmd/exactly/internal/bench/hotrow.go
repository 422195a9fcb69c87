package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
)

// hotAccounts is the number of accounts of the hot-row workload: few
// enough that every batch of 100 transfers touches most of them.
const hotAccounts = 20

// Transfer moves Amount from account From to account To. ID names the
// transfer: it is the deduplication key.
type Transfer struct {
	ID     string `json:"id"`
	From   int64  `json:"from"`
	To     int64  `json:"to"`
	Amount int64  `json:"amount"`
}

// transfers returns n transfers between the hot accounts: transfer i
// debits account 7i mod 20 and credits another one, so that consecutive
// transfers lock the accounts in no common order. The same n always gives
// the same transfers.
func transfers(n int) []Transfer {
	ts := make([]Transfer, n)
	for i := range ts {
		from := int64(i*7) % hotAccounts
		to := (from + 1 + int64(i%(hotAccounts-1))) % hotAccounts
		ts[i] = Transfer{ID: fmt.Sprintf("transfer-%d", i), From: from, To: to, Amount: int64(1 + i%50)}
	}
	return ts
}

// produceTransfers sends n transfers to topic, transfer i to partition i
// mod partitions, and returns when every record is acknowledged.
func produceTransfers(ctx context.Context, brokers []string, topic string, partitions, n int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return fmt.Errorf("creating the transfer producer: %w", err)
	}
	defer cl.Close()
	ts := transfers(n)
	recs := make([]*kgo.Record, len(ts))
	for i, t := range ts {
		v, err := json.Marshal(t)
		if err != nil {
			return fmt.Errorf("encoding transfer %s: %w", t.ID, err)
		}
		recs[i] = &kgo.Record{Topic: topic, Partition: int32(i % partitions), Key: []byte(t.ID), Value: v}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("producing %d transfers: %w", n, err)
	}
	return nil
}

// accountsTable is the hot-row workload's accounts table in schema.
func accountsTable(schema string) pgx.Identifier { return pgx.Identifier{schema, "accounts"} }

// migrateAccounts creates the accounts table with hotAccounts rows.
func migrateAccounts(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	t := accountsTable(schema).Sanitize()
	if _, err := pool.Exec(ctx, `create table `+t+` (id bigint primary key, balance bigint not null)`); err != nil {
		return fmt.Errorf("creating the accounts table: %w", err)
	}
	if _, err := pool.Exec(ctx, `insert into `+t+` (id, balance) select g, 1000000 from generate_series(0, $1::bigint - 1) g`, hotAccounts); err != nil {
		return fmt.Errorf("adding %d accounts: %w", hotAccounts, err)
	}
	return nil
}

// transferHandler is a wallet's transfer handler: it debits one account
// and credits the other with an UPDATE each, so it locks two of the 20
// account rows, in the order the transfer names them, and fails when an
// account does not exist. It declares both accounts as lock keys, so the
// executor locks a batch's accounts in one sorted statement before the
// handler runs: batches of different partitions wait for each other
// instead of deadlocking. With form formPipelined the two UPDATEs are
// queued (handler.NewPipelined), each checked to touch one row
// (handler.RowsAffected), so a batch's updates cost one round trip instead
// of two per transfer; with formTx each is a tx.Exec.
func transferHandler(schema, form string) handler.Any {
	update := `update ` + accountsTable(schema).Sanitize() + ` set balance = balance + $2 where id = $1`
	key := handler.FromPayload(func(t Transfer) string { return dedupe.Key("transfer", t.ID) })
	locks := handler.WithLockKeys(func(t Transfer) []string {
		return []string{"account:" + strconv.FormatInt(t.From, 10), "account:" + strconv.FormatInt(t.To, 10)}
	})
	if form == formPipelined {
		return handler.NewPipelined("transfer", key, func(_ context.Context, q handler.Queue, msg handler.Message[Transfer]) error {
			t := msg.Value
			q.QueueCheck(handler.RowsAffected(1), update, t.From, -t.Amount)
			q.QueueCheck(handler.RowsAffected(1), update, t.To, t.Amount)
			return nil
		}, locks)
	}
	move := func(ctx context.Context, tx pgx.Tx, t Transfer, account, delta int64) error {
		tag, err := tx.Exec(ctx, update, account, delta)
		if err != nil {
			return fmt.Errorf("transfer %s: updating account %d: %w", t.ID, account, err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("transfer %s: account %d does not exist", t.ID, account)
		}
		return nil
	}
	return handler.New("transfer", key,
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[Transfer]) error {
			t := msg.Value
			if err := move(ctx, tx, t, t.From, -t.Amount); err != nil {
				return err
			}
			return move(ctx, tx, t, t.To, t.Amount)
		}, locks)
}

// deadlocks returns pg_stat_database.deadlocks of the current database:
// the deadlocks PostgreSQL detected (SQLSTATE 40P01) since its statistics
// were reset. A backend reports its count when it ends, at the latest, so
// read it after the scenario's connections are closed (awaitBackendsGone).
func deadlocks(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `select deadlocks from pg_stat_database where datname = current_database()`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("reading pg_stat_database.deadlocks: %w", err)
	}
	return n, nil
}

// runHotLimit writes the scenario's transfers with their two UPDATEs
// alone from one connection, spec.Batch transfers per transaction, each
// UPDATE a tx.Exec (a round trip) as in the tx-form transfer handler: no
// Kafka, no guard row, no lock statement, no framework. Batches of the
// hot-row workload each lock most of the 20 accounts, so they commit one
// after the other whatever the connections: this is the ceiling of the tx
// form's hot-row rate at that batch size.
func runHotLimit(ctx context.Context, spec Spec, pool *pgxpool.Pool) (Result, error) {
	update := `update ` + accountsTable(spec.Schema).Sanitize() + ` set balance = balance + $2 where id = $1`
	ts := transfers(spec.Records)
	start := time.Now()
	for len(ts) > 0 {
		batch := ts[:min(len(ts), max(spec.Batch, 1))]
		ts = ts[len(batch):]
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, t := range batch {
				for _, m := range [2]struct{ account, delta int64 }{{t.From, -t.Amount}, {t.To, t.Amount}} {
					tag, err := tx.Exec(ctx, update, m.account, m.delta)
					if err != nil {
						return fmt.Errorf("transfer %s: updating account %d: %w", t.ID, m.account, err)
					}
					if tag.RowsAffected() != 1 {
						return fmt.Errorf("transfer %s: account %d does not exist", t.ID, m.account)
					}
				}
			}
			return nil
		})
		if err != nil {
			return Result{}, err
		}
	}
	el := time.Since(start)
	return Result{Records: spec.Records, Seconds: el.Seconds(), Rate: float64(spec.Records) / el.Seconds(), P50: -1, P99: -1}, nil
}
