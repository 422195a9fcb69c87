package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sethvargo/go-envconfig"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

type credit struct {
	OrderID string `json:"order_id"`
	Account int64  `json:"account"`
	Amount  int64  `json:"amount"`
}

func setupLedger(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `create table if not exists ledger(id bigserial primary key, order_id text not null, account bigint not null, amount bigint not null, topic text, part int, off bigint)`); err != nil {
		t.Fatal(err)
	}
}

// creditKey keys a credit by its order: the key of every credit handler in
// these tests.
func creditKey() handler.KeySource[credit] {
	return handler.FromPayload(func(c credit) string { return dedupe.Key("credit", c.OrderID) })
}

// insertCredit writes c to the ledger in tx, as the credit handlers of
// these tests do; it returns the database's error unchanged.
func insertCredit(ctx context.Context, tx pgx.Tx, c credit) error {
	_, err := tx.Exec(ctx, `insert into ledger(order_id, account, amount) values($1,$2,$3)`, c.OrderID, c.Account, c.Amount)
	return err
}

// creditEmitter returns the handler "credit-emit": it writes each credit to
// the ledger and adds it, as JSON keyed by its order, to the "credited"
// topic through ob (nil: the default outbox).
func creditEmitter(ob *outbox.Outbox) *handler.Handler[credit] {
	if ob == nil {
		ob = outbox.New()
	}
	return handler.New("credit-emit", creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			if err := insertCredit(ctx, tx, msg.Value); err != nil {
				return err
			}
			return ob.AddJSON(ctx, tx, "credited", []byte(msg.Value.OrderID), msg.Value)
		})
}

func creditHandler(work time.Duration) *handler.Handler[credit] {
	return handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			if work > 0 {
				time.Sleep(work) // simulated work inside the transaction
			}
			_, err := tx.Exec(ctx, `insert into ledger(order_id, account, amount, topic, part, off) values($1,$2,$3,$4,$5,$6)`,
				msg.Value.OrderID, msg.Value.Account, msg.Value.Amount, msg.Record.Topic, msg.Record.Partition, msg.Record.Offset)
			return err
		})
}

// produceManual produces recs, each to the partition it names, failing t
// on the first error.
func produceManual(t testing.TB, brokers []string, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// produceCopies sends n credits, each copies times, copy c of credit i to
// partition (i+c) mod partitions, so that copies land on different partitions.
func produceCopies(t testing.TB, brokers []string, topic string, n, copies int, partitions int32) {
	t.Helper()
	var recs []*kgo.Record
	for i := 0; i < n; i++ {
		v, _ := json.Marshal(credit{OrderID: fmt.Sprintf("order-%d", i), Account: int64(i % 10), Amount: 100})
		for c := 0; c < copies; c++ {
			recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(i+c) % partitions, Value: v})
		}
	}
	produceManual(t, brokers, recs...)
}

func testConfig(brokers []string, group string, topics ...string) consumer.Config {
	c := consumer.DefaultConfig()
	c.Brokers = brokers
	c.Group = group
	c.Topics = topics
	c.CommitInterval = 100 * time.Millisecond
	c.SessionTimeout = 6 * time.Second
	c.RebalanceTimeout = 10 * time.Second
	c.RetryBackoff = 20 * time.Millisecond
	c.RetryBackoffMax = 200 * time.Millisecond
	return c
}

// outcomes collects what consumers report, and lets a test await counts.
type outcomes struct {
	mu       sync.Mutex
	counts   map[string]int
	finished map[string]map[int32]map[int64]bool
	commits  []map[string]map[int32]int64
	changed  chan struct{}
}

func newOutcomes() *outcomes {
	return &outcomes{counts: map[string]int{}, finished: map[string]map[int32]map[int64]bool{}, changed: make(chan struct{}, 1)}
}

func (o *outcomes) hooks() consumer.Hooks {
	return consumer.Hooks{
		OnOutcome: func(_ context.Context, d consumer.OutcomeData) {
			rec, outcome := d.Record, d.Outcome
			o.mu.Lock()
			o.counts[string(outcome)]++
			if o.finished[rec.Topic] == nil {
				o.finished[rec.Topic] = map[int32]map[int64]bool{}
			}
			if o.finished[rec.Topic][rec.Partition] == nil {
				o.finished[rec.Topic][rec.Partition] = map[int64]bool{}
			}
			o.finished[rec.Topic][rec.Partition][rec.Offset] = true
			o.mu.Unlock()
			select {
			case o.changed <- struct{}{}:
			default:
			}
		},
		OnOffsetsCommitted: func(_ context.Context, d consumer.OffsetsCommittedData) {
			offsets := d.Offsets
			o.mu.Lock()
			o.commits = append(o.commits, offsets)
			o.mu.Unlock()
		},
	}
}

