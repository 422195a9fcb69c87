package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/exactly-go/exactly/cmd/exactly/internal/naive"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/credit"
	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/migrate"
	"github.com/exactly-go/exactly/outbox"
)

// Scenario kinds a child process runs.
const (
	kindLimit   = "limit"
	kindNaive   = "naive"
	kindExactly = "exactly"
	kindHotRow  = "hotrow"
	// kindHotLimit: the hot-row transfers' UPDATEs alone, one connection.
	kindHotLimit = "hotlimit"
	kindRelay    = "relay"
)

// Handler forms an exactly scenario runs (Spec.Form).
const (
	// formTx is the credit handler as users write it today: a handler.Func
	// that calls tx.Exec for the ledger row and adds the event to the
	// outbox.
	formTx = "tx"
	// formPipelined is the credit effect written by the pipelined handler
	// form (handler.NewPipelined): its statements queued, not executed, and
	// sent in one pipeline with the claim and the outbox rows.
	formPipelined = "pipelined"
	// formSetBased is the credit effect written by the set-based handler
	// form (handler.NewSet): one call per batch with all its
	// non-duplicate messages, writing with INSERT … SELECT unnest.
	formSetBased = "setbased"
)

// formAvailable reports whether this build has the handler form: the
// scenarios of a form that is not available are reported as n/a.
func formAvailable(form string) bool {
	switch form {
	case "", formTx, formPipelined, formSetBased:
		return true
	}
	return false
}

// childAppName is the application_name of a child's connections: the
// parent waits until none is left before it reads the database's deadlock
// count.
const childAppName = "exactly-bench-child"

// Spec is what one child process measures. The parent passes it as JSON.
type Spec struct {
	Kind        string
	DatabaseURL string
	Brokers     []string
	Topic       string
	Group       string
	Schema      string
	Events      string
	Records     int
	Accounts    int
	Partitions  int
	Batch       int
	Conns       int
	// Shape is a limit's statement shape (shapeRowWise, shapePipelined,
	// shapeSetBased).
	Shape string
	// Guard makes the naive loop claim a guard row in each record's
	// transaction.
	Guard bool
	// SliceCommit makes the naive loop commit with CommitRecords after each
	// slice (a synchronous round trip) instead of marking each record and
	// letting kgo.AutoCommitMarks commit in the background.
	SliceCommit bool
	// Form is an exactly scenario's handler form (formTx by default).
	Form string
	// PaceRate, when positive, makes an exactly child produce Records
	// itself at this rate (records/s) to Topic while consuming, and the
	// relay child's second phase add outbox rows at this rate.
	PaceRate int
	// PaceFor is how long the relay's paced phase lasts.
	PaceFor time.Duration
	// Timeout bounds the child's measurement.
	Timeout time.Duration
	// Mode is a scale scenario's outbox mode (modeTable, modeSharded,
	// modeWAL).
	Mode string
	// Partial makes an exactly child that reaches Timeout report the rate
	// of the records committed so far instead of failing.
	Partial bool
}

// Result is one scenario's measurement.
type Result struct {
	// ID is the scenario's id (ScenarioIDs), Name its row in the table.
	ID   string
	Name string
	// Missing is set for a scenario this build cannot run (its handler
	// form does not exist): it is reported as n/a.
	Missing bool
	Records int
	Seconds float64
	Rate    float64
	// P50 and P99 are latencies in milliseconds, -1 when not measured.
	P50, P99 float64
	// MaxRSS is the child's peak resident set (VmHWM), KiB, and CPU its
	// user and system time, seconds (set by the parent).
	MaxRSS int64
	CPU    float64
	// Applied and Duplicate count the exactly outcomes.
	Applied, Duplicate int64
	// AckP50 and AckP99 are the relay's commit-to-ack latencies (ms) in the
	// paced phase, PacedEvents how many events it added.
	AckP50, AckP99 float64
	PacedEvents    int
	// Deadlocks is how many deadlocks PostgreSQL detected in the bench
	// database while the scenario ran (pg_stat_database), set by the
	// parent; -1 when unknown.
	Deadlocks int64
	// Ideal is the I/O-bound scenario's ideal rate: calls in flight ÷ the
	// provider's latency (0 for the others).
	Ideal float64 `json:",omitempty"`
	Note  string
	// Rounds holds the rate of every round of a scenario run more than
	// once (Config.Rounds); the result is the round of median rate.
	Rounds []float64 `json:",omitempty"`
	// CPUPerRecord holds every round's CPU per record, seconds, of a
	// scenario run more than once: the CPU targets take their median
	// (cpuPerRecord), since on a shared machine a round's CPU varies
	// apart from its rate.
	CPUPerRecord []float64 `json:",omitempty"`
	// RoundP99 holds every round's P99 of a paced scenario run more than
	// once: its row is the round of median p99.
	RoundP99 []float64 `json:",omitempty"`
}

