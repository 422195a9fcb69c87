package status

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Relay says who publishes the outbox table: the relay holding its lease
// (the exactly_relay_lease table, when the outbox's migrations created
// it) or, before that, the session holding its relay advisory lock.
type Relay struct {
	// Mechanism is "lease" or "advisory lock": how relays of this
	// table's schema elect the one that publishes.
	Mechanism string `json:"mechanism"`
	// Active is true when a relay holds the lease (unexpired) or the
	// lock.
	Active bool `json:"active"`
	// Holders are who holds it: one at most with a lease; with the
	// advisory lock, every session the database shows holding it. A lease
	// that expired is listed (Expired), as its last holder.
	Holders []RelayHolder `json:"holders"`
}

// RelayHolder is one holder of the relay lease or lock.
type RelayHolder struct {
	// Holder names it: the lease's holder ("host pid N", the relay
	// process), or "backend pid N" for the lock's session.
	Holder string `json:"holder"`
	// PID is the database backend's pid (lock only; pg_terminate_backend
	// ends the session and releases the lock).
	PID int32 `json:"pid,omitempty"`
	// Client is the session's client address and Application its
	// application_name (lock only; empty when not visible to this role).
	Client      string `json:"client,omitempty"`
	Application string `json:"application,omitempty"`
	// Since is when the lease's term began, or when the lock's session
	// connected.
	Since time.Time `json:"since"`
	// Owner and Epoch identify the lease's term (lease only).
	Owner string `json:"owner,omitempty"`
	Epoch int64  `json:"epoch,omitempty"`
	// Expires is when the lease ends unless renewed, and Expired whether
	// it had when read (lease only).
	Expires *time.Time `json:"expires,omitempty"`
	Expired bool       `json:"expired,omitempty"`
}

// leaseTableName is the relay lease table of an outbox table's schema
// (outbox.LeaseTable once relays elect by lease).
const leaseTableName = "exactly_relay_lease"

// relayLockKey is the session advisory lock key relays that elect by lock
// hold: FNV-1a over the length-prefixed parts "exactly-outbox-relay" and
// the table's quoted name, as the outbox package computes it.
func relayLockKey(quoted string) int64 {
	h := fnv.New64a()
	var n [8]byte
	for _, p := range []string{"exactly-outbox-relay", quoted} {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	return int64(h.Sum64())
}

// readRelay reads who holds the relay of outbox table t: its lease when
// the lease table exists, else the sessions holding its advisory lock
// (pg_locks joined with pg_stat_activity).
func readRelay(ctx context.Context, tx pgx.Tx, t pgx.Identifier) (Relay, error) {
	quoted := t.Sanitize()
	lease := pgx.Identifier{leaseTableName}
	if len(t) == 2 {
		lease = pgx.Identifier{t[0], leaseTableName}
	}
	var exists bool
	if err := tx.QueryRow(ctx, `select to_regclass($1) is not null`, lease.Sanitize()).Scan(&exists); err != nil {
		return Relay{}, fmt.Errorf("looking for %s: %w", lease.Sanitize(), err)
	}
	if exists {
		r := Relay{Mechanism: "lease", Holders: []RelayHolder{}}
		var h RelayHolder
		var expires time.Time
		err := tx.QueryRow(ctx, `select holder, owner::text, epoch, since, expires_at, expires_at <= clock_timestamp()
from `+lease.Sanitize()+` where outbox = $1`, quoted).Scan(&h.Holder, &h.Owner, &h.Epoch, &h.Since, &expires, &h.Expired)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return r, nil
		case err != nil:
			return Relay{}, fmt.Errorf("reading %s: %w", lease.Sanitize(), err)
		}
		h.Expires = &expires
		r.Active = !h.Expired
		r.Holders = append(r.Holders, h)
		return r, nil
	}
	key := uint64(relayLockKey(quoted))
	rows, err := tx.Query(ctx, `select l.pid, coalesce(host(a.client_addr), ''), coalesce(a.application_name, ''), a.backend_start
from pg_locks l left join pg_stat_activity a on a.pid = l.pid
where l.locktype = 'advisory' and l.granted and l.database = (select oid from pg_database where datname = current_database())
  and l.classid = $1::bigint::oid and l.objid = $2::bigint::oid and l.objsubid = 1
order by a.backend_start`, int64(key>>32), int64(key&0xffffffff))
	if err != nil {
		return Relay{}, fmt.Errorf("reading the relay lock from pg_locks: %w", err)
	}
	r := Relay{Mechanism: "advisory lock", Holders: []RelayHolder{}}
	for rows.Next() {
		var h RelayHolder
		var since *time.Time
		if err := rows.Scan(&h.PID, &h.Client, &h.Application, &since); err != nil {
			return Relay{}, fmt.Errorf("reading the relay lock from pg_locks: %w", err)
		}
		if since != nil {
			h.Since = *since
		}
		h.Holder = fmt.Sprintf("backend pid %d", h.PID)
		r.Holders = append(r.Holders, h)
	}
	if err := rows.Err(); err != nil {
		return Relay{}, fmt.Errorf("reading the relay lock from pg_locks: %w", err)
	}
	r.Active = len(r.Holders) > 0
	return r, nil
}