func (o *outcomes) total() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, c := range o.counts {
		n += c
	}
	return n
}

func (o *outcomes) get(outcome string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.counts[outcome]
}

// await blocks until cond holds, failing t after timeout.
func (o *outcomes) await(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-o.changed:
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s (outcomes %v)", timeout, what, o.snapshot())
		}
	}
}

func (o *outcomes) snapshot() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := map[string]int{}
	for k, v := range o.counts {
		m[k] = v
	}
	return m
}

// awaitCommitted blocks until the last offsets the consumer committed put
// topic's partition p at off, failing t after timeout.
func (o *outcomes) awaitCommitted(t testing.TB, timeout time.Duration, topic string, p int32, off int64) {
	t.Helper()
	o.await(t, timeout, fmt.Sprintf("the committed offset of %s/%d at %d", topic, p, off), func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return len(o.commits) > 0 && o.commits[len(o.commits)-1][topic][p] == off
	})
}

// checkCommitsTrail fails t if any committed offset is past a record whose
// outcome was not reported (its transaction had not committed).
func (o *outcomes) checkCommitsTrail(t testing.TB) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, c := range o.commits {
		for topic, parts := range c {
			for p, off := range parts {
				for x := int64(0); x < off; x++ {
					if !o.finished[topic][p][x] {
						t.Errorf("offset %d committed on %s/%d but record %d never finished", off, topic, p, x)
						return
					}
				}
			}
		}
	}
}