// RunChild runs the scenario of spec in this process and returns its
// measurement.
func RunChild(ctx context.Context, spec Spec, log *slog.Logger) (Result, error) {
	if path := os.Getenv("EXACTLY_BENCH_CPUPROFILE"); path != "" {
		f, err := os.Create(path + "." + spec.Kind + "." + strconv.Itoa(spec.Batch))
		if err != nil {
			return Result{}, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return Result{}, err
		}
		defer pprof.StopCPUProfile()
	}
	if spec.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, spec.Timeout)
		defer cancel()
	}
	pcfg, err := pgxpool.ParseConfig(spec.DatabaseURL)
	if err != nil {
		return Result{}, fmt.Errorf("parsing database URL: %w", err)
	}
	pcfg.MaxConns = int32(max(spec.Conns, 1))
	pcfg.MinConns = pcfg.MaxConns
	pcfg.ConnConfig.RuntimeParams["application_name"] = childAppName
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return Result{}, fmt.Errorf("connecting: %w", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return Result{}, fmt.Errorf("connecting: %w", err)
	}
	f := fixture(spec.Schema, spec.Events)
	switch spec.Kind {
	case kindLimit:
		return runLimit(ctx, spec, pool, f)
	case kindNaive:
		return runNaive(ctx, spec, pool, f, log)
	case kindExactly:
		h, err := creditHandler(spec.Form, f)
		if err != nil {
			return Result{}, err
		}
		return runExactly(ctx, spec, pool, f, h, log)
	case kindProtobuf:
		return runProtobuf(ctx, spec, pool, f, log)
	case kindHotRow:
		return runExactly(ctx, spec, pool, f, transferHandler(spec.Schema, spec.Form), log)
	case kindIOBound:
		return runIOBound(ctx, spec, pool, f, log)
	case kindHotLimit:
		return runHotLimit(ctx, spec, pool)
	case kindRelay:
		return runRelay(ctx, spec, pool, f, log)
	case kindScale:
		return runScale(ctx, spec, log)
	}
	return Result{}, fmt.Errorf("unknown scenario kind %q", spec.Kind)
}

// tables are one scenario's guard, outbox and credit service, in its own
// schema.
type tables struct {
	guard  *dedupe.Guard
	ob     *outbox.Outbox
	svc    *credit.Service
	events string
}

func fixture(schema, events string) tables {
	ob := outbox.New(outbox.WithTable(schema, "exactly_outbox"))
	return tables{
		guard:  dedupe.New(dedupe.WithTable(schema, "exactly_guard")),
		ob:     ob,
		svc:    credit.New(credit.WithLedgerTable(schema, "ledger"), credit.WithOutbox(ob), credit.WithEventsTopic(events)),
		events: events,
	}
}

