package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// Tests of pre-transaction calls (handler.WithCall) that fail, hang,
// repeat a key, or outlive their consumer.

// fakeProvider stands for a payment provider: it counts calls by
// idempotency key and in flight.
type fakeProvider struct {
	mu     sync.Mutex
	calls  map[string]int
	keys   []string // idempotency keys in call order
	now    int
	top    int
	total  atomic.Int32
	called chan struct{} // gets a value per call, when not full
}

func newFakeProvider() *fakeProvider {
	return &fakeProvider{calls: map[string]int{}, called: make(chan struct{}, 1024)}
}

// enter counts a call of key and returns its leave.
func (p *fakeProvider) enter(key string) (leave func()) {
	p.mu.Lock()
	p.calls[key]++
	p.keys = append(p.keys, key)
	p.now++
	p.top = max(p.top, p.now)
	p.mu.Unlock()
	p.total.Add(1)
	select {
	case p.called <- struct{}{}:
	default:
	}
	return func() { p.mu.Lock(); p.now--; p.mu.Unlock() }
}

func (p *fakeProvider) count(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[key]
}

func (p *fakeProvider) peak() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.top
}

// A call that fails with handler.Permanent is dead-lettered at once: one
// call, no OnRetry, and its log line says it is dead-lettered, with no
// retry_in.
func TestPermanentCallErrorIsDeadLetteredAtOnce(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	ob := outbox.New()
	if err := ob.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	testenv.Produce(t, brokers, jobRecord("k1", job{ID: "bad"}), jobRecord("k2", job{ID: "good"}))

	p := newFakeProvider()
	var ran atomic.Int32
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		ran.Add(1)
		return insertJob(ctx, tx, msg, "")
	}, handler.WithCall(func(ctx context.Context, msg handler.Message[job]) error {
		defer p.enter(msg.Key)()
		if msg.Value.ID == "bad" {
			return handler.Permanent(errors.New("card declined"))
		}
		return nil
	}))
	o := newOutcomes()
	var retries atomic.Int32
	hooks := o.hooks()
	hooks.OnRetry = func(context.Context, consumer.RetryData) { retries.Add(1) }
	logs := &syncBuffer{}
	cfg := testConfig(brokers, "permanent-call", "jobs") // MaxAttempts 5: retried, it would be called 5 times
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(hooks),
		consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)),
		consumer.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	o.await(t, 30*time.Second, "one applied, one dead-lettered", func() bool {
		return o.get("applied") == 1 && o.get(string(dedupe.DeadLettered)) == 1
	})
	if n := p.count("job:bad"); n != 1 {
		t.Errorf("the permanently failing call ran %d times, want 1", n)
	}
	if n := retries.Load(); n != 0 {
		t.Errorf("OnRetry fired %d times for a permanent failure, want 0", n)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once (the good record)", n)
	}
	var line string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, "card declined") && strings.Contains(l, "level=ERROR") {
			line = l
		}
	}
	if !strings.Contains(line, "permanent") || !strings.Contains(line, "dead-letter") || strings.Contains(line, "retry_in") {
		t.Errorf("the failure's log line %q; want it to say permanent and dead-lettering, without retry_in", line)
	}
}

// A call that keeps failing runs exactly Config.MaxAttempts times; its
// record is then dead-lettered without its transaction function running
// (which would call the provider inside the transaction).
func TestFailingCallDeadLetteredAfterMaxAttempts(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	ob := outbox.New()
	if err := ob.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	testenv.Produce(t, brokers, jobRecord("k1", job{ID: "down"}))

	p := newFakeProvider()
	effects := dedupe.NewEffects(nil)
	provider := func(_ context.Context, key string) ([]byte, error) {
		defer p.enter(key)()
		return nil, errors.New("provider unavailable")
	}
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		if _, err := effects.Call(ctx, tx, msg.Scope, msg.Key, provider); err != nil {
			return err
		}
		return insertJob(ctx, tx, msg, "")
	}, handler.WithCall(func(ctx context.Context, msg handler.Message[job]) error {
		_, err := effects.Precall(ctx, msg.Scope, msg.Key, provider)
		return err
	}))
	o := newOutcomes()
	cfg := testConfig(brokers, "failing-call", "jobs")
	cfg.MaxAttempts = 3
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()),
		consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)))
	o.await(t, 30*time.Second, "the record dead-lettered", func() bool { return o.total() >= 1 })
	if got := o.get(string(dedupe.DeadLettered)); got != 1 {
		t.Errorf("outcomes %v; want the record dead-lettered", o.snapshot())
	}
	if n := p.count("job:down"); n != 3 {
		t.Errorf("the provider was called %d times, want MaxAttempts = 3", n)
	}
}

