package outbox_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/outbox"
)

// gate stops a relay at its pause points while closed: it stands for the
// relay's process paused (SIGSTOP, a long GC) at the first point it reaches.
type gate struct {
	mu      sync.Mutex
	closed  chan struct{} // nil while open
	reached chan string   // the points reached while closed
}

func newGate() *gate { return &gate{reached: make(chan string, 16)} }

// close makes every later pause point block until open.
func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = make(chan struct{})
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed != nil {
		close(g.closed)
		g.closed = nil
	}
}

// pause is the relay's pause function: it blocks while the gate is closed
// at one of points (all points when none are given).
func (g *gate) pause(points ...string) func(string) {
	return func(point string) {
		if len(points) > 0 && !strings.Contains(strings.Join(points, ","), point) {
			return
		}
		g.mu.Lock()
		c := g.closed
		g.mu.Unlock()
		if c == nil {
			return
		}
		select {
		case g.reached <- point:
		default:
		}
		<-c
	}
}

// awaitReached waits until the relay is held at point.
func (g *gate) awaitReached(t *testing.T, point string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case p := <-g.reached:
			if p == point {
				return
			}
		case <-deadline:
			t.Fatalf("the relay did not reach pause point %q within 10s", point)
		}
	}
}

// startPausable runs a relay with cfg whose pause points call g.
func (e *env) startPausable(t *testing.T, cfg outbox.RelayConfig, pause func(string)) *runningRelay {
	t.Helper()
	relay, err := outbox.NewRelay(e.pool, e.brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	outbox.SetPauses(relay, pause)
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningRelay{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		defer relay.Close()
		r.err = relay.Run(ctx)
	}()
	t.Cleanup(r.stop)
	return r
}

// leaseConfig is fastConfig with a short lease, so that a paused relay
// loses it quickly.
func (e *env) leaseConfig(t *testing.T) outbox.RelayConfig {
	cfg := e.fastConfig(t)
	cfg.LeaseDuration = 400 * time.Millisecond
	return cfg
}

// distinctIDs counts the records and their distinct message ids.
func distinctIDs(recs []*kgo.Record) (records, distinct int) {
	ids := map[string]bool{}
	for _, r := range recs {
		id, _ := header(r, outbox.HeaderMessageID)
		ids[id] = true
	}
	return len(recs), len(ids)
}

// A relay paused past its lease, at one of its pause points, wakes to find
// a newer relay holding the lease: it publishes nothing a consumer reading
// committed records sees, deletes nothing, and stands by. At "produce" it
// stopped after reading a batch and checking its lease, before producing (a
// check of the lease just before producing is not enough); at "commit" its
// records had reached the brokers, in a transaction the newer relay's
// takeover aborted.
func TestRelayPausedPastItsLeaseIsFenced(t *testing.T) {
	for _, point := range []string{"produce", "commit"} {
		t.Run(point, func(t *testing.T) {
			e := setup(t, 2, "t")
			// g holds the relay at point, beat its renewals: opened one
			// after the other, the relay acts on its lost lease before
			// its renewal could tell it, the worst order.
			g, beat := newGate(), newGate()
			zcfg := e.leaseConfig(t)
			zActive := make(chan bool, 8)
			var zPublished atomic.Int64
			zcfg.Hooks.OnActive = func(a bool) { zActive <- a }
			zcfg.Hooks.OnPublished = func(n int, _ []time.Duration) { zPublished.Add(int64(n)) }
			e.startPausable(t, zcfg, func(p string) {
				if p == "renew" {
					beat.pause()(p)
				} else {
					g.pause(point)(p)
				}
			})
			t.Cleanup(g.open) // before the relay's stop, which awaits them
			t.Cleanup(beat.open)
			if !<-zActive {
				t.Fatal("first OnActive(false)")
			}

			// The zombie reads the batch and stops at point; its
			// renewals stop too, as in a paused process.
			g.close()
			beat.close()
			const n = 20
			for i := range n {
				e.add(t, outbox.Message{Topic: "t", Key: []byte{byte('a' + i%4)}, Value: []byte{byte(i)}})
			}
			g.awaitReached(t, point)

			// A newer relay takes the expired lease and publishes the
			// batch.
			ncfg := e.leaseConfig(t)
			nActive := make(chan bool, 8)
			ncfg.Hooks.OnActive = func(a bool) { nActive <- a }
			e.startRelay(t, ncfg)
			if !<-nActive {
				t.Fatal("newer relay: first OnActive(false)")
			}
			c := e.consume(t, "t")
			c.waitDistinct(n, 10*time.Second)
			eventually(t, 10*time.Second, "empty backlog", func() bool { return e.backlog(t) == 0 })

			// The zombie wakes, its renewals still held: fenced, its
			// term ends.
			g.open()
			select {
			case a := <-zActive:
				if a {
					t.Fatal("zombie OnActive(true) before its term ended")
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the zombie's term did not end within 10s of waking")
			}
			beat.open()
			if got := zPublished.Load(); got != 0 {
				t.Fatalf("the zombie reported %d rows published", got)
			}
			// Rows added now are published once, by the newer relay.
			for i := range n {
				e.add(t, outbox.Message{Topic: "t", Key: []byte{byte('a' + i%4)}, Value: []byte{byte(n + i)}})
			}
			recs := c.waitDistinct(2*n, 10*time.Second)
			eventually(t, 10*time.Second, "empty backlog", func() bool { return e.backlog(t) == 0 })
			if records, distinct := distinctIDs(recs); records != distinct || distinct != 2*n {
				t.Fatalf("a committed reader saw %d records with %d distinct message ids, want %d of each", records, distinct, 2*n)
			}
		})
	}
}

// A relay that dies (here: its process stopped for good, renewals and all)
// is replaced within LeaseDuration + TakeoverInterval (5s with the
// defaults, which this test uses), by the database's clock: from the dead
// holder's last renewal to the new holder's takeover.
func TestTakeoverAfterTheHolderDies(t *testing.T) {
	e := setup(t, 1, "t")
	g := newGate()
	cfg := outbox.RelayConfig{Outbox: e.ob, Logger: e.fastConfig(t).Logger}
	dead := make(chan bool, 8)
	cfg.Hooks.OnActive = func(a bool) { dead <- a }
	e.startPausable(t, cfg, g.pause())
	if !<-dead {
		t.Fatal("first OnActive(false)")
	}
	ctx := context.Background()
	before, err := e.ob.Lease(ctx, e.pool)
	if err != nil {
		t.Fatal(err)
	}
	g.close() // it dies
	t.Cleanup(g.open)

	cfg2 := outbox.RelayConfig{Outbox: e.ob, Logger: cfg.Logger}
	took := make(chan bool, 8)
	cfg2.Hooks.OnActive = func(a bool) { took <- a }
	e.startRelay(t, cfg2)
	select {
	case a := <-took:
		if !a {
			t.Fatal("OnActive(false) first")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no takeover within 30s of the holder's death")
	}
	after, err := e.ob.Lease(ctx, e.pool)
	if err != nil {
		t.Fatal(err)
	}
	if after.Epoch != before.Epoch+1 || after.Owner == before.Owner {
		t.Fatalf("lease after the takeover: epoch %d owner %s; before: epoch %d owner %s", after.Epoch, after.Owner, before.Epoch, before.Owner)
	}
	// The dead holder renewed last at most a renewal interval after
	// `before` was read; renewals that had started may still land.
	gap := after.Since.Sub(before.Renewed)
	bound := outbox.DefaultLeaseDuration + outbox.DefaultTakeoverInterval + outbox.DefaultLeaseDuration/4 + time.Second
	t.Logf("takeover %v after the dead holder's last renewal read (lease %v, takeover interval %v)", gap, outbox.DefaultLeaseDuration, outbox.DefaultTakeoverInterval)
	if gap > bound || gap < outbox.DefaultLeaseDuration {
		t.Fatalf("takeover %v after the last renewal read, want between the lease duration (%v) and %v", gap, outbox.DefaultLeaseDuration, bound)
	}
}

// Lease reports the holder of the table's lease: none before any relay ran,
// this process's host and pid while one is active, expired after it
// stopped.
func TestOutboxLeaseShowsTheHolder(t *testing.T) {
	e := setup(t, 1, "t")
	ctx := context.Background()
	l, err := e.ob.Lease(ctx, e.pool)
	if err != nil || l.Epoch != 0 {
		t.Fatalf("Lease before any relay = %+v, %v; want epoch 0", l, err)
	}
	cfg := e.fastConfig(t)
	active := make(chan bool, 4)
	cfg.Hooks.OnActive = func(a bool) { active <- a }
	r := e.startRelay(t, cfg)
	<-active
	l, err = e.ob.Lease(ctx, e.pool)
	if err != nil {
		t.Fatal(err)
	}
	if l.Epoch != 1 || l.Expired || !strings.Contains(l.Holder, " pid ") || !strings.HasPrefix(l.TransactionalID, outbox.TransactionalIDPrefix) {
		t.Fatalf("Lease while active = %+v", l)
	}
	r.stop()
	if l, err = e.ob.Lease(ctx, e.pool); err != nil || !l.Expired {
		t.Fatalf("Lease after the relay stopped = %+v, %v; want expired (released)", l, err)
	}
}

// Nothing the relay sets stays on a connection: on a pool of two
// connections shared with the relay, 200 of 200 fresh transactions of
// another user, after the relay published, run with synchronous_commit on
// and their own application_name.
func TestRelayLeavesNoSettingOnPooledConnections(t *testing.T) {
	e := setup(t, 1, "t")
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(e.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rcfg := e.fastConfig(t)
	var published atomic.Int64
	rcfg.Hooks.OnPublished = func(n int, _ []time.Duration) { published.Add(int64(n)) }
	relay, err := outbox.NewRelay(pool, e.brokers, rcfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); relay.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done; relay.Close() })
	for i := range 50 {
		e.add(t, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte{byte(i)}})
	}
	eventually(t, 10*time.Second, "50 rows published", func() bool { return published.Load() == 50 })
	stop()
	<-done
	on := 0
	for range 200 {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var sc, app string
		if err := tx.QueryRow(ctx, "select current_setting('synchronous_commit'), current_setting('application_name')").Scan(&sc, &app); err != nil {
			t.Fatal(err)
		}
		tx.Rollback(ctx)
		if sc == "on" && !strings.HasPrefix(app, "exactly relay") {
			on++
		}
	}
	if on != 200 {
		t.Fatalf("%d of 200 fresh transactions ran with synchronous_commit on and their own application_name", on)
	}
}

// A relay paused inside the transaction of its delete, after the lease
// check (holding the lease row FOR SHARE), does not keep a standby from
// taking over: the server ends the idle transaction after a quarter of the
// lease, and the standby's takeover then goes through. The paused relay's
// delete fails when it wakes, and its term ends.
func TestRelayPausedInsideItsTransactionIsTakenOver(t *testing.T) {
	e := setup(t, 1, "t")
	g, beat := newGate(), newGate()
	zcfg := e.leaseConfig(t)
	zActive := make(chan bool, 8)
	zcfg.Hooks.OnActive = func(a bool) { zActive <- a }
	e.startPausable(t, zcfg, func(p string) {
		switch p {
		case "renew":
			beat.pause()(p)
		case "hold":
			g.pause()(p)
		}
	})
	t.Cleanup(g.open)
	t.Cleanup(beat.open)
	if !<-zActive {
		t.Fatal("first OnActive(false)")
	}
	g.close()
	beat.close()
	e.add(t, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("1")})
	g.awaitReached(t, "hold")

	ncfg := e.leaseConfig(t)
	nActive := make(chan bool, 8)
	ncfg.Hooks.OnActive = func(a bool) { nActive <- a }
	e.startRelay(t, ncfg)
	select {
	case a := <-nActive:
		if !a {
			t.Fatal("standby: OnActive(false) first")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no takeover within 10s while the holder is paused inside its transaction")
	}
	eventually(t, 10*time.Second, "empty backlog", func() bool { return e.backlog(t) == 0 })
	g.open()
	select {
	case a := <-zActive:
		if a {
			t.Fatal("paused relay: OnActive(true) before its term ended")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the paused relay's term did not end within 10s of waking")
	}
}
