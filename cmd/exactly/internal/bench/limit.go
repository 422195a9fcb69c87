package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/exactly-go/exactly/cmd/exactly/internal/workload"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/credit"
)

// Shapes of the limit scenarios: how a batch's statements reach PostgreSQL.
const (
	// shapeRowWise (a): the claim in one statement, one single-row ledger
	// INSERT per record (each a round trip, as a handler's tx.Exec), the
	// outbox rows in one statement.
	shapeRowWise = "rowwise"
	// shapePipelined (p): the same statements queued in one pgx.Batch: one
	// round trip, then COMMIT.
	shapePipelined = "pipelined"
	// shapeSetBased (b): one INSERT … SELECT unnest per table.
	shapeSetBased = "setbased"
)

// guardScope is the scope of the credit guard rows, as the credit handler
// claims them.
const guardScope = "credit"

// business holds the business statements of a credit record and nothing
// else: no advisory locks, no NOTIFY, no outcome counters. The limits and
// the hand-written loops issue these, so that they measure what PostgreSQL
// allows for the effect, not what exactly adds to it.
type business struct {
	claimBatch  string // $1 scope, $2 keys: returns the claimed keys
	claimOne    string // $1 scope, $2 key
	ledgerOne   string // $1 order id, $2 account, $3 amount
	ledgerSet   string // $1 order ids, $2 accounts, $3 amounts
	outboxOne   string // $1 topic, $2 key, $3 value
	outboxSet   string // $1 topic, $2 keys, $3 values
	eventsTopic string
}

func newBusiness(f tables) business {
	g, l, o := f.guard.Table().Sanitize(), f.svc.Ledger().Sanitize(), f.ob.Table().Sanitize()
	return business{
		claimBatch:  `insert into ` + g + ` (scope, key) select $1, k from unnest($2::text[]) as u(k) on conflict do nothing returning key`,
		claimOne:    `insert into ` + g + ` (scope, key) values ($1, $2) on conflict do nothing`,
		ledgerOne:   `insert into ` + l + ` (order_id, account, amount) values ($1, $2, $3)`,
		ledgerSet:   `insert into ` + l + ` (order_id, account, amount) select * from unnest($1::text[], $2::bigint[], $3::bigint[])`,
		outboxOne:   `insert into ` + o + ` (topic, key, value) values ($1, $2, $3)`,
		outboxSet:   `insert into ` + o + ` (topic, key, value) select $1, k, v from unnest($2::bytea[], $3::bytea[]) as u(k, v)`,
		eventsTopic: f.events,
	}
}

// event is a command's account-credited event: its outbox key and value.
func event(c credit.Command) (key, value []byte, err error) {
	value, err = json.Marshal(credit.Credited(c))
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the event of order %s: %w", c.OrderID, err)
	}
	return strconv.AppendInt(nil, c.Account, 10), value, nil
}

// applyOne is a hand-written loop's transaction for one record: the ledger
// row and the outbox row, each one statement. With guard, the guard row is
// claimed first in the same transaction and a duplicate writes nothing.
func (b business) applyOne(ctx context.Context, tx pgx.Tx, c credit.Command, guard bool) error {
	if guard {
		tag, err := tx.Exec(ctx, b.claimOne, guardScope, credit.Key(c))
		if err != nil {
			return fmt.Errorf("claiming order %s: %w", c.OrderID, err)
		}
		if tag.RowsAffected() == 0 {
			return nil
		}
	}
	if _, err := tx.Exec(ctx, b.ledgerOne, c.OrderID, c.Account, c.Amount); err != nil {
		return fmt.Errorf("inserting the ledger row of order %s: %w", c.OrderID, err)
	}
	k, v, err := event(c)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, b.outboxOne, b.eventsTopic, k, v); err != nil {
		return fmt.Errorf("adding the event of order %s: %w", c.OrderID, err)
	}
	return nil
}

