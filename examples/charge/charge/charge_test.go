package charge_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/examples/charge/charge"
	"github.com/exactly-go/exactly/examples/charge/payments"
	"github.com/exactly-go/exactly/internal/testenv"
)

// childEnv, when set ("charge" or "refund"), makes the test binary run a
// consumer that SIGKILLs itself just before its first database COMMIT,
// instead of the tests.
const childEnv = "EXACTLY_TEST_CHARGE_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runChild(mode))
	}
	testenv.Main(m)
}

// runChild is the worker that dies: after the payment API was called for
// every record of its first batch, and before the transaction that records
// the results commits.
func runChild(mode string) int {
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
	svc := charge.New(&payments.Client{BaseURL: os.Getenv("PAYMENTS_URL")})
	var h consumer.Option
	switch mode {
	case "charge":
		h = consumer.Handle(svc.Handler(), charge.CommandsTopic)
	case "refund":
		h = consumer.Handle(svc.RefundHandler(pool), charge.RefundsTopic)
	default:
		fmt.Fprintln(os.Stderr, "unknown child mode", mode)
		return 1
	}
	c, err := consumer.New(cfg, pool, h,
		consumer.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))),
		consumer.WithHooks(consumer.Hooks{
			BeforeDBCommit: func(context.Context, consumer.CommitData) {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // never reach COMMIT, however late the signal lands
			},
		}))
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

type fixture struct {
	url     string
	pool    *pgxpool.Pool
	srv     *payments.Server
	client  *payments.Client
	svc     *charge.Service
	brokers []string
}

func setup(t *testing.T, topic string) *fixture {
	t.Helper()
	f := &fixture{url: testenv.DBURL(t)}
	pool, err := pgxpool.New(context.Background(), f.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	f.pool = pool
	srv, err := payments.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	f.srv = srv
	f.client = &payments.Client{BaseURL: srv.URL()}
	f.svc = charge.New(f.client)
	if err := f.svc.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	f.brokers = testenv.Brokers(testenv.Kafka(t, 1, topic))
	return f
}

func (f *fixture) produce(t *testing.T, topic string, values ...any) {
	t.Helper()
	var recs []*kgo.Record
	for _, v := range values {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: topic, Value: b})
	}
	testenv.Produce(t, f.brokers, recs...)
}

// crashChild runs the self-killing worker to its death and checks that it
// died by SIGKILL.
func (f *fixture) crashChild(t *testing.T, mode, topic string) {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(),
		childEnv+"="+mode,
		"DATABASE_URL="+f.url,
		"PAYMENTS_URL="+f.srv.URL(),
		"EXACTLY_KAFKA_BROKERS="+f.brokers[0],
		"EXACTLY_GROUP=charge",
		"EXACTLY_TOPICS="+topic,
		"EXACTLY_COMMIT_INTERVAL=1h",
		"EXACTLY_SESSION_TIMEOUT=6s",
	)
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- child.Wait() }()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		_ = child.Process.Kill()
		<-done
		t.Fatal("the worker did not reach its first COMMIT within 90s")
	}
	ws, ok := child.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("worker ended with %v, want killed by SIGKILL before COMMIT", child.ProcessState)
	}
}

