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
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/telemetry"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// Tests of the calls' deadline, budget, lookups and metrics.

// metricTotal sums the data points of the instrument name: a gauge's or a
// counter's values, or a histogram's counts (-1 when none is reported).
func metricTotal(t *testing.T, r *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	total, found := int64(0), false
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					total, found = total+dp.Value, true
				}
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					total, found = total+dp.Value, true
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					total, found = total+int64(dp.Count), true
				}
			}
		}
	}
	if !found {
		return -1
	}
	return total
}

// A call past Config.CallTimeout (it waits for its context) is listed as
// held while it runs past half of it, with a warning; past the deadline
// it is a failed attempt, listed with its error and retried; after
// MaxAttempts it is dead-lettered. Another key's record applies meanwhile.
func TestCallPastDeadlineIsHeldRetriedAndDeadLettered(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	ob := outbox.New()
	if err := ob.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	testenv.Produce(t, brokers, jobRecord("k1", job{ID: "hang"}), jobRecord("k2", job{ID: "free"}))

	p := newFakeProvider()
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		return insertJob(ctx, tx, msg, "")
	}, handler.WithCall(func(ctx context.Context, msg handler.Message[job]) error {
		defer p.enter(msg.Key)()
		if msg.Value.ID == "hang" {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}))
	o := newOutcomes()
	var retries atomic.Int32
	hooks := o.hooks()
	hooks.OnRetry = func(context.Context, consumer.RetryData) { retries.Add(1) }
	logs := &syncBuffer{}
	cfg := testConfig(brokers, "call-deadline", "jobs")
	cfg.CallTimeout = 1500 * time.Millisecond
	cfg.MaxAttempts = 2
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(hooks),
		consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)),
		consumer.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))

	held := func(cond string) bool {
		return count(t, pool, `select count(*) from exactly_guard_held where key = 'job:hang' and `+cond) == 1
	}
	o.await(t, 30*time.Second, "the running call listed as held", func() bool {
		return held(`attempts = 0 and last_error like '%call running%'`)
	})
	if !strings.Contains(logs.String(), "level=WARN msg=\"pre-transaction call still running") {
		t.Errorf("no warning says the call still runs:\n%s", logs.String())
	}
	o.await(t, 30*time.Second, "the call's deadline listed as its failed attempt", func() bool {
		return held(`attempts = 1 and last_error like '%CallTimeout%'`)
	})
	o.await(t, 30*time.Second, "the record dead-lettered after 2 attempts", func() bool {
		return o.get(string(dedupe.DeadLettered)) == 1
	})
	if got := o.get("applied"); got != 1 {
		t.Errorf("%d records applied, want the other key's 1", got)
	}
	if n := p.count("job:hang"); n != 2 {
		t.Errorf("the hanging call was made %d times, want MaxAttempts = 2", n)
	}
	if n := retries.Load(); n != 1 {
		t.Errorf("OnRetry fired %d times, want 1 (the second attempt is the last)", n)
	}
	o.await(t, 30*time.Second, "the held row gone", func() bool {
		return count(t, pool, `select count(*) from exactly_guard_held`) == 0
	})
}

// MaxCallsInFlight 3 over two partitions (a share of 2 each): 3 calls run
// at once, no more, while records of both wait for a slot; the gauges say
// so, and every call's duration is measured.
func TestMaxCallsInFlightBoundsCallsOverPartitions(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 2, "jobs"))
	var recs []*kgo.Record
	for i := range 12 {
		r := jobRecord(fmt.Sprintf("k%d", i), job{ID: fmt.Sprint(i)})
		r.Partition = int32(i % 2)
		recs = append(recs, r)
	}
	produceManual(t, brokers, recs...)

	p := newFakeProvider()
	gate := make(chan struct{})
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		return insertJob(ctx, tx, msg, "")
	}, handler.WithCall(func(ctx context.Context, msg handler.Message[job]) error {
		defer p.enter(msg.Key)()
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	o := newOutcomes()
	cfg := testConfig(brokers, "call-budget", "jobs")
	cfg.MaxCallsInFlight = 3
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()), consumer.WithMeterProvider(mp))
	calls := func() int64 { return metricTotal(t, reader, telemetry.MetricPartitionCalls) }
	waiting := func() int64 { return metricTotal(t, reader, telemetry.MetricPartitionCallsWaiting) }
	o.await(t, 30*time.Second, "3 calls running and 9 records waiting for a slot", func() bool {
		return calls() > 3 || calls() == 3 && waiting() >= 9
	})
	if n := calls(); n != 3 {
		t.Fatalf("%d calls in flight, want MaxCallsInFlight = 3", n)
	}
	// A record more per partition: each worker looks for a slot again.
	more := []*kgo.Record{jobRecord("k12", job{ID: "12"}), jobRecord("k13", job{ID: "13"})}
	more[1].Partition = 1
	produceManual(t, brokers, more...)
	o.await(t, 30*time.Second, "11 records waiting for a slot", func() bool { return calls() > 3 || waiting() >= 11 })
	if n := calls(); n != 3 {
		t.Errorf("%d calls in flight once more records came, want MaxCallsInFlight = 3", n)
	}
	close(gate)
	o.await(t, 30*time.Second, "every record", func() bool { return o.get("applied") >= 14 })
	if top := p.peak(); top != 3 {
		t.Errorf("at most %d calls ran at once, want 3", top)
	}
	o.await(t, 10*time.Second, "the gauges back at 0", func() bool {
		return metricTotal(t, reader, telemetry.MetricPartitionCalls) == 0 && metricTotal(t, reader, telemetry.MetricPartitionCallsWaiting) == 0
	})
	if n := metricTotal(t, reader, telemetry.MetricCallDuration); n != 14 {
		t.Errorf("%d call durations measured, want 14", n)
	}
}

