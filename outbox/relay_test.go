package outbox_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/outbox"
)

// checkPerKeyOrder drops republished duplicates (same message-id) and
// asserts that, per key, the values are 1..n in order.
func checkPerKeyOrder(t *testing.T, recs []*kgo.Record, keys []string, n int) {
	t.Helper()
	seen := map[string]bool{}
	next := map[string]int{}
	for _, r := range recs {
		id, ok := header(r, outbox.HeaderMessageID)
		if !ok {
			t.Fatalf("record %s/%d without %s", r.Topic, r.Offset, outbox.HeaderMessageID)
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		k := string(r.Key)
		v, err := strconv.Atoi(string(r.Value))
		if err != nil {
			t.Fatalf("value %q", r.Value)
		}
		if v != next[k]+1 {
			t.Fatalf("key %s: got %d after %d (out of order or missing)", k, v, next[k])
		}
		next[k] = v
	}
	for _, k := range keys {
		if next[k] != n {
			t.Fatalf("key %s: last seq %d, want %d", k, next[k], n)
		}
	}
}

// TestConcurrentWritersKeepPerKeyOrder runs writers adding seq 1..n for a
// few keys, several writers per key, each seq in its own transaction that
// lingers a random while after Add, so ids are drawn in one order and
// transactions commit in another. A relay that read "id > last seen" fails
// this: while the transaction holding id i lingers, a later id j > i of
// another key commits, the relay publishes j and moves past i, and seq i is
// missing. A relay that published rows out of commit order for a key fails
// the order check.
func TestConcurrentWritersKeepPerKeyOrder(t *testing.T) {
	e := setup(t, 4, "seq")
	ctx := context.Background()
	const n, writersPerKey = 30, 3
	keys := []string{"k0", "k1", "k2", "k3"}
	e.startRelay(t, e.fastConfig(t))

	var wg sync.WaitGroup
	errs := make(chan error, len(keys)*writersPerKey)
	for _, k := range keys {
		var mu sync.Mutex // hands out k's sequence numbers in Add order
		seq := 0
		for range writersPerKey {
			wg.Go(func() {
				for {
					tx, err := e.pool.Begin(ctx)
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					if seq == n {
						mu.Unlock()
						tx.Rollback(ctx)
						return
					}
					seq++
					// Add blocks while another writer's transaction
					// holding k is open, so k's seqs commit in order.
					err = e.ob.Add(ctx, tx, outbox.Message{Topic: "seq", Key: []byte(k), Value: seqValue(seq)})
					mu.Unlock()
					if err != nil {
						tx.Rollback(ctx)
						errs <- err
						return
					}
					time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond) // the transaction lingers
					if err := tx.Commit(ctx); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	recs := e.consume(t, "seq").waitFor(n*len(keys), 30*time.Second)
	checkPerKeyOrder(t, recs, keys, n)
}

// TestOneActiveRelayAndTakeover runs two relays on one table: only the lease
// holder publishes; when its connections are terminated, or it stops, the
// other takes over within seconds, and nothing is lost or reordered.
func TestOneActiveRelayAndTakeover(t *testing.T) {
	e := setup(t, 3, "t")
	ctx := context.Background()
	var active [2]atomic.Bool
	var published [2]atomic.Int64
	relays := make([]*runningRelay, 2)
	for i := range relays {
		cfg := e.fastConfig(t)
		cfg.Hooks = outbox.RelayHooks{
			OnActive:    func(a bool) { active[i].Store(a) },
			OnPublished: func(n int, _ []time.Duration) { published[i].Add(int64(n)) },
		}
		relays[i] = e.startRelay(t, cfg)
	}
	holder := func() int {
		switch a, b := active[0].Load(), active[1].Load(); {
		case a && !b:
			return 0
		case b && !a:
			return 1
		}
		return -1
	}
	eventually(t, 5*time.Second, "one active relay", func() bool { return holder() >= 0 })
	first := holder()

	keys := []string{"a", "b", "c"}
	seq := 0
	addRound := func() {
		seq++
		for _, k := range keys {
			e.add(t, outbox.Message{Topic: "t", Key: []byte(k), Value: seqValue(seq)})
		}
	}
	c := e.consume(t, "t")
	for range 5 {
		addRound()
	}
	c.waitDistinct(5*len(keys), 10*time.Second)
	if got := published[1-first].Load(); got != 0 {
		t.Fatalf("standby relay published %d rows", got)
	}
	if holder() != first {
		t.Fatalf("active relay changed without a failure")
	}

	// Kill every other connection to the database (the relays' pooled
	// ones, the listening one): the active relay's term ends, some relay
	// (perhaps the same one, reconnected) takes over.
	if _, err := e.pool.Exec(ctx, "select pg_terminate_backend(pid) from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()"); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		addRound()
	}
	eventually(t, 10*time.Second, "an active relay after the connection was killed", func() bool { return holder() >= 0 })
	c.waitDistinct(10*len(keys), 10*time.Second)

	// Stop the active relay: the other one takes over within seconds.
	stopped := holder()
	start := time.Now()
	relays[stopped].stop()
	eventually(t, 5*time.Second, "the standby to take over", func() bool { return holder() == 1-stopped })
	t.Logf("takeover after %v", time.Since(start))
	for range 5 {
		addRound()
	}
	recs := c.waitDistinct(15*len(keys), 10*time.Second)
	// OnPublished runs once the relay has the broker's acks and deleted the
	// rows, which can be after the consumer saw the records: await it.
	eventually(t, 5*time.Second, "the remaining relay to report what it published", func() bool {
		return published[1-stopped].Load() > 0
	})
	checkPerKeyOrder(t, recs, keys, 15)
}

// A relay stopped after the broker acknowledged a batch and before it
// deleted the rows (a graceful shutdown, not a crash) still deletes them
// before Run returns: the relay started next publishes only what came
// after, and nothing twice.
func TestStoppedRelayDeletesWhatKafkaAcknowledged(t *testing.T) {
	e := setup(t, 1, "t")
	e.add(t, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("1")},
		outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("2")})
	cfg := e.fastConfig(t)
	var r1 *runningRelay
	started := make(chan struct{})
	cfg.Hooks.AfterAck = func(context.Context, []int64) error {
		<-started
		r1.cancel() // the stop arrives between the ack and the delete
		return nil
	}
	r1 = e.startRelay(t, cfg)
	close(started)
	<-r1.done
	if r1.err != nil {
		t.Fatalf("Run returned %v after a stop, want nil", r1.err)
	}
	if n := e.backlog(t); n != 0 {
		t.Fatalf("backlog after a stop between ack and delete = %d, want 0: the acknowledged rows were left to publish again", n)
	}
	e.startRelay(t, e.fastConfig(t))
	e.add(t, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("3")})
	c := e.consume(t, "t")
	recs := c.waitFor(3, 10*time.Second)
	eventually(t, 5*time.Second, "empty backlog", func() bool { return e.backlog(t) == 0 })
	if n := e.produced(t, "t"); n != 3 {
		t.Fatalf("%d records produced, want 3: the stopped relay's batch was published again", n)
	}
	for i, want := range []string{"1", "2", "3"} {
		if string(recs[i].Value) != want {
			t.Fatalf("record %d is %q, want %q", i, recs[i].Value, want)
		}
	}
}

// A relay stopped while its produce is in flight (the broker holds the
// produce request until after the stop) still honours the acknowledgements
// that come back within its stop's grace: it deletes the acknowledged rows
// before Run returns, and the next relay publishes nothing of them again.
func TestRelayStoppedDuringProduceDeletesTheLateAcks(t *testing.T) {
	e := setup(t, 1, "t")
	e.add(t, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("1")},
		outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("2")})
	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.kafka.ControlKey(kmsg.Produce.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		once.Do(func() {
			close(arrived)
			e.kafka.SleepControl(func() { <-release })
		})
		return nil, nil, false // then the broker handles it as usual
	})
	r1 := e.startRelay(t, e.fastConfig(t))
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay produced nothing in 30s")
	}
	r1.cancel() // stopped while the broker holds the produce
	close(release)
	<-r1.done
	if r1.err != nil {
		t.Fatalf("Run returned %v after a stop, want nil", r1.err)
	}
	if n := e.backlog(t); n != 0 {
		t.Fatalf("backlog after a stop during the produce = %d, want 0: the acknowledgements that came back after the stop were dropped", n)
	}
	e.startRelay(t, e.fastConfig(t))
	e.add(t, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("3")})
	c := e.consume(t, "t")
	recs := c.waitFor(3, 10*time.Second)
	eventually(t, 5*time.Second, "empty backlog", func() bool { return e.backlog(t) == 0 })
	if n := e.produced(t, "t"); n != 3 {
		t.Fatalf("%d records produced, want 3: the stopped relay's batch was published again", n)
	}
	for i, want := range []string{"1", "2", "3"} {
		if string(recs[i].Value) != want {
			t.Fatalf("record %d is %q, want %q", i, recs[i].Value, want)
		}
	}
}

