package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/deferred"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/internal/testenv/pgserver"
	"github.com/exactly-go/exactly/outbox"
)

// walEnv is one WAL subtest's database on the logical-replication server,
// its kfake cluster and a WALOutbox.
type walEnv struct {
	*env
	url  string
	slot string
	w    *outbox.WALOutbox
}

// TestWALRelay runs the WAL relay's tests on one private PostgreSQL started
// with wal_level=logical (the shared test server does not have it), each
// subtest in its own database with its own slot.
func TestWALRelay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgserver.Start(ctx, pgserver.Options{LogicalReplication: true})
	if err != nil {
		t.Fatalf("starting PostgreSQL with wal_level=logical: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stopping PostgreSQL: %v", err)
		}
	})
	n := 0
	setupWAL := func(t *testing.T, partitions int32, topics ...string) *walEnv {
		n++
		url, err := srv.CreateDatabase(ctx, fmt.Sprint("wal", n))
		if err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		k := testenv.Kafka(t, partitions, topics...)
		// Slots are per cluster: one per subtest.
		return &walEnv{env: &env{pool: pool, brokers: testenv.Brokers(k), kafka: k}, url: url, w: outbox.NewWAL(), slot: fmt.Sprint("slot", n)}
	}
	t.Run("CheckAndSetup", func(t *testing.T) { testWALCheckAndSetup(t, setupWAL(t, 1, "t")) })
	t.Run("CrashAfterAckRollbackAndConfirm", func(t *testing.T) { testWALCrashAfterAck(t, setupWAL(t, 1, "t")) })
	t.Run("StoppedRelayConfirmsWhatKafkaAcknowledged", func(t *testing.T) { testWALStopAfterAck(t, setupWAL(t, 1, "t")) })
	t.Run("RefusedTopicStallsThenResumes", func(t *testing.T) { testWALRefusedTopic(t, setupWAL(t, 1, "t")) })
	t.Run("SmallBatchesCrashMidStream", func(t *testing.T) { testWALSmallBatches(t, setupWAL(t, 3, "t")) })
	t.Run("PerKeyOrderUnderTakeover", func(t *testing.T) { testWALPerKeyOrder(t, setupWAL(t, 4, "seq")) })
	t.Run("StandbyLogsStandbyThenActive", func(t *testing.T) { testWALStandbyLogs(t, setupWAL(t, 1, "t")) })
}

// testWALStandbyLogs: a WAL relay whose slot another relay streams says it
// is on standby, and says when it becomes active.
func testWALStandbyLogs(t *testing.T, e *walEnv) {
	first := e.relayConfig(t)
	active := make(chan bool, 4)
	first.Hooks.OnActive = func(a bool) { active <- a }
	r1 := e.startWALRelay(t, first)
	if !<-active {
		t.Fatal("first OnActive(false)")
	}
	logs := make(messages, 100)
	second := e.relayConfig(t)
	second.Logger = slog.New(logs)
	e.startWALRelay(t, second)
	logs.await(t, "outbox WAL relay on standby")
	r1.stop()
	logs.await(t, "outbox WAL relay active")
}

