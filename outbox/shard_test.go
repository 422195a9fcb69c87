package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

func TestNewShardedRejectsBadCount(t *testing.T) {
	for _, n := range []int{0, -1, outbox.MaxShards + 1} {
		if _, err := outbox.NewSharded(n); err == nil {
			t.Errorf("NewSharded(%d) succeeded", n)
		}
	}
	s, err := outbox.NewSharded(3, outbox.WithTable("app", "events"))
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range s.Shards() {
		if got, want := o.Table().Sanitize(), fmt.Sprintf(`"app"."events_%d"`, i); got != want {
			t.Errorf("shard %d table %s, want %s", i, got, want)
		}
	}
	if _, err := outbox.NewShardedRelay(testenv.DB(t), []string{"x:1"}, s, outbox.RelayConfig{Outbox: outbox.New()}); err == nil {
		t.Error("NewShardedRelay accepted a RelayConfig.Outbox")
	}
}

// TestShardOfKeyIsStable checks that a key's shard depends only on (topic,
// key) and the shard count, and that keys spread over every shard.
func TestShardOfKeyIsStable(t *testing.T) {
	a, _ := outbox.NewSharded(4)
	b, _ := outbox.NewSharded(4)
	used := map[int]bool{}
	for i := range 64 {
		k := []byte(fmt.Sprint("key-", i))
		sa, sb := a.Shard("t", k), b.Shard("t", k)
		if sa != sb || sa < 0 || sa >= 4 {
			t.Fatalf("key %s: shard %d and %d", k, sa, sb)
		}
		used[sa] = true
	}
	if len(used) != 4 {
		t.Fatalf("64 keys used shards %v, want all 4", used)
	}
	if got := a.Shard("t", nil); got != -1 {
		t.Fatalf("Shard of a nil key = %d, want -1 (round-robin)", got)
	}
}