func count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func startConsumer(t testing.TB, cfg consumer.Config, pool *pgxpool.Pool, opts ...consumer.Option) (stop func()) {
	t.Helper()
	c, err := consumer.New(cfg, pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("consumer run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// Three copies of every credit on different partitions, processed by two
// group members at once: one effect per key.
func TestTwoMembersConcurrentCopiesApplyOnce(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	const parts, n, copies = 6, 100, 3
	kc := testenv.Kafka(t, parts, "credits")
	brokers := testenv.Brokers(kc)
	produceCopies(t, brokers, "credits", n, copies, parts)

	o := newOutcomes()
	cfg := testConfig(brokers, "g1", "credits")
	startConsumer(t, cfg, pool, consumer.Handle(creditHandler(0)), consumer.WithHooks(o.hooks()))
	startConsumer(t, cfg, pool, consumer.Handle(creditHandler(0)), consumer.WithHooks(o.hooks()))
	o.await(t, 60*time.Second, "every delivery", func() bool { return o.total() >= n*copies })

	if got := count(t, pool, `select count(*) from ledger`); got != n {
		t.Errorf("ledger rows = %d, want %d", got, n)
	}
	if got := count(t, pool, `select count(*) from exactly_guard`); got != n {
		t.Errorf("guard rows = %d, want %d", got, n)
	}
	if a, d := o.get("applied"), o.get("duplicate"); a != n || d != n*(copies-1) {
		t.Errorf("applied=%d duplicate=%d, want %d and %d", a, d, n, n*(copies-1))
	}
	o.checkCommitsTrail(t)
}

// A second member joins and leaves while records are in flight (the handler
// takes a while): every key applied exactly once, and no committed offset
// is ever past an unfinished record.
func TestMemberJoinsAndLeavesMidFlight(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	const parts, n = 6, 240
	kc := testenv.Kafka(t, parts, "credits")
	brokers := testenv.Brokers(kc)
	produceCopies(t, brokers, "credits", n, 1, parts)

	o := newOutcomes()
	cfg := testConfig(brokers, "g2", "credits")
	cfg.BatchMaxRecords = 4
	startConsumer(t, cfg, pool, consumer.Handle(creditHandler(5*time.Millisecond)), consumer.WithHooks(o.hooks()))
	o.await(t, 30*time.Second, "a first share", func() bool { return o.total() >= n/6 })
	stopB := startConsumer(t, cfg, pool, consumer.Handle(creditHandler(5*time.Millisecond)), consumer.WithHooks(o.hooks()))
	before := o.total()
	o.await(t, 30*time.Second, "progress with two members", func() bool { return o.total() >= before+n/6 })
	stopB()
	o.await(t, 60*time.Second, "every record", func() bool {
		return count(t, pool, `select count(distinct order_id) from ledger`) == n
	})
	if got := count(t, pool, `select count(*) from ledger`); got != n {
		t.Errorf("ledger rows = %d, want %d (a key applied twice)", got, n)
	}
	o.checkCommitsTrail(t)
	// Records of one partition were applied in offset order, across the
	// handovers: ledger ids (commit order) grow with the offsets.
	if n := count(t, pool, `select count(*) from (
		select off, lag(off) over (partition by part order by id) as prev from ledger) x
		where prev >= off`); n != 0 {
		t.Errorf("%d records applied before a record that precedes them in their partition", n)
	}
	// What the broker holds, not what the consumer says it committed: every
	// record below a committed offset has its effect in the database.
	adm := kadm.NewClient(mustClient(t, brokers))
	defer adm.Close()
	offsets, err := adm.FetchOffsets(context.Background(), "g2")
	if err != nil {
		t.Fatal(err)
	}
	offsets.Each(func(or kadm.OffsetResponse) {
		if or.Err != nil {
			t.Errorf("offset of %s/%d: %v", or.Topic, or.Partition, or.Err)
			return
		}
		below := count(t, pool, `select count(*) from ledger where part = $1 and off < $2`, or.Partition, or.At)
		if int64(below) != or.At {
			t.Errorf("partition %d: committed offset %d, but only %d records below it are in the ledger", or.Partition, or.At, below)
		}
	})
}

func mustClient(t testing.TB, brokers []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// A record whose handler fails once is retried and applied once; the first
// attempt's writes were rolled back.
func TestHandlerErrorRetriedThenApplied(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "credits")
	brokers := testenv.Brokers(kc)
	produceCopies(t, brokers, "credits", 5, 1, 1)
	var mu sync.Mutex
	failed := map[string]bool{}
	h := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			// The row records the attempt that wrote it.
			if _, err := tx.Exec(ctx, `insert into ledger(order_id, account, amount) values($1,$2,$3)`, msg.Value.OrderID, msg.Value.Account, msg.Attempt); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if !failed[msg.Key] {
				failed[msg.Key] = true
				return errors.New("payment service unavailable")
			}
			return nil
		})
	o := newOutcomes()
	var retries atomic.Int32
	hooks := o.hooks()
	hooks.OnRetry = func(context.Context, consumer.RetryData) { retries.Add(1) }
	cfg := testConfig(brokers, "g3", "credits")
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(hooks))
	o.await(t, 30*time.Second, "five applied", func() bool { return o.get("applied") == 5 })
	// Each failed first attempt was rolled back: only the second attempts'
	// rows committed, and each failure was reported as a retry.
	if got := count(t, pool, `select count(*) from ledger`); got != 5 {
		t.Errorf("ledger rows = %d, want 5", got)
	}
	if got := count(t, pool, `select count(*) from ledger where amount = 2`); got != 5 {
		t.Errorf("ledger rows written by a second attempt = %d, want 5 (the failed first attempts must roll back)", got)
	}
	if n := retries.Load(); n != 5 {
		t.Errorf("%d retries reported, want 5", n)
	}
}

// With key concurrency off and without a dead-letter topic, a record whose
// handler keeps failing holds its partition: nothing after it is applied
// and no offset passes it. (With key concurrency on it holds only its key:
// TestRetryHoldsOnlyItsKeyAndOffsetsTrail.)
func TestPoisonRecordHoldsPartition(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "credits")
	brokers := testenv.Brokers(kc)
	produceCopies(t, brokers, "credits", 6, 1, 1)
	attempts := make(chan struct{}, 100)
	h := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			if msg.Value.OrderID == "order-3" {
				select {
				case attempts <- struct{}{}:
				default:
				}
				return errors.New("always fails")
			}
			return insertCredit(ctx, tx, msg.Value)
		})
	o := newOutcomes()
	cfg := testConfig(brokers, "g4", "credits")
	cfg.MaxAttempts = 2 // no dead letters configured: ignored, the record holds
	cfg.KeyConcurrency = 1
	stop := startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	for i := 0; i < 4; i++ {
		select {
		case <-attempts:
		case <-time.After(30 * time.Second):
			t.Fatal("poison record was not retried")
		}
	}
	stop()
	if got := count(t, pool, `select count(*) from ledger`); got != 3 {
		t.Errorf("ledger rows = %d, want 3 (order-0..2; nothing after the poison record)", got)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, c := range o.commits {
		if off := c["credits"][0]; off > 3 {
			t.Errorf("committed offset %d is past the poison record at offset 3", off)
		}
	}
}

