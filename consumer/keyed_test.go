package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/telemetry"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// job is the payload of the key-concurrency tests: ID is its dedupe key,
// Lock its lock key (if any).
type job struct {
	ID   string `json:"id"`
	Lock string `json:"lock,omitempty"`
}

func jobKey() handler.KeySource[job] {
	return handler.FromPayload(func(j job) string { return "job:" + j.ID })
}

func setupJobs(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if err := dedupe.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `create table applied(seq bigserial primary key, id text not null, k text, off bigint not null, result text)`); err != nil {
		t.Fatal(err)
	}
}

// jobRecord is a record of topic "jobs" with Kafka key key (none when
// empty) and payload j.
func jobRecord(key string, j job) *kgo.Record {
	v, _ := json.Marshal(j)
	r := &kgo.Record{Topic: "jobs", Value: v}
	if key != "" {
		r.Key = []byte(key)
	}
	return r
}

// insertJob writes the record's application to the applied table.
func insertJob(ctx context.Context, tx pgx.Tx, msg handler.Message[job], result string) error {
	_, err := tx.Exec(ctx, `insert into applied(id, k, off, result) values($1, $2, $3, $4)`,
		msg.Value.ID, string(msg.Record.Key), msg.Record.Offset, result)
	return err
}

// committedAt reads the group's committed offset of jobs/0 from the broker
// (-1 when none).
func committedAt(t *testing.T, brokers []string, group string) int64 {
	t.Helper()
	adm := kadm.NewClient(mustClient(t, brokers))
	defer adm.Close()
	offsets, err := adm.FetchOffsets(context.Background(), group)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := offsets.Lookup("jobs", 0)
	if !ok || o.Err != nil {
		return -1
	}
	return o.At
}

// 100 records over 10 Kafka keys, interleaved on one partition: each
// key's records apply in offset order, no record's pre-transaction call
// starts before the record of its key ahead of it committed, and calls of
// different keys overlap (the first call waits until a second is in
// flight, which fails the test with key concurrency off).
func TestKeyConcurrencyKeepsKeyOrderAndOverlapsKeys(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	const n, keys = 100, 10
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, jobRecord(fmt.Sprintf("k%d", i%keys), job{ID: fmt.Sprint(i)}))
	}
	testenv.Produce(t, brokers, recs...)

	var (
		mu          sync.Mutex
		appliedOffs = map[int64]bool{}
		violations  []string
		inCall, top int
		barrier     = make(chan struct{})
		opened      sync.Once
	)
	call := func(ctx context.Context, msg handler.Message[job]) error {
		mu.Lock()
		if prev := msg.Record.Offset - keys; prev >= 0 && !appliedOffs[prev] {
			violations = append(violations, fmt.Sprintf("call of offset %d started before offset %d of its key committed", msg.Record.Offset, prev))
		}
		inCall++
		top = max(top, inCall)
		if inCall >= 2 {
			opened.Do(func() { close(barrier) })
		}
		mu.Unlock()
		defer func() { mu.Lock(); inCall--; mu.Unlock() }()
		select {
		case <-barrier:
			return nil
		case <-time.After(20 * time.Second):
			return errors.New("no second key's call in flight")
		}
	}
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		return insertJob(ctx, tx, msg, "")
	}, handler.WithCall(call))
	o := newOutcomes()
	hooks := o.hooks()
	onOutcome := hooks.OnOutcome
	hooks.OnOutcome = func(ctx context.Context, d consumer.OutcomeData) {
		mu.Lock()
		appliedOffs[d.Record.Offset] = true
		mu.Unlock()
		onOutcome(ctx, d)
	}
	startConsumer(t, testConfig(brokers, "order", "jobs"), pool, consumer.Handle(h), consumer.WithHooks(hooks))
	o.await(t, 60*time.Second, "every record", func() bool { return o.get("applied") >= n })

	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations {
		t.Error(v)
	}
	if top < 2 {
		t.Errorf("at most %d call in flight; want calls of different keys overlapping", top)
	}
	if got := count(t, pool, `select count(*) from applied`); got != n {
		t.Errorf("applied rows = %d, want %d", got, n)
	}
	if bad := count(t, pool, `select count(*) from (
		select off, lag(off) over (partition by k order by seq) as prev from applied) x where prev >= off`); bad != 0 {
		t.Errorf("%d records applied before a record of their key that precedes them", bad)
	}
	t.Logf("at most %d calls in flight", top)
}