// TestShardedRelayPerKeyOrderCrashAndRollback is the table relay's crash
// points on four shards: concurrent writers add seq 1..n for several keys
// (each seq in its own transaction) plus keyless rows; one shard's relay
// dies after the broker's ack and before its delete; a fresh sharded relay
// republishes that batch with the same message ids; rows of rolled-back
// transactions are never published; every key's seqs arrive in order; and
// every shard's table carried rows and ends empty.
func TestShardedRelayPerKeyOrderCrashAndRollback(t *testing.T) {
	pool := testenv.DB(t)
	ctx := context.Background()
	s, err := outbox.NewSharded(4)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	k := testenv.Kafka(t, 4, "seq")
	e := &env{pool: pool, brokers: testenv.Brokers(k), kafka: k}

	const n = 20
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	var wg sync.WaitGroup
	errs := make(chan error, len(keys)+1)
	for _, key := range keys {
		wg.Go(func() {
			for seq := 1; seq <= n; seq++ {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if err := s.Add(ctx, tx, outbox.Message{Topic: "seq", Key: []byte(key), Value: seqValue(seq)}); err != nil {
						return err
					}
					return s.Add(ctx, tx, outbox.Message{Topic: "keyless", Value: []byte(key)})
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// A rolled-back transaction touching every shard.
	wg.Go(func() {
		tx, err := pool.Begin(ctx)
		if err != nil {
			errs <- err
			return
		}
		for _, key := range keys {
			if err := s.Add(ctx, tx, outbox.Message{Topic: "seq", Key: []byte(key), Value: []byte("rolled-back")}); err != nil {
				errs <- err
			}
		}
		errs <- tx.Rollback(ctx)
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i, o := range s.Shards() {
		c, _, err := o.Backlog(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		if c == 0 {
			t.Fatalf("shard %d received no rows", i)
		}
	}

	crash := errors.New("simulated crash")
	var crashed atomic.Bool
	var crashedIDs []int64
	cfg := e.fastConfig(t)
	cfg.Outbox = nil
	cfg.Hooks.AfterAck = func(_ context.Context, ids []int64) error {
		if crashed.CompareAndSwap(false, true) {
			crashedIDs = ids
			return crash
		}
		return nil
	}
	r1, err := outbox.NewShardedRelay(pool, e.brokers, s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.Run(ctx); !errors.Is(err, crash) {
		t.Fatalf("Run returned %v, want the AfterAck error", err)
	}
	r1.Close()

	cfg.Hooks.AfterAck = nil
	r2, err := outbox.NewShardedRelay(pool, e.brokers, s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r2.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done; r2.Close() })

	c := e.consume(t, "seq")
	recs := c.waitDistinct(n*len(keys), 30*time.Second)
	eventually(t, 10*time.Second, "empty backlog", func() bool {
		cnt, _, err := s.Backlog(ctx, pool)
		return err == nil && cnt == 0
	})
	byID := map[string][]string{}
	for _, r := range recs {
		if string(r.Value) == "rolled-back" {
			t.Fatal("a rolled-back transaction's row was published")
		}
	}
	checkPerKeyOrder(t, recs, keys, n)
	// The crashed batch was republished with the same ids: some message id
	// of topic seq or keyless appears twice, with one value. The backlog is
	// empty, so everything was produced: read every record produced.
	all := append(c.waitFor(int(e.produced(t, "seq")), 10*time.Second),
		e.consume(t, "keyless").waitFor(int(e.produced(t, "keyless")), 10*time.Second)...)
	for _, r := range all {
		id, _ := header(r, outbox.HeaderMessageID)
		byID[id] = append(byID[id], string(r.Value))
	}
	dups := 0
	for id, vals := range byID {
		for _, v := range vals[1:] {
			if v != vals[0] {
				t.Fatalf("message id %s carried %q and %q", id, vals[0], v)
			}
		}
		if len(vals) > 1 {
			dups++
		}
	}
	if dups < len(crashedIDs) {
		t.Fatalf("%d message ids published twice, want at least the %d rows of the crashed batch", dups, len(crashedIDs))
	}
}

// TestShardedRelaysOneActivePerShardAndTakeover runs two sharded relays on
// four shards: exactly one relay is active per shard (four activations in
// all, never more), and when one stops, the other takes over its shards and
// publishes what is written next.
func TestShardedRelaysOneActivePerShardAndTakeover(t *testing.T) {
	pool := testenv.DB(t)
	ctx := context.Background()
	s, err := outbox.NewSharded(4)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	k := testenv.Kafka(t, 4, "t")
	e := &env{pool: pool, brokers: testenv.Brokers(k), kafka: k}
	var active, peak atomic.Int64
	cfg := e.fastConfig(t)
	cfg.Outbox = nil
	cfg.Hooks.OnActive = func(a bool) {
		if !a {
			active.Add(-1)
			return
		}
		n := active.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
	}
	type running struct {
		stop func()
	}
	start := func() running {
		r, err := outbox.NewShardedRelay(pool, e.brokers, s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		var once sync.Once
		stop := func() {
			once.Do(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("sharded relay: %v", err)
				}
				r.Close()
			})
		}
		t.Cleanup(stop)
		return running{stop}
	}
	add := func(from, to int) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for i := from; i < to; i++ {
				if err := s.Add(ctx, tx, outbox.Message{Topic: "t", Key: []byte(fmt.Sprint("k", i%8)), Value: seqValue(i)}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	a := start()
	eventually(t, 5*time.Second, "four active shard relays", func() bool { return active.Load() == 4 })
	start()
	c := e.consume(t, "t")
	add(0, 40)
	c.waitDistinct(40, 10*time.Second)
	if p := peak.Load(); p != 4 {
		t.Fatalf("peak %d active shard relays, want 4 (one per shard)", p)
	}
	a.stop()
	eventually(t, 10*time.Second, "the standby to take over all four shards", func() bool { return active.Load() == 4 })
	add(40, 80)
	c.waitDistinct(80, 10*time.Second)
	if p := peak.Load(); p != 4 {
		t.Fatalf("peak %d active shard relays, want 4", p)
	}
}