// When the guard rows cannot be read before the calls (the guard table is
// locked past the lookup's bound), the records call anyway, outside any
// transaction, and the handler's Call in the transaction calls nothing.
func TestFailedGuardLookupStillCallsBeforeTransaction(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	p := newFakeProvider()
	effects := dedupe.NewEffects(nil)
	var inTx atomic.Int32
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
		_, err := effects.Precall(ctx, msg.Scope, msg.Key, func(_ context.Context, key string) ([]byte, error) {
			defer p.enter(key)()
			return []byte("receipt"), nil
		})
		return err
	}))
	o := newOutcomes()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	cfg := testConfig(brokers, "lookup-fails", "jobs")
	cfg.CallTimeout = 500 * time.Millisecond // bounds the lookup too
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()), consumer.WithMeterProvider(mp))
	testenv.Produce(t, brokers, jobRecord("k0", job{ID: "warm-up"}))
	o.await(t, 30*time.Second, "the first record applied", func() bool { return o.get("applied") >= 1 })

	ctx := context.Background()
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	unlock := func() { once.Do(func() { _ = lock.Rollback(ctx) }) }
	defer unlock()
	if _, err := lock.Exec(ctx, `lock table exactly_guard in access exclusive mode`); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 5 {
		recs = append(recs, jobRecord(fmt.Sprintf("k%d", i+1), job{ID: fmt.Sprint(i + 1)}))
	}
	testenv.Produce(t, brokers, recs...)
	skipped := func() int64 { return metricTotal(t, reader, telemetry.MetricCallsSkipped) }
	o.await(t, 15*time.Second, "5 calls made (or skipped) while the guard table is locked", func() bool {
		return p.total.Load() >= 6 || skipped() > 0
	})
	if n, s := p.total.Load(), skipped(); n != 6 || s > 0 {
		t.Errorf("%d calls made and %d skipped while the guard rows could not be read; want 6 and none", n, s)
	}
	unlock()
	o.await(t, 30*time.Second, "every record", func() bool { return o.get("applied") >= 6 })
	if n := inTx.Load(); n != 0 {
		t.Errorf("%d calls made inside transactions, want 0", n)
	}
}

// Records whose guard row exists make no call, and are counted as calls
// skipped.
func TestCallsSkippedAsDuplicatesAreCounted(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dedupe.New().ClaimBatch(ctx, tx, "jobs", []string{"job:0", "job:1", "job:2"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 5 {
		recs = append(recs, jobRecord(fmt.Sprintf("k%d", i), job{ID: fmt.Sprint(i)}))
	}
	testenv.Produce(t, brokers, recs...)
	p := newFakeProvider()
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		return insertJob(ctx, tx, msg, "")
	}, handler.WithCall(func(_ context.Context, msg handler.Message[job]) error {
		defer p.enter(msg.Key)()
		return nil
	}))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	o := newOutcomes()
	startConsumer(t, testConfig(brokers, "skipped", "jobs"), pool, consumer.Handle(h), consumer.WithHooks(o.hooks()), consumer.WithMeterProvider(mp))
	o.await(t, 30*time.Second, "every record", func() bool { return o.total() >= 5 })
	if n := p.total.Load(); n != 2 {
		t.Errorf("%d calls, want 2", n)
	}
	if n := metricTotal(t, reader, telemetry.MetricCallsSkipped); n != 3 {
		t.Errorf("%s = %d, want 3", telemetry.MetricCallsSkipped, n)
	}
	if n := metricTotal(t, reader, telemetry.MetricCallDuration); n != 2 {
		t.Errorf("%d call durations measured, want 2", n)
	}
}

// receipt is what the provider of the NewWithCall tests answers.
type receipt struct {
	ID string `json:"id"`
}