// heldJob returns a handler whose record with ID held fails ("try again
// later") until release is closed, counting its attempts; every other
// record applies.
func heldJob(held string, release <-chan struct{}, attempts *atomic.Int32, opts ...handler.Option) *handler.Handler[job] {
	return failingJob(held, "try again later", release, attempts, opts...)
}

// failingJob is heldJob failing with the error text failure.
func failingJob(held, failure string, release <-chan struct{}, attempts *atomic.Int32, opts ...handler.Option) *handler.Handler[job] {
	return handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		if msg.Value.ID == held {
			select {
			case <-release:
			default:
				attempts.Add(1)
				return errors.New(failure)
			}
		}
		return insertJob(ctx, tx, msg, "")
	}, opts...)
}

// A record of key A keeps failing: the 20 records of other keys after it
// all apply while it retries, A's second record waits behind it, and the
// committed offset (read from the broker) stays at A's offset, also once
// the consumer stopped with A in flight. A successor applies A's records
// after A succeeds, finds the others applied (duplicates), and commits to
// the end.
func TestRetryHoldsOnlyItsKeyAndOffsetsTrail(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	recs := []*kgo.Record{jobRecord("A", job{ID: "a0"})}
	for i := range 20 {
		recs = append(recs, jobRecord(fmt.Sprintf("k%d", i), job{ID: fmt.Sprint(i)}))
	}
	recs = append(recs, jobRecord("A", job{ID: "a1"}))
	testenv.Produce(t, brokers, recs...)

	var attempts atomic.Int32
	release := make(chan struct{})
	o := newOutcomes()
	cfg := testConfig(brokers, "held", "jobs")
	stop := startConsumer(t, cfg, pool, consumer.Handle(heldJob("a0", release, &attempts)), consumer.WithHooks(o.hooks()))
	o.await(t, 60*time.Second, "the other keys' records and 3 failed attempts of A", func() bool {
		return o.get("applied") >= 20 && attempts.Load() >= 3
	})
	if got := count(t, pool, `select count(*) from applied where id in ('a0', 'a1')`); got != 0 {
		t.Errorf("%d of A's records applied while its first fails", got)
	}
	o.awaitCommitted(t, 30*time.Second, "jobs", 0, 0)
	if at := committedAt(t, brokers, "held"); at > 0 {
		t.Errorf("committed offset %d while offset 0 is held", at)
	}
	stop()
	if at := committedAt(t, brokers, "held"); at != 0 {
		t.Errorf("after stopping with offset 0 in flight, committed offset %d; want 0 (the lowest unfinished)", at)
	}
	o.checkCommitsTrail(t)

	close(release)
	next := newOutcomes()
	startConsumer(t, cfg, pool, consumer.Handle(heldJob("a0", release, &attempts)), consumer.WithHooks(next.hooks()))
	next.awaitCommitted(t, 60*time.Second, "jobs", 0, 22)
	if a, d := next.get("applied"), next.get("duplicate"); a != 2 || d != 20 {
		t.Errorf("successor: applied=%d duplicate=%d, want 2 (A's) and 20", a, d)
	}
	if bad := count(t, pool, `select count(*) from applied a join applied b on b.id = 'a1' where a.id = 'a0' and a.seq > b.seq`); bad != 0 {
		t.Errorf("A's second record applied before its first")
	}
	if got := count(t, pool, `select count(*) from applied`); got != 22 {
		t.Errorf("applied rows = %d, want 22", got)
	}
}