// relayConfig is a WAL relay configuration with short intervals.
func (e *walEnv) relayConfig(t *testing.T) outbox.WALRelayConfig {
	return outbox.WALRelayConfig{
		ConnString:       e.url,
		Slot:             e.slot,
		TakeoverInterval: 100 * time.Millisecond,
		RetryBackoff:     50 * time.Millisecond,
		ProduceTimeout:   10 * time.Second,
		Logger:           slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

// startWALRelay runs a WAL relay until stopped or the test ends.
func (e *walEnv) startWALRelay(t *testing.T, cfg outbox.WALRelayConfig) *runningRelay {
	t.Helper()
	relay, err := outbox.NewWALRelay(e.brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
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

// testWALCrashAfterAck: a relay dies after the broker's ack and before it
// confirms the LSN; the next relay republishes the batch with the same
// message ids and confirms it; a rolled-back transaction's message is never
// published; messages queued in a consumer's transaction buffer are emitted
// in order.
func testWALCrashAfterAck(t *testing.T, e *walEnv) {
	ctx := context.Background()
	add := func(commit bool, msgs ...outbox.Message) {
		t.Helper()
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		for _, m := range msgs {
			if err := e.w.Add(ctx, tx, m); err != nil {
				t.Fatal(err)
			}
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The relay must exist (its slot) before the writes it should see.
	crash := errors.New("simulated crash")
	cfg := e.relayConfig(t)
	var crashLSN atomic.Uint64
	active := make(chan bool, 4)
	cfg.Hooks.OnActive = func(a bool) { active <- a }
	release := make(chan struct{})
	cfg.Hooks.AfterAck = func(_ context.Context, lsn uint64) error {
		crashLSN.Store(lsn)
		<-release
		return crash
	}
	r1 := e.startWALRelay(t, cfg)
	if !<-active {
		t.Fatal("first OnActive(false)")
	}
	add(true, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("1"), Headers: []handler.Header{{Key: "h", Value: []byte("x")}}},
		outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("2"), ID: "chosen-id"})
	add(false, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("rolled-back")})
	// A consumer transaction's buffered messages: emitted at flush, in order.
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		buf := deferred.New(tx)
		bctx := deferred.With(ctx, buf)
		for v := 3; v <= 5; v++ {
			if err := e.w.AddJSON(bctx, tx, "t", []byte("k"), v); err != nil {
				return err
			}
		}
		return buf.Flush(bctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	c := e.consume(t, "t")
	first := c.waitFor(1, 10*time.Second)
	close(release)
	<-r1.done
	if !errors.Is(r1.err, crash) {
		t.Fatalf("Run returned %v, want the AfterAck error", r1.err)
	}
	var confirmed uint64
	if err := e.pool.QueryRow(ctx, "select coalesce(confirmed_flush_lsn - '0/0', 0)::bigint from pg_replication_slots where slot_name = $1", e.slot).Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	if confirmed >= crashLSN.Load() {
		t.Fatalf("slot confirmed %d, at or past the crashed batch's end %d", confirmed, crashLSN.Load())
	}
	firstCount := len(first)
	var walEnd uint64
	if err := e.pool.QueryRow(ctx, "select (pg_current_wal_lsn() - '0/0')::bigint").Scan(&walEnd); err != nil {
		t.Fatal(err)
	}

	e.startWALRelay(t, e.relayConfig(t))
	c.waitDistinct(5, 10*time.Second)
	recs := c.waitFor(firstCount+5, 10*time.Second)
	want := []string{"1", "2", "3", "4", "5"}
	ids := map[string]string{}
	var order []string
	for _, r := range recs {
		if string(r.Value) == "rolled-back" {
			t.Fatal("a rolled-back transaction's message was published")
		}
		id, ok := header(r, outbox.HeaderMessageID)
		if !ok || id == "" {
			t.Fatalf("record %q without a message-id", r.Value)
		}
		if prev, seen := ids[id]; seen {
			if prev != string(r.Value) {
				t.Fatalf("message id %s carried %q and %q", id, prev, r.Value)
			}
			continue
		}
		ids[id] = string(r.Value)
		order = append(order, string(r.Value))
	}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("distinct values in order %v, want %v", order, want)
	}
	if len(recs) <= 5 {
		t.Fatalf("%d records, want the crashed batch republished (more than 5)", len(recs))
	}
	if v, _ := header(recs[0], "h"); v != "x" {
		t.Fatalf("header h = %q, want x", v)
	}
	for id, v := range ids {
		if v == "2" && id != "chosen-id" {
			t.Fatalf("Message.ID not published: %q", id)
		}
	}
	eventually(t, 10*time.Second, "the slot to confirm every write", func() bool {
		var c uint64
		err := e.pool.QueryRow(ctx, "select (confirmed_flush_lsn - '0/0')::bigint from pg_replication_slots where slot_name = $1", e.slot).Scan(&c)
		return err == nil && c >= walEnd
	})
}

// testWALStopAfterAck: a relay stopped after the broker acknowledged a
// batch and before it confirmed the batch's position (a graceful shutdown,
// not a crash) still confirms it before Run returns: the slot is at or
// past the batch's end, and the relay started next publishes only what
// came after, nothing twice.
func testWALStopAfterAck(t *testing.T, e *walEnv) {
	ctx := context.Background()
	add := func(msgs ...outbox.Message) { t.Helper(); e.addTo(t, e.w, msgs...) }
	cfg := e.relayConfig(t)
	active := make(chan bool, 4)
	cfg.Hooks.OnActive = func(a bool) { active <- a }
	var r1 *runningRelay
	started := make(chan struct{})
	var ackLSN atomic.Uint64
	cfg.Hooks.AfterAck = func(_ context.Context, lsn uint64) error {
		<-started
		ackLSN.Store(lsn)
		r1.cancel() // the stop arrives between the ack and the confirmation
		return nil
	}
	r1 = e.startWALRelay(t, cfg)
	close(started)
	if !<-active {
		t.Fatal("first OnActive(false)")
	}
	add(outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("1")}, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("2")})
	<-r1.done
	if r1.err != nil {
		t.Fatalf("Run returned %v after a stop, want nil", r1.err)
	}
	var confirmed uint64
	if err := e.pool.QueryRow(ctx, "select coalesce(confirmed_flush_lsn - '0/0', 0)::bigint from pg_replication_slots where slot_name = $1", e.slot).Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	if confirmed < ackLSN.Load() {
		t.Fatalf("slot confirmed %d after the stop, before the acknowledged batch's end %d: the next session publishes it again", confirmed, ackLSN.Load())
	}
	e.startWALRelay(t, e.relayConfig(t))
	add(outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("3")})
	c := e.consume(t, "t")
	recs := c.waitFor(3, 10*time.Second)
	var got []string
	for _, r := range recs {
		got = append(got, string(r.Value))
	}
	if fmt.Sprint(got) != "[1 2 3]" {
		t.Fatalf("published %v, want [1 2 3]: nothing twice", got)
	}
	if n := e.produced(t, "t"); n != 3 {
		t.Fatalf("%d records produced, want 3: the stopped relay's batch was published again", n)
	}
}