func (t tables) migrate(ctx context.Context, pool *pgxpool.Pool) error {
	schema := pgx.Identifier{t.svc.Ledger()[0]}.Sanitize()
	if _, err := pool.Exec(ctx, `drop schema if exists `+schema+` cascade`); err != nil {
		return fmt.Errorf("dropping schema: %w", err)
	}
	// Forget the versions recorded for the dropped tables, so that
	// migrating them again is a fresh start, not a warning that a recorded
	// table went missing. Before the first migration the table is absent.
	if _, err := pool.Exec(ctx, `delete from `+pgx.Identifier{migrate.TableName}.Sanitize()+` where strpos(component, $1) > 0`, ":"+schema+"."); err != nil {
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42P01" {
			return fmt.Errorf("forgetting the schema versions of %s: %w", schema, err)
		}
	}
	for _, m := range []func(context.Context, *pgxpool.Pool) error{t.svc.Migrate, t.guard.Migrate, t.ob.Migrate} {
		if err := m(ctx, pool); err != nil {
			return err
		}
	}
	return nil
}

// clock records when the first record reached the consumer (its fetch was
// buffered by the client) and when the last was committed.
type clock struct {
	first atomic.Int64
	last  atomic.Int64
	count atomic.Int64
	lat   hist
	start time.Time
	want  int64
	done  chan struct{}
	once  sync.Once
}

func newClock(want int) *clock {
	return &clock{want: int64(want), done: make(chan struct{}), start: time.Now()}
}

// OnFetchRecordBuffered implements kgo.HookFetchRecordBuffered.
func (c *clock) OnFetchRecordBuffered(*kgo.Record) {
	if c.first.Load() == 0 {
		c.first.CompareAndSwap(0, time.Now().UnixNano())
	}
}

// latencyEvery is the sampling of the latency histogram: every
// latencyEvery-th committed record (by count) adds its latency. Reading the
// clock and filing the sample cost about 0.2 µs, which the per-record hook
// would otherwise charge to the CPU of the consumers it measures (and not
// to the limits, which have no hook); a quarter of 10,000 or more records
// still gives the percentiles.
const latencyEvery = 4

// committed counts one record committed now that was produced at ts, and
// files the latency of every latencyEvery-th. The latency counts from ts,
// or from the scenario's start for a record that was produced before it (a
// backlog).
func (c *clock) committed(ts time.Time) {
	n := c.count.Add(1)
	if n%latencyEvery != 0 && n != c.want {
		return
	}
	now := time.Now()
	if n%latencyEvery == 0 {
		from := ts
		if from.Before(c.start) {
			from = c.start
		}
		c.lat.add(now.Sub(from))
	}
	if n == c.want {
		c.last.Store(now.UnixNano())
		c.once.Do(func() { close(c.done) })
	}
}

func (c *clock) result(n int) Result {
	el := time.Duration(c.last.Load() - c.first.Load())
	return Result{Records: n, Seconds: el.Seconds(), Rate: float64(n) / el.Seconds(), P50: c.lat.quantile(0.5), P99: c.lat.quantile(0.99)}
}

// partial is the result of the records committed so far, for a scenario
// stopped before its end.
func (c *clock) partial() Result {
	n := int(c.count.Load())
	el := time.Since(time.Unix(0, c.first.Load()))
	return Result{Records: n, Seconds: el.Seconds(), Rate: float64(n) / el.Seconds(), P50: c.lat.quantile(0.5), P99: c.lat.quantile(0.99)}
}

func (c *clock) wait(ctx context.Context) error {
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%d of %d records committed: %w", c.count.Load(), c.want, ctx.Err())
	}
}

