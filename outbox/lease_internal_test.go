package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/testenv"
)

// The lease decides, not the clock: a relay whose lease was taken over
// (after it expired) deletes nothing, in the transaction of its delete,
// and cannot renew; the new holder can. Two relays that both see an
// expired lease get it one at a time.
func TestLeaseHoldRefusesAStaleEpoch(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	ob := New()
	if err := ob.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	relay := func() *Relay {
		r, err := NewRelay(pool, []string{"127.0.0.1:1"}, RelayConfig{Outbox: ob, LeaseDuration: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		return r
	}
	a, b := relay(), relay()
	old, err := a.acquire(ctx)
	if err != nil || old == nil {
		t.Fatalf("first acquire = %v, %v", old, err)
	}
	if got, err := b.acquire(ctx); err != nil || got != nil {
		t.Fatalf("acquire of a held lease = %v, %v; want none", got, err)
	}
	for i := range 3 {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return ob.Add(ctx, tx, Message{Topic: "t", Key: []byte("k"), Value: []byte{byte(i)}})
		}); err != nil {
			t.Fatal(err)
		}
	}
	// The old holder stops renewing; b takes the lease once it expired.
	var cur *term
	deadline := time.Now().Add(10 * time.Second)
	for cur == nil {
		if time.Now().After(deadline) {
			t.Fatal("no takeover within 10s of a 100ms lease")
		}
		if cur, err = b.acquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if cur.epoch != old.epoch+1 {
		t.Fatalf("epoch after takeover = %d, want %d", cur.epoch, old.epoch+1)
	}
	deleteAll := func(tm *term) error {
		return tm.guarded(ctx, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "delete from "+ob.quoted)
			return err
		})
	}
	if err := deleteAll(old); !errors.Is(err, errLeaseLost) {
		t.Fatalf("delete by the stale holder: %v, want errLeaseLost", err)
	}
	if n, _, err := ob.Backlog(ctx, pool); err != nil || n != 3 {
		t.Fatalf("backlog after the stale delete = %d, %v; want 3", n, err)
	}
	if ok, err := old.renew(ctx); ok || err != nil {
		t.Fatalf("renewal by the stale holder = %v, %v; want false", ok, err)
	}
	if ok, err := cur.renew(ctx); !ok || err != nil {
		t.Fatalf("renewal by the holder = %v, %v; want true", ok, err)
	}
	if err := deleteAll(cur); err != nil {
		t.Fatalf("delete by the holder: %v", err)
	}
	if n, _, err := ob.Backlog(ctx, pool); err != nil || n != 0 {
		t.Fatalf("backlog after the holder's delete = %d, %v; want 0", n, err)
	}
	cur.release(ctx)
	if got, err := a.acquire(ctx); err != nil || got == nil || got.epoch != cur.epoch+1 {
		t.Fatalf("acquire after release = %+v, %v; want epoch %d", got, err, cur.epoch+1)
	}
}