// successor runs a consumer of the same group in this process until want
// records have an outcome.
func (f *fixture) successor(t *testing.T, h consumer.Option, topic string, want int) map[string]int {
	t.Helper()
	cfg := consumer.DefaultConfig()
	cfg.Brokers, cfg.Group, cfg.Topics = f.brokers, "charge", []string{topic}
	cfg.CommitInterval = 100 * time.Millisecond
	cfg.SessionTimeout = 6 * time.Second
	cfg.RetryBackoff, cfg.RetryBackoffMax = 20*time.Millisecond, 200*time.Millisecond
	var mu sync.Mutex
	outcomes := map[string]int{}
	changed := make(chan struct{}, 1)
	c, err := consumer.New(cfg, f.pool, h, consumer.WithHooks(consumer.Hooks{
		OnOutcome: func(_ context.Context, d consumer.OutcomeData) {
			outcome := d.Outcome
			mu.Lock()
			outcomes[string(outcome)]++
			mu.Unlock()
			select {
			case changed <- struct{}{}:
			default:
			}
		},
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(ctx) }()
	stopped := false
	defer func() {
		cancel()
		if stopped {
			return
		}
		if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("successor: %v", err)
		}
	}()
	deadline := time.After(90 * time.Second)
	for {
		mu.Lock()
		n := 0
		for _, v := range outcomes {
			n += v
		}
		snap := map[string]int{}
		for k, v := range outcomes {
			snap[k] = v
		}
		mu.Unlock()
		if n >= want {
			return snap
		}
		select {
		case <-changed:
		case err := <-runErr:
			stopped = true
			t.Fatalf("successor stopped: %v", err)
		case <-deadline:
			t.Fatalf("timed out waiting for %d outcomes, have %v", want, snap)
		}
	}
}

func (f *fixture) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// The check for external APIs of Making Background Jobs Idempotent: the worker is killed after the API
// call and before the database commit; on redelivery the API returns the
// original charge, no second charge exists, and the orders' charges table
// holds the charge ids.
func TestKilledAfterChargeBeforeCommitChargesOnce(t *testing.T) {
	f := setup(t, charge.CommandsTopic)
	const n = 5
	var cmds []any
	for i := range n {
		c := charge.Command{OrderID: fmt.Sprintf("order-%d", i), Amount: int64(100 + i)}
		cmds = append(cmds, c, c) // every command delivered twice
	}
	f.produce(t, charge.CommandsTopic, cmds...)

	f.crashChild(t, "charge", charge.CommandsTopic)
	charged := len(f.srv.Charges())
	if charged == 0 {
		t.Fatal("the worker died before calling the payment API: the test did not exercise the window")
	}
	if got := f.count(t, `select count(*) from charges`); got != 0 {
		t.Fatalf("%d charges rows committed by the killed worker, want 0", got)
	}

	out := f.successor(t, consumer.Handle(f.svc.Handler(), charge.CommandsTopic), charge.CommandsTopic, 2*n)
	if out["applied"] != n || out["duplicate"] != n {
		t.Errorf("successor outcomes %v, want %d applied and %d duplicate", out, n, n)
	}

	perOrder := map[string][]payments.Charge{}
	for _, c := range f.srv.Charges() {
		perOrder[c.OrderID] = append(perOrder[c.OrderID], c)
	}
	if len(perOrder) != n {
		t.Errorf("charges for %d orders at the provider, want %d", len(perOrder), n)
	}
	for order, cs := range perOrder {
		if len(cs) != 1 {
			t.Errorf("order %s charged %d times: %+v", order, len(cs), cs)
			continue
		}
		var stored string
		if err := f.pool.QueryRow(context.Background(), `select charge_id from charges where order_id = $1`, order).Scan(&stored); err != nil {
			t.Errorf("order %s: %v", order, err)
		} else if stored != cs[0].ID {
			t.Errorf("order %s: charges table has %s, the provider charged %s", order, stored, cs[0].ID)
		}
	}
	st := f.srv.Stats()
	if st.Replays != charged || st.ChargeRequests != n+charged {
		t.Errorf("provider stats %+v: want %d idempotent replays (the orders charged before the kill) and %d requests", st, charged, n+charged)
	}
	if got := f.count(t, `select count(*) from exactly_guard_effects where state = 'done'`); got != n {
		t.Errorf("%d recorded results, want %d", got, n)
	}
}

// chargeOrders charges orders directly (as the charge handler would have)
// so that refunds have something to refund.
func (f *fixture) chargeOrders(t *testing.T, orders ...string) {
	t.Helper()
	ctx := context.Background()
	for _, o := range orders {
		ch, err := f.client.CreateCharge(ctx, "charge:"+o, payments.ChargeParams{Amount: 500, Currency: "eur", OrderID: o})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.pool.Exec(ctx, `insert into charges (order_id, charge_id, amount) values ($1, $2, $3)`, o, ch.ID, ch.Amount); err != nil {
			t.Fatal(err)
		}
	}
}

// An API without idempotency keys: the worker is killed after the refund
// call and before the commit that records "done". On redelivery reconcile
// finds each refund by its reference and nothing is refunded twice.
func TestKilledAfterLegacyRefundBeforeCommitReconciles(t *testing.T) {
	f := setup(t, charge.RefundsTopic)
	const n = 4
	var orders []string
	var cmds []any
	for i := range n {
		o := fmt.Sprintf("order-%d", i)
		orders = append(orders, o)
		cmds = append(cmds, charge.RefundCommand{OrderID: o, Amount: 200})
	}
	f.chargeOrders(t, orders...)
	f.produce(t, charge.RefundsTopic, cmds...)

	f.crashChild(t, "refund", charge.RefundsTopic)
	refunded := len(f.srv.Refunds())
	if refunded == 0 {
		t.Fatal("the worker died before refunding: the test did not exercise the window")
	}
	if got := f.count(t, `select count(*) from exactly_guard_effects where state = 'started'`); got != refunded {
		t.Fatalf("%d started rows after the kill, want %d (one per refund made)", got, refunded)
	}
	if got := f.count(t, `select count(*) from refunds`); got != 0 {
		t.Fatalf("%d refunds rows committed by the killed worker", got)
	}

	out := f.successor(t, consumer.Handle(f.svc.RefundHandler(f.pool), charge.RefundsTopic), charge.RefundsTopic, n)
	if out["applied"] != n {
		t.Errorf("successor outcomes %v, want %d applied", out, n)
	}
	st := f.srv.Stats()
	if st.RefundRequests != n {
		t.Errorf("%d refunds made, want %d: a refund found by reconcile was made again", st.RefundRequests, n)
	}
	if st.RefundLookups != refunded {
		t.Errorf("%d reconcile lookups, want %d (one per started refund)", st.RefundLookups, refunded)
	}
	perOrder := map[string]string{}
	for _, r := range f.srv.Refunds() {
		perOrder[r.Reference] = r.ID
	}
	for _, o := range orders {
		var stored string
		if err := f.pool.QueryRow(context.Background(), `select refund_id from refunds where order_id = $1`, o).Scan(&stored); err != nil {
			t.Errorf("order %s: %v", o, err)
		} else if want := perOrder[charge.RefundKey(charge.RefundCommand{OrderID: o})]; stored != want {
			t.Errorf("order %s: refunds table has %s, the provider refunded %s", o, stored, want)
		}
	}
	if got := f.count(t, `select count(*) from exactly_guard_effects where state = 'done'`); got != n {
		t.Errorf("%d done rows, want %d", got, n)
	}
}

// The first refund request fails before the provider acted: "started" is
// committed, the retry asks reconcile, which finds nothing, and refunds
// once.
func TestRefundFailedBeforeActingIsMadeOnce(t *testing.T) {
	f := setup(t, charge.RefundsTopic)
	f.chargeOrders(t, "order-1")
	f.srv.FailRefunds(1)
	f.produce(t, charge.RefundsTopic, charge.RefundCommand{OrderID: "order-1", Amount: 300})

	out := f.successor(t, consumer.Handle(f.svc.RefundHandler(f.pool), charge.RefundsTopic), charge.RefundsTopic, 1)
	if out["applied"] != 1 {
		t.Errorf("outcomes %v, want 1 applied", out)
	}
	st := f.srv.Stats()
	if st.RefundRequests != 1 || len(f.srv.Refunds()) != 1 {
		t.Errorf("%d refunds made (%+v), want 1", len(f.srv.Refunds()), st)
	}
	if st.RefundLookups != 1 {
		t.Errorf("%d reconcile lookups, want 1", st.RefundLookups)
	}
	var attempts int
	if err := f.pool.QueryRow(context.Background(), `select attempts from exactly_guard_effects where state = 'done'`).Scan(&attempts); err != nil || attempts != 2 {
		t.Errorf("attempts = %d, %v; want 2 (the failed call and the one that refunded)", attempts, err)
	}
}

// Instances that start at once all set up the schema: none fails on the
// catalog race of concurrent "create table if not exists" (duplicate key
// in pg_type_typname_nsp_index), which hit about half of the starts of two
// instances before the set-up took an advisory lock.
func TestMigrateWhenInstancesStartAtOnce(t *testing.T) {
	const instances = 6
	for round := range 4 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			pool := testenv.DB(t)
			start := make(chan struct{})
			errs := make(chan error, instances)
			for range instances {
				go func() {
					<-start
					errs <- charge.New(&payments.Client{}).Migrate(context.Background(), pool)
				}()
			}
			close(start)
			for range instances {
				if err := <-errs; err != nil {
					t.Errorf("one of %d concurrent set-ups failed: %v", instances, err)
				}
			}
		})
	}
}