// claim claims the batch's keys in one statement and returns the commands
// whose key it inserted.
func (b business) claim(ctx context.Context, tx pgx.Tx, batch []credit.Command) ([]credit.Command, error) {
	keys := make([]string, len(batch))
	for i, c := range batch {
		keys[i] = credit.Key(c)
	}
	rows, err := tx.Query(ctx, b.claimBatch, guardScope, keys)
	if err != nil {
		return nil, fmt.Errorf("claiming %d keys: %w", len(keys), err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("claiming %d keys: %w", len(keys), err)
	}
	set := make(map[string]struct{}, len(claimed))
	for _, k := range claimed {
		set[k] = struct{}{}
	}
	out := batch[:0:0]
	for i, c := range batch {
		if _, ok := set[keys[i]]; ok {
			out = append(out, c)
		}
	}
	return out, nil
}

// outboxArgs returns the outbox statement's arguments for cmds.
func (b business) outboxArgs(cmds []credit.Command) ([]any, error) {
	ks, vs := make([][]byte, len(cmds)), make([][]byte, len(cmds))
	for i, c := range cmds {
		var err error
		if ks[i], vs[i], err = event(c); err != nil {
			return nil, err
		}
	}
	return []any{b.eventsTopic, ks, vs}, nil
}

// writeBatch writes one batch in one transaction in the given shape.
func (b business) writeBatch(ctx context.Context, pool *pgxpool.Pool, shape string, batch []credit.Command) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		switch shape {
		case shapeRowWise:
			claimed, err := b.claim(ctx, tx, batch)
			if err != nil {
				return err
			}
			for _, c := range claimed {
				if _, err := tx.Exec(ctx, b.ledgerOne, c.OrderID, c.Account, c.Amount); err != nil {
					return fmt.Errorf("inserting the ledger row of order %s: %w", c.OrderID, err)
				}
			}
			args, err := b.outboxArgs(claimed)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, b.outboxSet, args...); err != nil {
				return fmt.Errorf("adding %d events: %w", len(claimed), err)
			}
			return nil
		case shapePipelined:
			// Queued together, the claim cannot filter the records after
			// it: every record of these batches is new, so all are
			// claimed, and the statements are exactly (a)'s.
			keys := make([]string, len(batch))
			q := &pgx.Batch{}
			for i, c := range batch {
				keys[i] = credit.Key(c)
			}
			q.Queue(b.claimBatch, guardScope, keys)
			for _, c := range batch {
				q.Queue(b.ledgerOne, c.OrderID, c.Account, c.Amount)
			}
			args, err := b.outboxArgs(batch)
			if err != nil {
				return err
			}
			q.Queue(b.outboxSet, args...)
			if err := tx.SendBatch(ctx, q).Close(); err != nil {
				return fmt.Errorf("sending a pipeline of %d statements: %w", q.Len(), err)
			}
			return nil
		case shapeSetBased:
			claimed, err := b.claim(ctx, tx, batch)
			if err != nil {
				return err
			}
			ids, accts, amts := make([]string, len(claimed)), make([]int64, len(claimed)), make([]int64, len(claimed))
			for i, c := range claimed {
				ids[i], accts[i], amts[i] = c.OrderID, c.Account, c.Amount
			}
			if _, err := tx.Exec(ctx, b.ledgerSet, ids, accts, amts); err != nil {
				return fmt.Errorf("inserting %d ledger rows: %w", len(claimed), err)
			}
			args, err := b.outboxArgs(claimed)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, b.outboxSet, args...); err != nil {
				return fmt.Errorf("adding %d events: %w", len(claimed), err)
			}
			return nil
		}
		return fmt.Errorf("unknown limit shape %q (want %s, %s or %s)", shape, shapeRowWise, shapePipelined, shapeSetBased)
	})
}

// limitBatches splits the scenario's commands into the batches the
// consumer would form: consecutive records of one partition, at most
// spec.Batch each, partitions interleaved.
func limitBatches(spec Spec) [][]credit.Command {
	cmds := workload.Commands(spec.Records, spec.Accounts)
	perPart := make([][]credit.Command, max(spec.Partitions, 1))
	for i, c := range cmds {
		p := i % len(perPart)
		perPart[p] = append(perPart[p], c)
	}
	var batches [][]credit.Command
	for off := 0; ; off += spec.Batch {
		added := false
		for p := range perPart {
			if off < len(perPart[p]) {
				batches = append(batches, perPart[p][off:min(off+spec.Batch, len(perPart[p]))])
				added = true
			}
		}
		if !added {
			return batches
		}
	}
}

// runLimit writes the scenario's records with the business statements
// alone, in the shape spec.Shape, from a plain pgx loop on spec.Conns
// connections (one transaction per batch): no Kafka, no framework. It
// measures what PostgreSQL allows for that shape.
func runLimit(ctx context.Context, spec Spec, pool *pgxpool.Pool, f tables) (Result, error) {
	b := newBusiness(f)
	batches := limitBatches(spec)
	jobs := make(chan []credit.Command, len(batches))
	for _, batch := range batches {
		jobs <- batch
	}
	close(jobs)
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for range max(spec.Conns, 1) {
		g.Go(func() error {
			for batch := range jobs {
				if err := b.writeBatch(gctx, pool, spec.Shape, batch); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return Result{}, err
	}
	el := time.Since(start)
	return Result{Records: spec.Records, Seconds: el.Seconds(), Rate: float64(spec.Records) / el.Seconds(), P50: -1, P99: -1}, nil
}
