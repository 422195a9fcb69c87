package outbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/internal/runtime/pgsession"
)

// LeaseTable is the table, in each outbox table's schema (or the
// search_path when the outbox has no schema), that holds the relay lease
// of every outbox table of that schema: one row per table. Migrate creates
// it.
const LeaseTable = "exactly_relay_lease"

// DefaultLeaseDuration is how long a relay lease lasts without renewal
// (RelayConfig.LeaseDuration); the active relay renews it every quarter of
// that.
const DefaultLeaseDuration = 4 * time.Second

// TransactionalIDPrefix starts the Kafka transactional id of every relay:
// the id is the prefix followed by the producer_id of the table's lease row,
// drawn once per outbox table, so all relays of one table share one id and
// relays of other tables (or databases) never do.
const TransactionalIDPrefix = "exactly-relay-"

// errLeaseLost ends a relay's term: another relay holds the lease now, or
// this one could not renew it in time.
var errLeaseLost = errors.New("the relay lease was lost")

// Lease is the relay lease of an outbox table, as stored: which relay
// publishes the table, since when, and until when unless renewed.
type Lease struct {
	// Holder names the process holding (or that last held) the lease:
	// its host name and pid ("web-7 pid 4242").
	Holder string
	// Owner identifies the holder's term (a UUID): a relay that loses the
	// lease and takes it again has a new one.
	Owner string
	// Epoch counts the terms: every takeover adds one. 0 means no relay
	// has ever held the lease (and then the other fields are zero).
	Epoch int64
	// Since is when the current term began; Renewed when it was last
	// renewed; Expires when it ends unless renewed (the database's
	// clock).
	Since, Renewed, Expires time.Time
	// Expired is true when Expires had passed when the lease was read:
	// no relay is active (the last holder stopped, died or hangs), and
	// the next standby takes the lease within its TakeoverInterval.
	Expired bool
	// TransactionalID is the Kafka transactional id every relay of the
	// table produces with.
	TransactionalID string
}

// leaseTable is the lease table of o's schema.
func (o *Outbox) leaseTable() pgx.Identifier {
	if o.schema == "" {
		return pgx.Identifier{LeaseTable}
	}
	return pgx.Identifier{o.schema, LeaseTable}
}

// Lease reads o's relay lease: who publishes the table (see Lease). A
// table no relay ever held gives a Lease with Epoch 0. It fails with the
// wrapped database error (the lease table is missing before Migrate).
//
// The same in SQL, for the schema of the default table:
//
//	select holder, epoch, since, expires_at, expires_at <= now() as expired
//	from exactly_relay_lease where outbox = 'exactly_outbox';
func (o *Outbox) Lease(ctx context.Context, q Querier) (Lease, error) {
	var l Lease
	var producer string
	err := q.QueryRow(ctx, `select owner::text, holder, epoch, since, renewed_at, expires_at, expires_at <= clock_timestamp(), producer_id::text
from `+o.leaseTable().Sanitize()+` where outbox = $1`, o.quoted).
		Scan(&l.Owner, &l.Holder, &l.Epoch, &l.Since, &l.Renewed, &l.Expires, &l.Expired, &producer)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Lease{}, nil
	case err != nil:
		return Lease{}, fmt.Errorf("outbox: reading the relay lease of %s: %w", o.quoted, err)
	}
	l.TransactionalID = TransactionalIDPrefix + producer
	return l, nil
}

// leaseSQL are the statements of one outbox table's lease.
type leaseSQL struct {
	acquire, renew, release, hold string
}

func newLeaseSQL(lt string) leaseSQL {
	return leaseSQL{
		// $1 outbox, $2 owner, $3 holder, $4 duration (ms). Takes the
		// row when absent or expired; two takers serialise on the row
		// and the second finds it unexpired.
		acquire: `insert into ` + lt + ` as l (outbox, owner, holder, epoch, since, renewed_at, expires_at)
values ($1, $2::uuid, $3, 1, clock_timestamp(), clock_timestamp(), clock_timestamp() + $4 * interval '1 millisecond')
on conflict (outbox) do update set owner = excluded.owner, holder = excluded.holder, epoch = l.epoch + 1,
	since = excluded.since, renewed_at = excluded.renewed_at, expires_at = excluded.expires_at
where l.expires_at <= clock_timestamp()
returning l.epoch, l.producer_id::text`,
		// The epoch, not the expiry, says who holds the lease: a
		// holder may renew a lease that expired as long as no one took
		// it (then no one else published).
		renew: `update ` + lt + ` set renewed_at = clock_timestamp(), expires_at = clock_timestamp() + $4 * interval '1 millisecond'
where outbox = $1 and owner = $2::uuid and epoch = $3`,
		release: `update ` + lt + ` set expires_at = clock_timestamp() where outbox = $1 and owner = $2::uuid and epoch = $3`,
		// In the transaction of every delete and park: the row lock
		// (FOR SHARE) waits for a takeover in progress and then finds
		// the new epoch, so a relay that lost the lease changes nothing.
		hold: `select from ` + lt + ` where outbox = $1 and owner = $2::uuid and epoch = $3 for share`,
	}
}

// holderName is this process's name in the lease: "host pid N".
func holderName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return fmt.Sprintf("%s pid %d", host, os.Getpid())
}

// term is one relay's hold of the lease, from takeover to loss or release.
type term struct {
	r       *Relay
	sql     leaseSQL
	owner   string // a UUID
	epoch   int64
	txnID   string
	mu      sync.Mutex
	validTo time.Time // by the local clock: the start of the last renewal + LeaseDuration
}

