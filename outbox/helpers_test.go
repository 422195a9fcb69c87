package outbox_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// env is one test's PostgreSQL database (outbox migrated) and kfake cluster.
type env struct {
	pool    *pgxpool.Pool
	ob      *outbox.Outbox
	brokers []string
	kafka   *kfake.Cluster
}

func setup(t *testing.T, partitions int32, topics ...string) *env {
	t.Helper()
	pool := testenv.DB(t)
	ob := outbox.New()
	if err := ob.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	k := testenv.Kafka(t, partitions, topics...)
	return &env{pool: pool, ob: ob, brokers: testenv.Brokers(k), kafka: k}
}

// fastConfig is a relay configuration with short intervals for tests.
func (e *env) fastConfig(t *testing.T) outbox.RelayConfig {
	return outbox.RelayConfig{
		Outbox:           e.ob,
		PollInterval:     50 * time.Millisecond,
		TakeoverInterval: 100 * time.Millisecond,
		RetryBackoff:     50 * time.Millisecond,
		ProduceTimeout:   10 * time.Second,
		Logger:           slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

// runningRelay is a relay running in a goroutine.
type runningRelay struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// stop cancels the relay and waits for Run to return.
func (r *runningRelay) stop() { r.cancel(); <-r.done }

// startRelay runs a relay with cfg until stopped or the test ends.
func (e *env) startRelay(t *testing.T, cfg outbox.RelayConfig) *runningRelay {
	t.Helper()
	relay, err := outbox.NewRelay(e.pool, e.brokers, cfg)
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

// add commits one transaction adding msgs to e.ob.
func (e *env) add(t *testing.T, msgs ...outbox.Message) {
	t.Helper()
	e.addTo(t, e.ob, msgs...)
}

// addTo commits one transaction adding msgs through w.
func (e *env) addTo(t *testing.T, w outbox.Writer, msgs ...outbox.Message) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		for _, m := range msgs {
			if err := w.Add(ctx, tx, m); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// begin starts a transaction rolled back at the end of the test unless
// committed.
func (e *env) begin(t *testing.T) pgx.Tx {
	t.Helper()
	tx, err := e.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	return tx
}

// recordReader reads topics from the start, records accumulating across calls.
type recordReader struct {
	t    *testing.T
	cl   *kgo.Client
	recs []*kgo.Record
}

func (e *env) consume(t *testing.T, topics ...string) *recordReader {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond),
		// As exactly's consumer does: records of an aborted relay
		// transaction are never seen.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &recordReader{t: t, cl: cl}
}

// waitFor polls until at least n records were read in all, failing the
// test after timeout, and returns all records read so far.
func (c *recordReader) waitFor(n int, timeout time.Duration) []*kgo.Record {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for len(c.recs) < n {
		fs := c.cl.PollFetches(ctx)
		if ctx.Err() != nil {
			c.t.Fatalf("read %d records within %v, want %d", len(c.recs), timeout, n)
		}
		fs.EachError(func(topic string, p int32, err error) { c.t.Logf("fetch %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) { c.recs = append(c.recs, r) })
	}
	return c.recs
}

// waitDistinct polls until records with n distinct message ids were read,
// failing the test after timeout, and returns all records read so far.
func (c *recordReader) waitDistinct(n int, timeout time.Duration) []*kgo.Record {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ids := map[string]bool{}
		for _, r := range c.recs {
			id, _ := header(r, outbox.HeaderMessageID)
			ids[id] = true
		}
		if len(ids) >= n {
			return c.recs
		}
		left := time.Until(deadline)
		if left <= 0 {
			c.t.Fatalf("read %d distinct records within %v, want %d", len(ids), timeout, n)
		}
		c.waitFor(len(c.recs)+1, left)
	}
}

// produced counts the data records ever written to topic, those of
// aborted transactions included (a relay's transaction markers are not):
// it reads every partition, control records kept, up to its end offset.
func (e *env) produced(t *testing.T, topic string) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	left := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			t.Fatalf("end offset of %s/%d: %v", o.Topic, o.Partition, o.Err)
		}
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	rd, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()), kgo.KeepControlRecords())
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int64
	for len(left) > 0 {
		fs := rd.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s to its end offsets: still to read %v", topic, left)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if !r.Attrs.IsControl() {
				n++
			}
			if end, ok := left[r.Partition]; ok && r.Offset+1 >= end {
				delete(left, r.Partition)
			}
		})
	}
	return n
}

// eventually polls cond every 10ms until it holds, failing after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// header returns the value of the last header named name.
func header(r *kgo.Record, name string) (string, bool) {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if r.Headers[i].Key == name {
			return string(r.Headers[i].Value), true
		}
	}
	return "", false
}

// backlog returns the committed rows awaiting publication.
func (e *env) backlog(t *testing.T) int64 {
	t.Helper()
	n, _, err := e.ob.Backlog(context.Background(), e.pool)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