// After its transaction fails (the handler's error), a record whose call
// succeeded runs its transaction again without running its call function
// again.
func TestSucceededCallRunsOnceAcrossFailedTransactions(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	testenv.Produce(t, brokers, jobRecord("k1", job{ID: "1"}))

	p := newFakeProvider()
	effects := dedupe.NewEffects(nil)
	var runs, callRuns atomic.Int32
	provider := func(_ context.Context, key string) ([]byte, error) {
		defer p.enter(key)()
		return []byte("receipt"), nil
	}
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		if runs.Add(1) <= 2 {
			return errors.New("the ledger refused, for now")
		}
		res, err := effects.Call(ctx, tx, msg.Scope, msg.Key, provider)
		if err != nil {
			return err
		}
		return insertJob(ctx, tx, msg, string(res))
	}, handler.WithCall(func(ctx context.Context, msg handler.Message[job]) error {
		callRuns.Add(1)
		_, err := effects.Precall(ctx, msg.Scope, msg.Key, provider)
		return err
	}))
	o := newOutcomes()
	startConsumer(t, testConfig(brokers, "call-once", "jobs"), pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	o.await(t, 30*time.Second, "the record applied", func() bool { return o.get("applied") >= 1 })
	if n := runs.Load(); n != 3 {
		t.Errorf("the transaction function ran %d times, want 3", n)
	}
	if n := callRuns.Load(); n != 1 {
		t.Errorf("the WithCall function ran %d times across 3 transactions, want 1", n)
	}
	if n := p.total.Load(); n != 1 {
		t.Errorf("the provider was called %d times across 3 transactions, want 1", n)
	}
}

// A WithCall function that fails after its Precall succeeded is retried,
// and its Precall then returns the remembered result without calling.
func TestPrecallRemembersResultAcrossAttempts(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	testenv.Produce(t, brokers, jobRecord("k1", job{ID: "1"}))

	p := newFakeProvider()
	effects := dedupe.NewEffects(nil)
	var got []string
	var mu sync.Mutex
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		res, err := effects.Call(ctx, tx, msg.Scope, msg.Key, func(context.Context, string) ([]byte, error) {
			return nil, errors.New("called inside the transaction")
		})
		if err != nil {
			return err
		}
		return insertJob(ctx, tx, msg, string(res))
	}, handler.WithCall(func(ctx context.Context, msg handler.Message[job]) error {
		res, err := effects.Precall(ctx, msg.Scope, msg.Key, func(_ context.Context, key string) ([]byte, error) {
			defer p.enter(key)()
			return []byte("receipt-1"), nil
		})
		if err != nil {
			return err
		}
		mu.Lock()
		got = append(got, string(res))
		mu.Unlock()
		if msg.Attempt == 1 {
			return errors.New("the confirmation e-mail bounced")
		}
		return nil
	}))
	o := newOutcomes()
	startConsumer(t, testConfig(brokers, "precall-memo", "jobs"), pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	o.await(t, 30*time.Second, "the record applied", func() bool { return o.get("applied") >= 1 })
	if n := p.total.Load(); n != 1 {
		t.Errorf("the provider was called %d times over two attempts, want 1 (the second remembered)", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[1] != "receipt-1" {
		t.Errorf("Precall returned %q over the attempts; want the receipt twice", got)
	}
}

// 50 keys sent twice in one fetch (the copies share their Kafka key):
// 50 calls. A copy waits behind its key's first record, and its guard row
// is read when its turn comes, after that record committed.
func TestDuplicatesInOneFetchCallOnce(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	const n = 50
	var recs []*kgo.Record
	for range 2 {
		for i := range n {
			recs = append(recs, jobRecord(fmt.Sprintf("order-%d", i), job{ID: fmt.Sprint(i)}))
		}
	}
	testenv.Produce(t, brokers, recs...)

	p := newFakeProvider()
	effects := dedupe.NewEffects(nil)
	provider := func(_ context.Context, key string) ([]byte, error) {
		defer p.enter(key)()
		return []byte("receipt"), nil
	}
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		res, err := effects.Call(ctx, tx, msg.Scope, msg.Key, provider)
		if err != nil {
			return err
		}
		return insertJob(ctx, tx, msg, string(res))
	}, handler.WithCall(func(ctx context.Context, msg handler.Message[job]) error {
		_, err := effects.Precall(ctx, msg.Scope, msg.Key, provider)
		return err
	}))
	o := newOutcomes()
	startConsumer(t, testConfig(brokers, "dup-calls", "jobs"), pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	o.await(t, 60*time.Second, "every record", func() bool { return o.total() >= 2*n })
	if a, d := o.get("applied"), o.get("duplicate"); a != n || d != n {
		t.Errorf("applied=%d duplicate=%d, want %d and %d", a, d, n, n)
	}
	if c := p.total.Load(); c != n {
		t.Errorf("the provider was called %d times for %d keys sent twice, want %d", c, n, n)
	}
}

// With 64 calls hanging on partition 0 (they wait for their context),
// partition 1's records, whose calls answer at once, all apply: partition
// 0 holds its share of EXACTLY_MAX_CALLS_IN_FLIGHT (64), not all of it.
func TestHungCallsHoldOnlyTheirPartition(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 2, "jobs"))
	var hung []*kgo.Record
	for i := range 64 {
		r := jobRecord(fmt.Sprintf("h%d", i), job{ID: fmt.Sprintf("hang-%d", i)})
		r.Partition = 0
		hung = append(hung, r)
	}
	produceManual(t, brokers, hung...)

	var hanging atomic.Int32
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		return insertJob(ctx, tx, msg, "")
	}, handler.WithCall(func(ctx context.Context, msg handler.Message[job]) error {
		if strings.HasPrefix(msg.Value.ID, "hang-") {
			hanging.Add(1)
			defer hanging.Add(-1)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-release:
				return errors.New("released")
			}
		}
		return nil
	}))
	o := newOutcomes()
	cfg := testConfig(brokers, "hung-calls", "jobs")
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	o.await(t, 30*time.Second, "calls hanging on partition 0", func() bool { return hanging.Load() >= 32 })

	var flowing []*kgo.Record
	for i := range 20 {
		r := jobRecord(fmt.Sprintf("f%d", i), job{ID: fmt.Sprintf("flow-%d", i)})
		r.Partition = 1
		flowing = append(flowing, r)
	}
	produceManual(t, brokers, flowing...)
	o.await(t, 20*time.Second, "partition 1's 20 records applied while partition 0's calls hang", func() bool {
		return o.get("applied") >= 20
	})
	if n := count(t, pool, `select count(*) from applied where id like 'flow-%'`); n != 20 {
		t.Errorf("%d of partition 1's records applied, want 20", n)
	}
	t.Logf("%d calls hanging on partition 0", hanging.Load())
}