// testWALPerKeyOrder: writers serialize each key on a counter row, so a
// key's seqs commit in order while transactions of different keys
// interleave and linger; two relays share the slot (one streams, one stands
// by) and the streaming one's connection is killed mid-way. Every key's seqs
// arrive complete and in order (republished duplicates dropped by
// message-id).
func testWALPerKeyOrder(t *testing.T, e *walEnv) {
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, "create table ctr (k text primary key, n int not null)"); err != nil {
		t.Fatal(err)
	}
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
	for _, k := range keys {
		if _, err := e.pool.Exec(ctx, "insert into ctr values ($1, 0)", k); err != nil {
			t.Fatal(err)
		}
	}
	var actives atomic.Int64
	for range 2 {
		cfg := e.relayConfig(t)
		cfg.Hooks.OnActive = func(a bool) {
			if a {
				actives.Add(1)
			}
		}
		e.startWALRelay(t, cfg)
	}
	eventually(t, 10*time.Second, "a streaming relay", func() bool { return actives.Load() >= 1 })
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(keys))
	write := func(k string) error {
		return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			var seq int
			if err := tx.QueryRow(ctx, "update ctr set n = n + 1 where k = $1 returning n", k).Scan(&seq); err != nil {
				return err
			}
			if seq > n {
				return nil
			}
			if err := e.w.Add(ctx, tx, outbox.Message{Topic: "seq", Key: []byte(k), Value: seqValue(seq)}); err != nil {
				return err
			}
			time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
			return nil
		})
	}
	for _, k := range keys {
		for range 2 {
			wg.Go(func() {
				for range n {
					if err := write(k); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	c := e.consume(t, "seq")
	c.waitDistinct(n*len(keys)/4, 20*time.Second)
	if _, err := e.pool.Exec(ctx, "select pg_terminate_backend(active_pid) from pg_replication_slots where active_pid is not null"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a relay streaming again after the kill", func() bool { return actives.Load() >= 2 })
	recs := c.waitDistinct(n*len(keys), 20*time.Second)
	checkPerKeyOrder(t, recs, keys, n)
}

func TestNewWALRelayRejectsBadConfig(t *testing.T) {
	for _, cfg := range []outbox.WALRelayConfig{
		{},
		{ConnString: "postgres://x/y", Slot: "Bad-Slot"},
		{ConnString: "postgres://x/y", Publication: "p; drop table t"},
		{ConnString: "postgres://x/y", BatchSize: -1},
	} {
		if _, err := outbox.NewWALRelay([]string{"127.0.0.1:1"}, cfg); err == nil {
			t.Errorf("NewWALRelay(%+v) succeeded", cfg)
		}
	}
	if _, err := outbox.NewWALRelay(nil, outbox.WALRelayConfig{ConnString: "postgres://x/y"}); err == nil {
		t.Error("NewWALRelay without brokers succeeded")
	}
}

// testWALCheckAndSetup: Check refuses a database without the relay's slot,
// and passes once WALRelay.Setup created it; on the shared test server
// (wal_level below logical) it names wal_level.
func testWALCheckAndSetup(t *testing.T, e *walEnv) {
	ctx := context.Background()
	err := e.w.Check(ctx, e.pool, e.slot)
	if !errors.Is(err, outbox.ErrWALNotReady) || !strings.Contains(err.Error(), e.slot) {
		t.Fatalf("Check before the slot exists: %v, want ErrWALNotReady naming %s", err, e.slot)
	}
	r, err := outbox.NewWALRelay(e.brokers, e.relayConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Setup(ctx); err != nil {
		t.Fatalf("second Setup (slot and publication exist): %v", err)
	}
	if err := e.w.Check(ctx, e.pool, e.slot); err != nil {
		t.Fatalf("Check after Setup: %v", err)
	}
	shared := testenv.DB(t)
	var level string
	if err := shared.QueryRow(ctx, "show wal_level").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		err := e.w.Check(ctx, shared, e.slot)
		if !errors.Is(err, outbox.ErrWALNotReady) || !strings.Contains(err.Error(), "wal_level") {
			t.Fatalf("Check with wal_level=%s: %v, want ErrWALNotReady naming wal_level", level, err)
		}
	}
}

// testWALRefusedTopic: while the broker refuses the topic (an ACL: a
// permanent error the WAL relay cannot park), the relay retries and
// confirms nothing, so the slot keeps the messages; once the ACL is fixed,
// every message is published, in order, and confirmed.
func testWALRefusedTopic(t *testing.T, e *walEnv) {
	ctx := context.Background()
	var deny atomic.Bool
	deny.Store(true)
	e.kafka.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.KeepControl()
		if !deny.Load() {
			return nil, nil, false
		}
		return testenv.RefuseProduce(req.(*kmsg.ProduceRequest), func(kmsg.ProduceRequestTopic) int16 {
			return kerr.TopicAuthorizationFailed.Code
		}), nil, true
	})
	cfg := e.relayConfig(t)
	failures := make(chan error, 100)
	cfg.Hooks.OnPublishError = func(_ int, err error) {
		select {
		case failures <- err:
		default:
		}
	}
	r, err := outbox.NewWALRelay(e.brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	r.Close()
	for i := 1; i <= 5; i++ {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			return e.w.Add(ctx, tx, outbox.Message{Topic: "t", Key: []byte("k"), Value: seqValue(i)})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var walEnd uint64
	if err := e.pool.QueryRow(ctx, "select (pg_current_wal_lsn() - '0/0')::bigint").Scan(&walEnd); err != nil {
		t.Fatal(err)
	}
	e.startWALRelay(t, cfg)
	for i := range 2 {
		select {
		case err := <-failures:
			if !outbox.PermanentProduceError(err) {
				t.Fatalf("publish error %v, want the broker's permanent refusal", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%d failed publish attempts reported within 20 s while the broker refused everything, want 2 (a refused batch was not retried)", i)
		}
	}
	var confirmed uint64
	if err := e.pool.QueryRow(ctx, "select (confirmed_flush_lsn - '0/0')::bigint from pg_replication_slots where slot_name = $1", e.slot).Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	if confirmed >= walEnd {
		t.Fatalf("slot confirmed %d while the broker refused everything (writes end at %d)", confirmed, walEnd)
	}
	deny.Store(false)
	recs := e.consume(t, "t").waitDistinct(5, 20*time.Second)
	checkPerKeyOrder(t, recs, []string{"k"}, 5)
	eventually(t, 10*time.Second, "the slot to confirm every write", func() bool {
		var c uint64
		err := e.pool.QueryRow(ctx, "select (confirmed_flush_lsn - '0/0')::bigint from pg_replication_slots where slot_name = $1", e.slot).Scan(&c)
		return err == nil && c >= walEnd
	})
}

// testWALSmallBatches: transactions larger than BatchSize are published in
// several batches (a batch holds whole transactions); a crash after the
// third batch's ack restarts from the last confirmed transaction, and every
// key's messages still arrive complete and in order.
func testWALSmallBatches(t *testing.T, e *walEnv) {
	ctx := context.Background()
	cfg := e.relayConfig(t)
	cfg.BatchSize = 50
	cfg.Linger = time.Second // only the size, or the end of the backlog, ends a batch
	r, err := outbox.NewWALRelay(e.brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	r.Close()
	keys := []string{"a", "b", "c", "d", "e", "f"}
	const txns, perKeyPerTxn = 20, 5
	for i := range txns {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			for j := 1; j <= perKeyPerTxn; j++ {
				for _, k := range keys {
					if err := e.w.Add(ctx, tx, outbox.Message{Topic: "t", Key: []byte(k), Value: seqValue(i*perKeyPerTxn + j)}); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	crash := errors.New("simulated crash")
	var batches atomic.Int64
	cfg.Hooks.AfterAck = func(context.Context, uint64) error {
		if batches.Add(1) == 3 {
			return crash
		}
		return nil
	}
	r1 := e.startWALRelay(t, cfg)
	<-r1.done
	if !errors.Is(r1.err, crash) {
		t.Fatalf("Run returned %v, want the AfterAck error", r1.err)
	}
	cfg.Hooks.AfterAck = nil
	var published atomic.Int64
	cfg.Hooks.OnPublished = func(n int) {
		if n < 50 && published.Load()+int64(n) < int64(txns*perKeyPerTxn*len(keys)) {
			t.Errorf("a batch of %d records before the end, want at least BatchSize 50 (whole transactions of 30)", n)
		}
		published.Add(int64(n))
	}
	e.startWALRelay(t, cfg)
	c := e.consume(t, "t")
	c.waitDistinct(txns*perKeyPerTxn*len(keys), 20*time.Second)
	// Published means produced: once every distinct message is in, read
	// whatever else was produced (the republished batch).
	recs := c.waitFor(int(e.produced(t, "t")), 10*time.Second)
	checkPerKeyOrder(t, recs, keys, txns*perKeyPerTxn)
	if len(recs) <= txns*perKeyPerTxn*len(keys) {
		t.Fatalf("%d records, want the crashed batch republished", len(recs))
	}
}