// Records of different Kafka and dedupe keys whose lock keys overlap run
// one at a time in offset order: while X (lock acct:1) retries, Y (lock
// acct:1) waits and Z (lock acct:2) applies.
func TestLockKeyOverlapSerializesUnderKeyConcurrency(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	testenv.Produce(t, brokers,
		jobRecord("x", job{ID: "x", Lock: "acct:1"}),
		jobRecord("y", job{ID: "y", Lock: "acct:1"}),
		jobRecord("z", job{ID: "z", Lock: "acct:2"}))
	var attempts atomic.Int32
	release := make(chan struct{})
	o := newOutcomes()
	h := heldJob("x", release, &attempts, handler.WithLockKeys(func(j job) []string { return []string{j.Lock} }))
	startConsumer(t, testConfig(brokers, "locks", "jobs"), pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	o.await(t, 60*time.Second, "z applied and x failing twice", func() bool { return o.get("applied") >= 1 && attempts.Load() >= 2 })
	if got := count(t, pool, `select count(*) from applied where id = 'y'`); got != 0 {
		t.Errorf("y applied while x, whose lock key it shares, retries")
	}
	close(release)
	o.await(t, 60*time.Second, "every record", func() bool { return o.get("applied") >= 3 })
	if bad := count(t, pool, `select count(*) from applied x join applied y on y.id = 'y' where x.id = 'x' and x.seq > y.seq`); bad != 0 {
		t.Errorf("y applied before x")
	}
}

// gauge returns the value of the per-partition gauge name for jobs/0
// (-1 when not reported).
func gauge(t *testing.T, r *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
				if v, ok := dp.Attributes.Value(telemetry.MessagingPartitionID); ok && v.AsString() == "0" {
					return dp.Value
				}
			}
		}
	}
	return -1
}

// With a record held at offset 0 and EXACTLY_MAX_OFFSET_GAP 10, the
// partition works up to offset 9 and then pauses, visibly (the paused and
// held gauges, a log line); nothing at offset 10 or later applies until
// the held record succeeds, and then everything does.
func TestOffsetGapPausesPartition(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	recs := []*kgo.Record{jobRecord("A", job{ID: "a0"})}
	for i := range 30 {
		recs = append(recs, jobRecord(fmt.Sprintf("k%d", i), job{ID: fmt.Sprint(i)}))
	}
	testenv.Produce(t, brokers, recs...)

	var attempts atomic.Int32
	release := make(chan struct{})
	logs := &syncBuffer{}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	o := newOutcomes()
	cfg := testConfig(brokers, "gap", "jobs")
	cfg.MaxOffsetGap = 10
	startConsumer(t, cfg, pool, consumer.Handle(heldJob("a0", release, &attempts)), consumer.WithHooks(o.hooks()),
		consumer.WithMeterProvider(mp), consumer.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	o.await(t, 60*time.Second, "offsets 1..9 applied and the partition paused", func() bool {
		return o.get("applied") >= 9 && gauge(t, reader, telemetry.MetricPartitionPaused) == 1
	})
	if got := gauge(t, reader, telemetry.MetricPartitionHeld); got != 1 {
		t.Errorf("held gauge = %d, want 1", got)
	}
	if !strings.Contains(logs.String(), "partition paused") {
		t.Errorf("no log line says the partition paused:\n%s", logs.String())
	}
	if got := count(t, pool, `select count(*) from applied where off >= 10`); got != 0 {
		t.Errorf("%d records at offset 10 or later applied past the offset gap", got)
	}
	close(release)
	o.await(t, 60*time.Second, "every record, and the partition resumed", func() bool {
		return o.get("applied") >= 31 && gauge(t, reader, telemetry.MetricPartitionPaused) == 0
	})
	if !strings.Contains(logs.String(), "partition resumed") {
		t.Errorf("no log line says the partition resumed")
	}
}

// countingPool is a pool over its own database that records the most
// connections acquired at once.
func countingPool(t *testing.T, maxConns int32) (*pgxpool.Pool, *atomic.Int32) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.DBURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	var now, peak atomic.Int32
	cfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) {
		n := now.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		return true, nil
	}
	cfg.AfterRelease = func(*pgx.Conn) bool {
		now.Add(-1)
		return true
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, &peak
}