// A connection killed in the middle of a handler is an outage, not a
// handler failure: the batch is retried and applied once.
func TestLostConnectionIsRetried(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "credits")
	brokers := testenv.Brokers(kc)
	produceCopies(t, brokers, "credits", 3, 1, 1)
	var once sync.Once
	h := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			var err error
			once.Do(func() {
				_, err = tx.Exec(ctx, `select pg_terminate_backend(pg_backend_pid())`)
			})
			if err != nil {
				return fmt.Errorf("inserting ledger row: %w", err)
			}
			_, err = tx.Exec(ctx, `insert into ledger(order_id, account, amount) values($1,$2,$3)`, msg.Value.OrderID, msg.Value.Account, msg.Value.Amount)
			return err
		})
	o := newOutcomes()
	cfg := testConfig(brokers, "g5", "credits")
	cfg.MaxAttempts = 1
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	o.await(t, 30*time.Second, "three applied", func() bool { return o.get("applied") == 3 })
	if got := count(t, pool, `select count(*) from ledger`); got != 3 {
		t.Errorf("ledger rows = %d, want 3", got)
	}
}

// An outage (here the transaction's connection dies, four times running)
// holds the partition's transactions for a backoff that doubles from
// RetryBackoff to RetryBackoffMax: each retry starts no sooner than the
// backoff after the failure before it, and each failure is one warning,
// not a retry at once in a loop with a warning per try. With key
// concurrency on and off.
func TestOutageIsRetriedWithBackoff(t *testing.T) {
	for _, kc := range []int{64, 1} {
		t.Run(fmt.Sprintf("KeyConcurrency=%d", kc), func(t *testing.T) {
			pool := testenv.DB(t)
			setupLedger(t, pool)
			kfk := testenv.Kafka(t, 1, "credits")
			brokers := testenv.Brokers(kfk)
			produceCopies(t, brokers, "credits", 1, 1, 1)
			const outages = 4
			var mu sync.Mutex
			var starts []time.Time
			h := handler.New("credit", creditKey(),
				func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
					mu.Lock()
					starts = append(starts, time.Now())
					n := len(starts)
					mu.Unlock()
					if n <= outages {
						_, err := tx.Exec(ctx, `select pg_terminate_backend(pg_backend_pid())`)
						return fmt.Errorf("inserting ledger row: %w", err)
					}
					_, err := tx.Exec(ctx, `insert into ledger(order_id, account, amount) values($1,$2,$3)`, msg.Value.OrderID, msg.Value.Account, msg.Value.Amount)
					return err
				})
			o := newOutcomes()
			logs := newLogCapture()
			cfg := testConfig(brokers, "g-outage", "credits")
			cfg.KeyConcurrency = kc
			cfg.RetryBackoff, cfg.RetryBackoffMax = 100*time.Millisecond, 400*time.Millisecond
			startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()), consumer.WithLogger(slog.New(logs)))
			o.await(t, 30*time.Second, "the record applied after the outages", func() bool { return o.get("applied") == 1 })
			mu.Lock()
			defer mu.Unlock()
			if len(starts) != outages+1 {
				t.Fatalf("the handler ran %d times, want %d (%d outages, then the commit)", len(starts), outages+1, outages)
			}
			for i := 1; i < len(starts); i++ {
				want := min(cfg.RetryBackoff<<(i-1), cfg.RetryBackoffMax)
				if gap := starts[i].Sub(starts[i-1]); gap < want {
					t.Errorf("retry %d started %v after the failure before it, want at least the backoff %v", i, gap, want)
				}
			}
			if n := len(logs.matching("transaction failed; retrying the batch")); n != outages {
				t.Errorf("%d outage warnings, want %d: one per failed try", n, outages)
			}
		})
	}
}

const childEnv = "EXACTLY_TEST_CHILD_CONSUMER"