// runNaive runs the hand-written consumer (franz-go's goroutine per
// partition, one transaction per record, each record marked after its
// commit for kgo.AutoCommitMarks unless spec.SliceCommit) with the business
// statements of the effect: ledger row and outbox row, after the guard
// row's claim when spec.Guard is set. With PaceRate it produces the records
// itself, at that rate, while consuming.
func runNaive(ctx context.Context, spec Spec, pool *pgxpool.Pool, f tables, log *slog.Logger) (Result, error) {
	b := newBusiness(f)
	clk := newClock(spec.Records)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	g, gctx := errgroup.WithContext(runCtx)
	if spec.PaceRate > 0 {
		g.Go(func() error { return producePaced(gctx, spec) })
	}
	g.Go(func() error {
		return naive.Run(gctx, naive.Config{
			Brokers: spec.Brokers, Group: spec.Group, Topics: []string{spec.Topic}, Pool: pool, Logger: log,
			KafkaOptions: []kgo.Opt{kgo.WithHooks(clk)},
			Marks:        !spec.SliceCommit,
			Apply: func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
				var c credit.Command
				if err := json.Unmarshal(rec.Value, &c); err != nil {
					return fmt.Errorf("decoding the command at offset %d: %w", rec.Offset, err)
				}
				return b.applyOne(ctx, tx, c, spec.Guard)
			},
			OnRecord: func(rec *kgo.Record) { clk.committed(rec.Timestamp) },
		})
	})
	err := clk.wait(gctx)
	stop()
	if gerr := g.Wait(); gerr != nil && !errors.Is(gerr, context.Canceled) && err == nil {
		err = gerr
	}
	if err != nil {
		return Result{}, err
	}
	return clk.result(spec.Records), nil
}

// creditHandler returns the credit handler of the given form, or an error
// naming a form this build does not have.
func creditHandler(form string, f tables) (handler.Any, error) {
	if !formAvailable(form) {
		return nil, fmt.Errorf("the %s handler form is not available in this build", form)
	}
	switch form {
	case formPipelined:
		return pipelinedCredit(f), nil
	case formSetBased:
		return setCredit(f), nil
	}
	return f.svc.Handler(), nil
}

// runExactly runs one exactly consumer (batches of spec.Batch) with h until
// every record has an outcome. With PaceRate it produces the records
// itself, at that rate, while consuming.
func runExactly(ctx context.Context, spec Spec, pool *pgxpool.Pool, f tables, h handler.Any, log *slog.Logger) (Result, error) {
	// The consumer's defaults, as overridden by EXACTLY_* variables (to
	// measure other settings); brokers, group, topics and batch size are
	// the scenario's.
	cfg, err := consumer.ConfigFromEnv(ctx)
	if err != nil {
		return Result{}, err
	}
	cfg.Brokers = spec.Brokers
	cfg.Group = spec.Group
	cfg.Topics = []string{spec.Topic}
	cfg.BatchMaxRecords = spec.Batch
	clk := newClock(spec.Records)
	mem, err := startMemTrace(spec.Group, clk.count.Load)
	if err != nil {
		return Result{}, err
	}
	defer mem.close()
	hooks := []kgo.Hook{clk}
	if mem != nil {
		hooks = append(hooks, mem)
	}
	var applied, dups atomic.Int64
	c, err := consumer.New(cfg, pool, consumer.Handle(h), consumer.WithGuard(f.guard),
		consumer.WithDeadLetters(outbox.DeadLetters(f.ob, cfg.DeadLetterSuffix)), consumer.WithLogger(log),
		consumer.WithKafkaOptions(kgo.WithHooks(hooks...)),
		consumer.WithHooks(consumer.Hooks{OnOutcome: func(_ context.Context, d consumer.OutcomeData) {
			rec, outcome := d.Record, d.Outcome
			switch outcome {
			case "applied":
				applied.Add(1)
			case "duplicate":
				dups.Add(1)
			}
			clk.committed(rec.Timestamp)
		}}))
	if err != nil {
		return Result{}, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	g, gctx := errgroup.WithContext(runCtx)
	g.Go(func() error { return c.Run(gctx) })
	if spec.PaceRate > 0 {
		g.Go(func() error { return producePaced(gctx, spec) })
	}
	err = clk.wait(gctx)
	stop()
	if gerr := g.Wait(); gerr != nil && !errors.Is(gerr, context.Canceled) && err == nil {
		err = gerr
	}
	if err != nil && spec.Partial && ctx.Err() != nil && clk.count.Load() > 0 {
		res := clk.partial()
		res.Applied, res.Duplicate = applied.Load(), dups.Load()
		res.Note = fmt.Sprintf("stopped after %s: %d of %d records committed", spec.Timeout, res.Records, spec.Records)
		return res, nil
	}
	if err != nil {
		return Result{}, err
	}
	res := clk.result(spec.Records)
	res.Applied, res.Duplicate = applied.Load(), dups.Load()
	return res, nil
}

// producePaced produces spec.Records commands to spec.Topic at
// spec.PaceRate records/s, each one sent as soon as its time comes.
func producePaced(ctx context.Context, spec Spec) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(spec.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(0))
	if err != nil {
		return err
	}
	defer cl.Close()
	cmds := workload.Commands(spec.Records, spec.Accounts)
	start := time.Now()
	var perr atomic.Value
	for i, c := range cmds {
		if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(spec.PaceRate))); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
		}
		v, _ := json.Marshal(c)
		cl.Produce(ctx, &kgo.Record{Topic: spec.Topic, Partition: int32(i % spec.Partitions), Key: []byte(c.OrderID), Value: v},
			func(_ *kgo.Record, err error) {
				if err != nil && ctx.Err() == nil {
					perr.Store(err)
				}
			})
	}
	if err := cl.Flush(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	if err, ok := perr.Load().(error); ok {
		return fmt.Errorf("producing paced records: %w", err)
	}
	return nil
}