// The pre-transaction call form (handler.WithCall with
// dedupe.Effects.Precall): 12 calls run at once on one partition (each
// waits until 8 are in flight), while the pool, which could hand out 20
// connections, never has more than partitions + 2 acquired. Records whose
// guard row exists make no call; the handler's Call inside the
// transaction records the remembered result without calling again.
func TestPrecallRunsCallsOutsideTransactions(t *testing.T) {
	pool, peak := countingPool(t, 20)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	g, effects := dedupe.New(), dedupe.NewEffects(nil)
	var recs []*kgo.Record
	for i := range 16 {
		recs = append(recs, jobRecord(fmt.Sprintf("k%d", i), job{ID: fmt.Sprint(i)}))
	}
	// Keys 0..3 were applied before: their guard rows exist.
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.ClaimBatch(context.Background(), tx, "jobs", []string{"job:0", "job:1", "job:2", "job:3"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.Produce(t, brokers, recs...)

	var (
		mu        sync.Mutex
		calls     = map[string]int{}
		inTx      atomic.Int32
		inCall    int
		top       int
		enough    = make(chan struct{})
		enoughSet bool
	)
	provider := func(ctx context.Context, idem string) ([]byte, error) {
		mu.Lock()
		calls[idem]++
		inCall++
		top = max(top, inCall)
		if inCall >= 8 && !enoughSet {
			enoughSet = true
			close(enough)
		}
		mu.Unlock()
		defer func() { mu.Lock(); inCall--; mu.Unlock() }()
		select {
		case <-enough:
			return []byte("receipt-" + idem), nil
		case <-time.After(20 * time.Second):
			return nil, errors.New("fewer than 8 calls in flight")
		}
	}
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		res, err := effects.Call(ctx, tx, msg.Scope, msg.Key, func(context.Context, string) ([]byte, error) {
			inTx.Add(1)
			return []byte("called inside the transaction"), nil
		})
		if err != nil {
			return err
		}
		return insertJob(ctx, tx, msg, string(res))
	}, handler.WithCall(func(ctx context.Context, msg handler.Message[job]) error {
		_, err := effects.Precall(ctx, msg.Scope, msg.Key, provider)
		return err
	}))
	o := newOutcomes()
	startConsumer(t, testConfig(brokers, "precall", "jobs"), pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	o.await(t, 60*time.Second, "every record", func() bool { return o.total() >= 16 })

	if a, d := o.get("applied"), o.get("duplicate"); a != 12 || d != 4 {
		t.Errorf("applied=%d duplicate=%d, want 12 and 4", a, d)
	}
	mu.Lock()
	defer mu.Unlock()
	if top < 8 {
		t.Errorf("at most %d calls in flight, want 8", top)
	}
	for i := range 16 {
		k := dedupe.NormalizeKey(fmt.Sprintf("job:%d", i))
		want := 1
		if i < 4 {
			want = 0
		}
		if calls[k] != want {
			t.Errorf("%s called %d times, want %d", k, calls[k], want)
		}
	}
	if n := inTx.Load(); n != 0 {
		t.Errorf("%d calls made inside transactions; want the pre-transaction results recorded", n)
	}
	if got := count(t, pool, `select count(*) from applied where result like 'receipt-%'`); got != 12 {
		t.Errorf("%d applied rows carry the provider's receipt, want 12", got)
	}
	if got := count(t, pool, `select count(*) from exactly_guard_effects where state = 'done'`); got != 12 {
		t.Errorf("%d recorded effects, want 12", got)
	}
	if p := peak.Load(); p > 3 {
		t.Errorf("the pool had %d connections acquired at once; want at most partitions + 2 = 3", p)
	}
	t.Logf("%d calls in flight at most; %d connections acquired at most", top, peak.Load())
}

// Records that cannot be keyed (their payload does not decode) share the
// "no key" lane and are dead-lettered in offset order among themselves:
// A (Kafka key k1, behind k1's failing record) holds B (no Kafka key)
// while a record of another key applies, and once k1's record succeeds A
// is dead-lettered before B. Without that lane B, which then has no lane
// at all, is dead-lettered first.
func TestUnkeyableRecordsKeepTheirOrder(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	ob := outbox.New()
	if err := ob.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	testenv.Produce(t, brokers,
		jobRecord("k1", job{ID: "held"}),
		&kgo.Record{Topic: "jobs", Key: []byte("k1"), Value: []byte("\xffA: not json")},
		&kgo.Record{Topic: "jobs", Value: []byte("\xffB: not json")},
		jobRecord("k2", job{ID: "free"}))

	var (
		mu   sync.Mutex
		dead []int64 // offsets of dead-lettered records, in outcome order
	)
	o := newOutcomes()
	hooks := o.hooks()
	onOutcome := hooks.OnOutcome
	hooks.OnOutcome = func(ctx context.Context, d consumer.OutcomeData) {
		if d.Outcome == dedupe.DeadLettered {
			mu.Lock()
			dead = append(dead, d.Record.Offset)
			mu.Unlock()
		}
		onOutcome(ctx, d)
	}
	var attempts atomic.Int32
	release := make(chan struct{})
	cfg := testConfig(brokers, "unkeyable", "jobs")
	startConsumer(t, cfg, pool, consumer.Handle(heldJob("held", release, &attempts)), consumer.WithHooks(hooks),
		consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)))
	o.await(t, 60*time.Second, "k2's record applied and 3 failed attempts of k1's", func() bool {
		return o.get("applied") >= 1 && attempts.Load() >= 3
	})
	if got := o.get(string(dedupe.DeadLettered)); got != 0 {
		mu.Lock()
		t.Errorf("%d unkeyable records dead-lettered (offsets %v) while the first of them waits for its Kafka key", got, dead)
		mu.Unlock()
	}
	close(release)
	o.awaitCommitted(t, 60*time.Second, "jobs", 0, 4)
	mu.Lock()
	defer mu.Unlock()
	if len(dead) != 2 || dead[0] != 1 || dead[1] != 2 {
		t.Errorf("dead-lettered offsets in order %v; want [1 2]", dead)
	}
}