// runChildConsumer is the consumer process that
// TestCrashAfterDBCommitBeforeOffsetCommit kills with SIGKILL; TestMain runs
// it instead of the tests when childEnv is set.
func runChildConsumer() int {
	ctx := context.Background()
	cfg, err := consumer.ConfigFromEnv(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c, err := consumer.New(cfg, pool, consumer.Handle(creditHandler(0)), consumer.WithHooks(crashHooks()),
		consumer.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := c.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// A consumer process dies hard (SIGKILL) after its database commits and
// before any offset commit: its successor gets every record again and skips
// all of them as duplicates; the effects are unchanged.
func TestCrashAfterDBCommitBeforeOffsetCommit(t *testing.T) {
	url := testenv.DBURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	setupLedger(t, pool)
	const parts, n = 3, 60
	kc := testenv.Kafka(t, parts, "credits")
	brokers := testenv.Brokers(kc)
	produceCopies(t, brokers, "credits", n, 1, parts)

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(),
		childEnv+"=1",
		"DATABASE_URL="+url,
		"EXACTLY_KAFKA_BROKERS="+brokers[0],
		"EXACTLY_GROUP=crash",
		"EXACTLY_TOPICS=credits",
		"EXACTLY_COMMIT_INTERVAL=1h", // never commits offsets before the kill
		"EXACTLY_SESSION_TIMEOUT=6s",
	)
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	o := newOutcomes()
	o.await(t, 60*time.Second, "the child to commit every record to the database", func() bool {
		return count(t, pool, `select count(*) from ledger`) == n
	})
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()

	cfg := testConfig(brokers, "crash", "credits")
	startConsumer(t, cfg, pool, consumer.Handle(creditHandler(0)), consumer.WithHooks(o.hooks()))
	o.await(t, 60*time.Second, "every redelivered record", func() bool { return o.total() >= n })
	if a, d := o.get("applied"), o.get("duplicate"); a != 0 || d != n {
		t.Errorf("successor: applied=%d duplicate=%d, want 0 and %d", a, d, n)
	}
	if got := count(t, pool, `select count(*) from ledger`); got != n {
		t.Errorf("ledger rows = %d, want %d", got, n)
	}
	if got := count(t, pool, `select count(*) from exactly_guard`); got != n {
		t.Errorf("guard rows = %d, want %d", got, n)
	}
}

func TestBadEnvironmentVariableIsNamed(t *testing.T) {
	for name, env := range map[string]map[string]string{
		"EXACTLY_MAX_ATTEMPTS":        {"EXACTLY_MAX_ATTEMPTS": "five"},
		"EXACTLY_COMMIT_INTERVAL":     {"EXACTLY_COMMIT_INTERVAL": "soon"},
		"EXACTLY_BATCH_MAX_RECORDS":   {"EXACTLY_BATCH_MAX_RECORDS": "0"},
		"EXACTLY_KEY_CONCURRENCY":     {"EXACTLY_KEY_CONCURRENCY": "-2"},
		"EXACTLY_MAX_CALLS_IN_FLIGHT": {"EXACTLY_MAX_CALLS_IN_FLIGHT": "0"},
		"EXACTLY_MAX_OFFSET_GAP":      {"EXACTLY_MAX_OFFSET_GAP": "-1"},
		"EXACTLY_SESSION_TIMEOUT":     {"EXACTLY_SESSION_TIMEOUT": "10ms"},
		"EXACTLY_GUARD_RETENTION":     {"EXACTLY_GUARD_RETENTION": "24h"}, // shorter than the 7-day horizon
	} {
		_, err := consumer.ConfigFromLookuper(context.Background(), envconfig.MapLookuper(env))
		if err == nil {
			t.Errorf("%s=%s: no error", name, env[name])
			continue
		}
		if !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%s: error %q does not name the variable", name, env[name], err)
		}
	}
}

// The defaults are the ones docs/configuration.md documents.
func TestDefaultConfig(t *testing.T) {
	c := consumer.DefaultConfig()
	if c.Group != "exactly" || c.MaxAttempts != 5 || c.BatchMaxRecords != 100 || c.CommitInterval != time.Second ||
		c.GuardTable != "exactly_guard" || c.DeadLetterSuffix != ".dlq" || len(c.Brokers) != 0 {
		t.Errorf("defaults %+v differ from docs/configuration.md's table", c)
	}
}