// A handler built with handler.NewWithCall declares its call once: the
// call runs before the transaction (once per key, copies included), its
// typed result reaches the transaction function, and it is recorded in
// the effects table of the service's guard, a non-default one here
// (Config.GuardTable).
func TestNewWithCallRecordsInTheServiceGuardTable(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	ctx := context.Background()
	if err := dedupe.New(dedupe.WithTable("public", "jobs_guard")).Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	var recs []*kgo.Record
	for i := range 15 { // ten keys, the first five twice
		recs = append(recs, jobRecord(fmt.Sprintf("k%d", i%10), job{ID: fmt.Sprint(i % 10)}))
	}
	testenv.Produce(t, brokers, recs...)

	p := newFakeProvider()
	h := handler.NewWithCall("jobs", jobKey(),
		func(_ context.Context, msg handler.Message[job], idempotencyKey string) (receipt, error) {
			defer p.enter(idempotencyKey)()
			if msg.Value.ID == "" {
				return receipt{}, handler.Permanent(errors.New("no order id"))
			}
			return receipt{ID: "ch_" + msg.Value.ID}, nil
		},
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[job], r receipt) error {
			return insertJob(ctx, tx, msg, r.ID)
		})
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	o := newOutcomes()
	cfg := testConfig(brokers, "new-with-call", "jobs")
	cfg.GuardTable = "public.jobs_guard"
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	o.await(t, 30*time.Second, "every record", func() bool { return o.total() >= 15 })
	if a, d := o.get("applied"), o.get("duplicate"); a != 10 || d != 5 {
		t.Errorf("applied=%d duplicate=%d, want 10 and 5", a, d)
	}
	if n := p.total.Load(); n != 10 {
		t.Errorf("%d calls for 10 keys, want 10", n)
	}
	if n := count(t, pool, `select count(*) from applied where result = 'ch_' || id`); n != 10 {
		t.Errorf("%d applied rows carry their call's result, want 10", n)
	}
	if n := count(t, pool, `select count(*) from jobs_guard_effects where state = 'done'`); n != 10 {
		t.Errorf("%d results recorded in the service's effects table, want 10", n)
	}
	if n := count(t, pool, `select count(*) from exactly_guard_effects`); n != 0 {
		t.Errorf("%d results recorded in the default effects table, want 0", n)
	}
}

// NewWithCall refuses a WithCall option and a nil call, naming them.
func TestNewWithCallValidates(t *testing.T) {
	call := func(context.Context, handler.Message[job], string) (receipt, error) { return receipt{}, nil }
	fn := func(context.Context, pgx.Tx, handler.Message[job], receipt) error { return nil }
	if err := handler.NewWithCall("jobs", jobKey(), nil, fn).Validate(); err == nil || !strings.Contains(err.Error(), "nil call") {
		t.Errorf("a nil call: %v", err)
	}
	extra := handler.WithCall(func(context.Context, handler.Message[job]) error { return nil })
	if err := handler.NewWithCall("jobs", jobKey(), call, fn, extra).Validate(); err == nil || !strings.Contains(err.Error(), "WithCall") {
		t.Errorf("a WithCall option: %v", err)
	}
	if err := handler.NewWithCall("jobs", jobKey(), call, nil).Validate(); err == nil {
		t.Errorf("a nil transaction function: no error")
	}
}

// A revoke does not wait for ever on a call that ignores its context: with
// both partitions' calls hanging, a second member joins, the first member's
// revoke of the partition it gives up ends (after at most
// EXACTLY_CALL_TIMEOUT, the call abandoned), and the second member calls
// again with the same idempotency key and applies the record.
func TestRevokeAbandonsCallIgnoringContext(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 2, "jobs"))
	a, b := jobRecord("a", job{ID: "a"}), jobRecord("b", job{ID: "b"})
	b.Partition = 1
	produceManual(t, brokers, a, b)

	p := newFakeProvider()
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) })
	var mu sync.Mutex
	first := map[string]bool{}
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		return insertJob(ctx, tx, msg, "")
	}, handler.WithCall(func(_ context.Context, msg handler.Message[job]) error {
		defer p.enter(msg.Key)()
		mu.Lock()
		hang := !first[msg.Key]
		first[msg.Key] = true
		mu.Unlock()
		if hang {
			<-stuck // ignores its context
			return errors.New("released at the end of the test")
		}
		return nil
	}))
	cfg := testConfig(brokers, "revoke-abandon", "jobs")
	cfg.CallTimeout = time.Second
	revoked := make(chan struct{}, 1)
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(consumer.Hooks{
		OnRevoke: func(context.Context, consumer.RevokeData) {
			select {
			case revoked <- struct{}{}:
			default:
			}
		},
	}))
	o := newOutcomes()
	o.await(t, 30*time.Second, "both calls hanging", func() bool { return p.total.Load() >= 2 })
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	select {
	case <-revoked:
	case <-time.After(30 * time.Second):
		t.Fatal("the revoke did not end within 30s while a call ignored its context")
	}
	o.await(t, 30*time.Second, "the moved partition's record applied by the second member", func() bool { return o.get("applied") >= 1 })
	p.mu.Lock()
	defer p.mu.Unlock()
	moved := ""
	for k, n := range p.calls {
		if n == 2 {
			moved = k
		}
	}
	if moved == "" {
		t.Errorf("calls by key %v; want the moved record's key called again", p.calls)
	}
}