// A pre-transaction call's result is recorded with the batch's deferred
// writes, and a result recorded first still wins: when the effects table
// holds another result for the key already, the first attempt fails (its
// deferred write is refused, naming the key) and the next records at once
// and hands the handler the recorded result. The provider is called once.
func TestPrecalledResultYieldsToRecordedResult(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	effects := dedupe.NewEffects(nil)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := effects.Call(ctx, tx, "jobs", "job:1", func(context.Context, string) ([]byte, error) { return []byte("old"), nil }); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Produce(t, brokers, jobRecord("k1", job{ID: "1"}), jobRecord("k2", job{ID: "2"}))

	var calls atomic.Int32
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		res, err := effects.Call(ctx, tx, msg.Scope, msg.Key, func(context.Context, string) ([]byte, error) {
			return nil, errors.New("called inside the transaction")
		})
		if err != nil {
			return err
		}
		return insertJob(ctx, tx, msg, string(res))
	}, handler.WithCall(func(ctx context.Context, msg handler.Message[job]) error {
		_, err := effects.Precall(ctx, msg.Scope, msg.Key, func(_ context.Context, key string) ([]byte, error) {
			calls.Add(1)
			return []byte("new-" + key), nil
		})
		return err
	}))
	o := newOutcomes()
	var mu sync.Mutex
	var retries []string
	hooks := o.hooks()
	hooks.OnRetry = func(_ context.Context, d consumer.RetryData) {
		mu.Lock()
		defer mu.Unlock()
		retries = append(retries, d.Err.Error())
	}
	startConsumer(t, testConfig(brokers, "precall-recorded", "jobs"), pool, consumer.Handle(h), consumer.WithHooks(hooks))
	o.await(t, 30*time.Second, "both records applied", func() bool { return o.get("applied") >= 2 })

	var r1, r2 string
	if err := pool.QueryRow(ctx, `select (select result from applied where id = '1'), (select result from applied where id = '2')`).Scan(&r1, &r2); err != nil {
		t.Fatal(err)
	}
	if r1 != "old" || r2 != "new-job:2" {
		t.Errorf("handlers stored %q and %q; want the recorded \"old\" and the call's \"new-job:2\"", r1, r2)
	}
	if n := count(t, pool, `select count(*) from applied`); n != 2 {
		t.Errorf("%d applied rows, want 2", n)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("the provider was called %d times, want once per record", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(retries) != 1 || !strings.Contains(retries[0], "jobs/job:1") {
		t.Errorf("retries %q; want one, the refused deferred write naming jobs/job:1", retries)
	}
}

// The dedupe key is a lane of its own: a copy of a key produced under
// another Kafka key (so on no lane of the first copy's but its dedupe
// key's) waits while the first copy is held, and applies as its
// duplicate, in offset order, once the first applied; records of other
// keys apply meanwhile.
func TestDedupeKeyIsALaneAcrossKafkaKeys(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	recs := []*kgo.Record{jobRecord("A", job{ID: "d"}), jobRecord("B", job{ID: "d"})}
	for i := range 4 {
		recs = append(recs, jobRecord(fmt.Sprintf("k%d", i), job{ID: fmt.Sprint(i)}))
	}
	testenv.Produce(t, brokers, recs...)

	var attempts atomic.Int32
	release := make(chan struct{})
	var mu sync.Mutex
	var ranAt []int64 // offsets of the copies of d whose handler ran
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		if msg.Value.ID == "d" {
			mu.Lock()
			ranAt = append(ranAt, msg.Record.Offset)
			mu.Unlock()
			if msg.Record.Offset == 0 {
				select {
				case <-release:
				default:
					attempts.Add(1)
					return errors.New("try again later")
				}
			}
		}
		return insertJob(ctx, tx, msg, "")
	})
	o := newOutcomes()
	startConsumer(t, testConfig(brokers, "dedupe-lane", "jobs"), pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	o.await(t, 60*time.Second, "the other keys' records and 2 failed attempts of the first copy", func() bool {
		// (Or a copy of d finished: the later one overtook the first.)
		return o.get("applied") >= 4 && attempts.Load() >= 2 || o.total() > 4
	})
	if got := count(t, pool, `select count(*) from applied where id = 'd'`); got != 0 {
		t.Fatalf("%d copies of d applied while its first copy (offset 0) is held; want the second (offset 1, another Kafka key) waiting", got)
	}
	close(release)
	o.await(t, 30*time.Second, "both copies of d", func() bool { return o.total() == 6 })
	if a, d := o.get("applied"), o.get("duplicate"); a != 5 || d != 1 {
		t.Errorf("applied=%d duplicate=%d, want 5 and 1 (the second copy of d)", a, d)
	}
	if got := count(t, pool, `select count(*) from applied where id = 'd' and off = 0`); got != 1 {
		t.Errorf("d applied from offset 0: %d rows, want 1: the later copy overtook the earlier", got)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, off := range ranAt {
		if off != 0 {
			t.Errorf("the handler ran the copy of d at offset %d; want it a duplicate, never run", off)
		}
	}
}

// As for a held copy, so for a calling one: while the pre-transaction call
// of a dedupe key's first copy runs, a copy under another Kafka key neither
// calls nor applies; once the first applied, it is its duplicate. (Whether
// it calls then is not checked here: its guard row was looked up when it
// was admitted, before the first copy applied.)
func TestDedupeKeyIsALaneWhileItsFirstCopyCalls(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	recs := []*kgo.Record{jobRecord("A", job{ID: "d"}), jobRecord("B", job{ID: "d"})}
	for i := range 4 {
		recs = append(recs, jobRecord(fmt.Sprintf("k%d", i), job{ID: fmt.Sprint(i)}))
	}
	testenv.Produce(t, brokers, recs...)

	release, calling := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var calledAt []int64 // offsets of the copies of d whose call ran
	call := func(ctx context.Context, msg handler.Message[job]) error {
		if msg.Value.ID != "d" {
			return nil
		}
		mu.Lock()
		calledAt = append(calledAt, msg.Record.Offset)
		mu.Unlock()
		if msg.Record.Offset == 0 {
			close(calling)
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		return insertJob(ctx, tx, msg, "")
	}, handler.WithCall(call))
	o := newOutcomes()
	startConsumer(t, testConfig(brokers, "dedupe-lane-call", "jobs"), pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	select {
	case <-calling:
	case <-time.After(60 * time.Second):
		t.Fatal("the first copy's call did not start in 60 s")
	}
	o.await(t, 60*time.Second, "the other keys' records (or a copy of d)", func() bool { return o.total() >= 4 })
	if got := count(t, pool, `select count(*) from applied where id = 'd'`); got != 0 {
		t.Fatalf("%d copies of d applied while its first copy (offset 0) calls; want the second (offset 1, another Kafka key) waiting", got)
	}
	mu.Lock()
	if fmt.Sprint(calledAt) != "[0]" {
		t.Errorf("calls of d's copies at offsets %v while the first calls, want [0]: the later copy waits for it", calledAt)
	}
	mu.Unlock()
	close(release)
	o.await(t, 30*time.Second, "both copies of d", func() bool { return o.total() == 6 })
	if a, d := o.get("applied"), o.get("duplicate"); a != 5 || d != 1 {
		t.Errorf("applied=%d duplicate=%d, want 5 and 1 (the second copy of d)", a, d)
	}
	if got := count(t, pool, `select count(*) from applied where id = 'd' and off = 0`); got != 1 {
		t.Errorf("d applied from offset 0: %d rows, want 1: the later copy overtook the earlier", got)
	}
}

// A record whose handler failed in a transaction retries in a transaction
// of its own: the records waiting behind it (here its Kafka key's) do not
// share its retries, so its next failures roll none of them back and run
// none of their handlers again. Pipelined and set-based handlers run
// every record of a batch before a failure shows; the first record fails
// its first three attempts, and no other record's handler runs between its
// second attempt and its fourth, which commits.
func TestFailedRecordRetriesInATransactionOfItsOwn(t *testing.T) {
	// run is one run of a handler over the ids of its messages, with the
	// attempt of x's message (0: not among them).
	type run struct {
		ids      []string
		xAttempt int
	}
	for _, form := range []string{"pipelined", "set"} {
		t.Run(form, func(t *testing.T) {
			pool := testenv.DB(t)
			setupJobs(t, pool)
			brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
			recs := []*kgo.Record{jobRecord("K", job{ID: "x"})}
			for i := range 4 {
				recs = append(recs, jobRecord("K", job{ID: fmt.Sprintf("y%d", i)}))
			}
			testenv.Produce(t, brokers, recs...)

			var mu sync.Mutex
			var runs []run
			note := func(msgs ...handler.Message[job]) bool {
				r := run{}
				for _, m := range msgs {
					r.ids = append(r.ids, m.Value.ID)
					if m.Value.ID == "x" {
						r.xAttempt = m.Attempt
					}
				}
				mu.Lock()
				runs = append(runs, r)
				mu.Unlock()
				return r.xAttempt > 0 && r.xAttempt <= 3 // x fails
			}
			var h consumer.Option
			switch form {
			case "pipelined":
				h = consumer.Handle(handler.NewPipelined("jobs", jobKey(), func(ctx context.Context, q handler.Queue, msg handler.Message[job]) error {
					if note(msg) {
						q.Queue(`select 1/0`) // fails x's statement: every handler of the batch has run
						return nil
					}
					q.Queue(`insert into applied(id, k, off) values($1, $2, $3)`, msg.Value.ID, string(msg.Record.Key), msg.Record.Offset)
					return nil
				}))
			default:
				h = consumer.Handle(handler.NewSet("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msgs []handler.Message[job]) error {
					if note(msgs...) {
						return errors.New("x fails")
					}
					for _, m := range msgs {
						if _, err := tx.Exec(ctx, `insert into applied(id, k, off) values($1, $2, $3)`, m.Value.ID, string(m.Record.Key), m.Record.Offset); err != nil {
							return err
						}
					}
					return nil
				}))
			}
			o := newOutcomes()
			cfg := testConfig(brokers, "alone-"+form, "jobs")
			cfg.MaxAttempts = 10
			startConsumer(t, cfg, pool, h, consumer.WithHooks(o.hooks()))
			o.await(t, 60*time.Second, "every record", func() bool { return o.total() == 5 })
			if a := o.get("applied"); a != 5 {
				t.Errorf("applied=%d, want 5 (outcomes %v)", a, o.snapshot())
			}
			mu.Lock()
			defer mu.Unlock()
			second := slices.IndexFunc(runs, func(r run) bool { return r.xAttempt == 2 })
			fourth := slices.IndexFunc(runs, func(r run) bool { return r.xAttempt == 4 })
			if second < 0 || fourth < second {
				t.Fatalf("runs %v: want x's second and fourth attempts", runs)
			}
			for _, r := range runs[second:fourth] {
				if slices.ContainsFunc(r.ids, func(id string) bool { return id != "x" }) {
					t.Errorf("%v ran between x's second and fourth attempts (x at attempt %d): x's retries share their transaction (all runs: %v)", r.ids, r.xAttempt, runs)
					break
				}
			}
			// From x's second attempt on, each other record's handler runs
			// once: after x committed, in a transaction that commits.
			ran := map[string]int{}
			for _, r := range runs[second:] {
				for _, id := range r.ids {
					ran[id]++
				}
			}
			for i := range 4 {
				if id := fmt.Sprintf("y%d", i); ran[id] != 1 {
					t.Errorf("%s's handler ran %d times from x's second attempt on, want once", id, ran[id])
				}
			}
		})
	}
}