// runRelay runs one relay on spec.Schema's outbox: first it drains the
// backlog the exactly run left (publish throughput), then rows are added,
// one per transaction, at spec.PaceRate for spec.PaceFor while the relay
// keeps up (commit-to-ack latency).
func runRelay(ctx context.Context, spec Spec, pool *pgxpool.Pool, f tables, log *slog.Logger) (Result, error) {
	backlog, _, err := f.ob.Backlog(ctx, pool)
	if err != nil {
		return Result{}, err
	}
	var published atomic.Int64
	var pacing atomic.Bool
	var ack hist
	drained := make(chan time.Time, 1)
	r, err := outbox.NewRelay(pool, spec.Brokers, outbox.RelayConfig{Outbox: f.ob, Logger: log,
		Hooks: outbox.RelayHooks{OnPublished: func(n int, lat []time.Duration) {
			if pacing.Load() {
				for _, d := range lat {
					ack.add(d)
				}
			}
			if total := published.Add(int64(n)); total >= backlog && total-int64(n) < backlog {
				drained <- time.Now()
			}
		}}})
	if err != nil {
		return Result{}, err
	}
	defer r.Close()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- r.Run(runCtx) }()
	if backlog == 0 {
		drained <- start
	}
	var end time.Time
	select {
	case end = <-drained:
	case <-ctx.Done():
		return Result{}, fmt.Errorf("relay published %d of %d rows: %w", published.Load(), backlog, ctx.Err())
	}
	res := Result{Records: int(backlog), Seconds: end.Sub(start).Seconds(), P50: -1, P99: -1}
	res.Rate = float64(backlog) / res.Seconds

	// Paced phase.
	pacing.Store(true)
	n := int(spec.PaceFor.Seconds() * float64(spec.PaceRate))
	pstart := time.Now()
	for i := range n {
		if d := time.Until(pstart.Add(time.Duration(i) * time.Second / time.Duration(spec.PaceRate))); d > 0 {
			time.Sleep(d)
		}
		ev := credit.Credited{OrderID: fmt.Sprintf("paced-%d", i), Account: int64(i % spec.Accounts), Amount: 1}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return f.ob.AddJSON(ctx, tx, spec.Events, []byte(fmt.Sprint(ev.Account)), ev)
		})
		if err != nil {
			return Result{}, fmt.Errorf("adding paced event: %w", err)
		}
		f.ob.Wake(pool) // a direct Add's writer wakes the relay after its commit (see outbox.Outbox.Wake)
	}
	want := backlog + int64(n)
	if err := workload.Poll(ctx, func() (bool, error) { return published.Load() >= want, nil }); err != nil {
		return Result{}, fmt.Errorf("relay published %d of %d rows: %w", published.Load(), want, err)
	}
	stop()
	if err := <-errc; err != nil {
		return Result{}, err
	}
	res.PacedEvents = n
	res.AckP50, res.AckP99 = ack.quantile(0.5), ack.quantile(0.99)
	return res, nil
}