// acquire tries to take r's lease once: it returns the new term, or nil when
// another relay holds an unexpired lease. It fails with the wrapped
// database error.
func (r *Relay) acquire(ctx context.Context) (*term, error) {
	id, err := uuid.NewRandomFromReader(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("drawing a lease owner id: %w", err)
	}
	owner := id.String()
	t := &term{r: r, sql: newLeaseSQL(r.ob.leaseTable().Sanitize()), owner: owner}
	sent := time.Now()
	var producer string
	err = r.inTx(ctx, false, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, t.sql.acquire, r.ob.quoted, owner, r.holder, r.cfg.LeaseDuration.Milliseconds()).Scan(&t.epoch, &producer)
	})
	if pe := (*pgconn.PgError)(nil); errors.Is(err, pgx.ErrNoRows) || errors.As(err, &pe) && pe.Code == "55P03" {
		// Held, or its row locked past lock_timeout by a holder's
		// transaction (which idle_in_transaction_session_timeout ends
		// if the holder is paused in it): try again later.
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("taking the relay lease: %w", err)
	}
	t.txnID = TransactionalIDPrefix + producer
	t.validTo = sent.Add(r.cfg.LeaseDuration)
	return t, nil
}

// valid reports whether the lease is still this term's by the local
// clock. It narrows, but cannot close, the window in which a paused relay
// acts on a lease it lost: what closes it is the check in the database
// (hold) and the Kafka producer's fencing.
func (t *term) valid() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return time.Now().Before(t.validTo)
}

// renew extends the lease; it reports false when the lease is no longer
// this term's.
func (t *term) renew(ctx context.Context) (bool, error) {
	sent := time.Now()
	var n int64
	err := t.r.inTx(ctx, false, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, t.sql.renew, t.r.ob.quoted, t.owner, t.epoch, t.r.cfg.LeaseDuration.Milliseconds())
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("renewing the relay lease: %w", err)
	}
	if n == 0 {
		return false, nil
	}
	t.mu.Lock()
	t.validTo = sent.Add(t.r.cfg.LeaseDuration)
	t.mu.Unlock()
	return true, nil
}

// heartbeat renews the lease every quarter of LeaseDuration until ctx
// ends; when the lease is lost (another relay took it, or no renewal
// succeeded before it expired) it cancels the term with errLeaseLost.
func (t *term) heartbeat(ctx context.Context, cancel context.CancelCauseFunc) {
	every := t.r.cfg.LeaseDuration / 4
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		t.r.pause(pauseRenew)
		rctx, done := context.WithTimeout(ctx, every)
		ok, err := t.renew(rctx)
		done()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && !ok:
			cancel(fmt.Errorf("%w: another relay took it (epoch %d was this relay's)", errLeaseLost, t.epoch))
			return
		case err != nil && !t.valid():
			cancel(fmt.Errorf("%w: not renewed within the lease duration (%v): %w", errLeaseLost, t.r.cfg.LeaseDuration, err))
			return
		case err != nil:
			t.r.log.Debug("outbox relay could not renew its lease; trying again", "error", err)
		}
	}
}

// release ends the lease now, so a standby takes over within its
// TakeoverInterval; a lease already taken by another relay is left alone.
// Errors are ignored: the lease then expires by itself.
func (t *term) release(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopGrace)
	defer cancel()
	_ = t.r.inTx(rctx, false, func(tx pgx.Tx) error {
		_, err := tx.Exec(rctx, t.sql.release, t.r.ob.quoted, t.owner, t.epoch)
		return err
	})
}

// guarded runs fn in a transaction that first checks, holding the lease
// row, that the lease is still this term's; the deletes and parks of the
// relay run only there. It fails with errLeaseLost (wrapped) when it is
// not, fn's error, or the wrapped database error.
func (t *term) guarded(ctx context.Context, fn func(pgx.Tx) error) error {
	return t.r.inTx(ctx, true, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, t.sql.hold, t.r.ob.quoted, t.owner, t.epoch)
		if err != nil {
			return fmt.Errorf("checking the relay lease: %w", err)
		}
		held := rows.Next()
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("checking the relay lease: %w", err)
		}
		if !held {
			return fmt.Errorf("%w: epoch %d is no longer this relay's", errLeaseLost, t.epoch)
		}
		t.r.pause(pauseHold)
		return fn(tx)
	})
}

// inTx runs fn in a transaction of r's pool whose application_name names
// the relay and its table; with async, its commit does not wait for the
// WAL flush (synchronous_commit off, for this transaction only). The
// transaction waits for a lock at most a quarter of LeaseDuration
// (lock_timeout), and the server ends it (and its session) when it stays
// idle that long (idle_in_transaction_session_timeout): a relay paused
// inside one, holding the lease row, does not keep a standby from taking
// over. Nothing it sets outlives the transaction.
func (r *Relay) inTx(ctx context.Context, async bool, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		limit := strconv.FormatInt(max(r.cfg.LeaseDuration/4, 10*time.Millisecond).Milliseconds(), 10)
		kv := []string{"application_name", r.appName, "lock_timeout", limit, "idle_in_transaction_session_timeout", limit}
		if async {
			kv = append(kv, "synchronous_commit", "off")
		}
		if err := pgsession.SetLocal(ctx, tx, kv...); err != nil {
			return err
		}
		return fn(tx)
	})
}