// A call that ignores its context does not hold Run: cancelled, Run
// returns (after a bounded wait, the call abandoned), and the next
// consumer calls again with the same idempotency key and applies the
// record.
func TestShutdownAbandonsCallIgnoringContext(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	testenv.Produce(t, brokers, jobRecord("k1", job{ID: "1"}))

	p := newFakeProvider()
	effects := dedupe.NewEffects(nil)
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) })
	var first atomic.Bool
	first.Store(true)
	provider := func(_ context.Context, key string) ([]byte, error) {
		defer p.enter(key)()
		if first.CompareAndSwap(true, false) {
			<-stuck // ignores its context
			return nil, errors.New("released at the end of the test")
		}
		return []byte("receipt"), nil
	}
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		res, err := effects.Call(ctx, tx, msg.Scope, msg.Key, provider)
		if err != nil {
			return err
		}
		return insertJob(ctx, tx, msg, string(res))
	}, handler.WithCall(func(ctx context.Context, msg handler.Message[job]) error {
		_, err := effects.Precall(ctx, msg.Scope, msg.Key, provider)
		return err
	}))
	cfg := testConfig(brokers, "abandon", "jobs")
	c, err := consumer.New(cfg, pool, consumer.Handle(h))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-p.called:
	case <-time.After(30 * time.Second):
		t.Fatal("the call did not start")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of its cancellation while a call ignored its context")
	}

	o := newOutcomes()
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	o.await(t, 30*time.Second, "the record applied by the next consumer", func() bool { return o.get("applied") >= 1 })
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.keys) != 2 || p.keys[0] != p.keys[1] {
		t.Errorf("idempotency keys of the calls %q; want two calls with one key", p.keys)
	}
}

// While records wait for their calls (each key is sent twice in a row:
// the copy waits behind the first), a transaction still takes at most
// Config.BatchMaxRecords records (each writes its transaction's id).
func TestBatchCapHoldsWhileRecordsWaitForCalls(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	const n = 150
	var recs []*kgo.Record
	for i := range n {
		for range 2 { // two records: one produced twice races in the client
			recs = append(recs, jobRecord(fmt.Sprintf("k%d", i), job{ID: fmt.Sprint(i)}))
		}
	}
	testenv.Produce(t, brokers, recs...)
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		var txid int64
		if err := tx.QueryRow(ctx, `select txid_current()`).Scan(&txid); err != nil {
			return err
		}
		return insertJob(ctx, tx, msg, fmt.Sprint(txid))
	}, handler.WithCall(func(context.Context, handler.Message[job]) error { return nil }))
	o := newOutcomes()
	cfg := testConfig(brokers, "batch-cap", "jobs")
	cfg.BatchMaxRecords = 4
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	o.await(t, 60*time.Second, "every record", func() bool { return o.total() >= 2*n })
	if d := o.get("duplicate"); d != n {
		t.Errorf("%d duplicates, want %d", d, n)
	}
	if top := count(t, pool, `select coalesce(max(c), 0) from (select count(*) c from applied group by result) t`); top > 4 {
		t.Errorf("a transaction took %d records, want at most BatchMaxRecords = 4", top)
	}
}