// TestCrashAfterAckRepublishesWithSameMessageID stops a relay after the
// broker acknowledged a batch and before it deleted the rows; the next relay
// publishes the batch again, with the same message ids.
func TestCrashAfterAckRepublishesWithSameMessageID(t *testing.T) {
	e := setup(t, 1, "t")
	ctx := context.Background()
	e.add(t, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("1")},
		outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("2")})
	crash := errors.New("simulated crash")
	cfg := e.fastConfig(t)
	cfg.Hooks.AfterAck = func(context.Context, []int64) error { return crash }
	r1 := e.startRelay(t, cfg)
	<-r1.done
	if !errors.Is(r1.err, crash) {
		t.Fatalf("Run returned %v, want the AfterAck error", r1.err)
	}
	if n := e.backlog(t); n != 2 {
		t.Fatalf("backlog after the crash = %d, want 2 (rows not deleted)", n)
	}
	c := e.consume(t, "t")
	c.waitFor(2, 10*time.Second)

	e.startRelay(t, e.fastConfig(t))
	recs := c.waitFor(4, 10*time.Second)
	eventually(t, 5*time.Second, "empty backlog", func() bool { return e.backlog(t) == 0 })
	for i := range 2 {
		a, _ := header(recs[i], outbox.HeaderMessageID)
		b, _ := header(recs[i+2], outbox.HeaderMessageID)
		if a == "" || a != b || string(recs[i].Value) != string(recs[i+2].Value) {
			t.Fatalf("record %d: first publish %q id %q, republish %q id %q", i, recs[i].Value, a, recs[i+2].Value, b)
		}
	}
	ids := map[string]bool{}
	for _, r := range recs {
		id, _ := header(r, outbox.HeaderMessageID)
		ids[id] = true
	}
	if len(ids) != 2 {
		t.Fatalf("%d distinct message ids, want 2", len(ids))
	}
	_ = ctx
}
