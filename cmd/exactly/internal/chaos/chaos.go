// Package chaos is `exactly chaos`: the example services as real OS
// processes (several members of the credit group, each running a relay
// beside its consumer, and of the notify group), a private PostgreSQL and an
// embedded three-node kfake broker with persistence, all broken on a
// schedule derived from a seed while credit commands, many of them sent
// several times, flow through. At the end a ledger checker compares what
// was sent with what took effect: every credit once, every event published,
// every notification once, no committed offset ahead of the database.
package chaos

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/exactly-go/exactly/cmd/exactly/internal/workload"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/credit"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/notify"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testenv/broker"
	"github.com/exactly-go/exactly/internal/testenv/pgserver"
	"github.com/exactly-go/exactly/outbox"
)

// Groups and topics of a run (the broker is private to the run).
const (
	CreditGroup = "chaos-credit"
	NotifyGroup = "chaos-notify"
	// DeadLetterSuffix is the services' default dead-letter suffix.
	DeadLetterSuffix = ".dlq"
	// AuditTopic receives the audit events of accounts 0 and 1 (and the
	// oversized ones); produce to it is denied for a while.
	AuditTopic = "credit-audit"
	// EnvSwallowOrders and EnvAuditTopic configure the faults of the
	// chaos credit service (cmd/exactly/internal/chaos/creditsvc, which reads
	// the same names).
	EnvSwallowOrders = "CHAOS_SWALLOW_ORDERS"
	EnvAuditTopic    = "CHAOS_AUDIT_TOPIC"
)

// ChaosSeenTableSQL creates the table the swallowing handler inserts into
// twice (the chaos credit service runs the same statement at start).
const ChaosSeenTableSQL = `create table if not exists chaos_seen (order_id text primary key)`

// Fault kinds, in the order they are reported.
const (
	FaultKill          = "kill"
	FaultStop          = "stop"
	FaultPGRestart     = "pg-restart"
	FaultBrokerRestart = "broker-restart"
	FaultProduce       = "kafka-produce"
	FaultFetch         = "kafka-fetch"
	FaultCommit        = "kafka-commit"
	FaultCoordinator   = "coordinator-move"
	FaultLeader        = "leader-move"
	// The user-code faults: handlers that swallow a unique violation,
	// oversized records, a topic whose produce is denied.
	FaultSwallow   = "swallowing-handler"
	FaultOversized = "oversized-record"
	FaultDenied    = "produce-denied"
)

// FaultKinds lists the fault kinds in report order.
var FaultKinds = []string{FaultKill, FaultStop, FaultPGRestart, FaultBrokerRestart,
	FaultProduce, FaultFetch, FaultCommit, FaultCoordinator, FaultLeader,
	FaultSwallow, FaultOversized, FaultDenied}

// Plan is how many faults of each family a run injects, at seeded times
// within the fault window. KafkaFaults are split by the seed between
// produce, fetch and offset-commit errors, coordinator moves and partition
// leader moves.
type Plan struct {
	Kills, Stops, PGRestarts, BrokerRestarts, KafkaFaults int
}

// DefaultPlan scales the faults with the fault window d: a kill every 10s,
// a pause, a database restart and a broker restart every 30s, a broker
// fault every 6s (at least one of each).
func DefaultPlan(d time.Duration) Plan {
	s := d.Seconds()
	return Plan{
		Kills:          max(1, int(s/10)),
		Stops:          max(1, int(s/30)),
		PGRestarts:     max(1, int(s/30)),
		BrokerRestarts: max(1, int(s/30)),
		KafkaFaults:    max(1, int(s/6)),
	}
}

// Config sizes a run. Zero fields take the defaults noted.
type Config struct {
	// Seed drives the workload and the fault schedule (default 1).
	Seed uint64
	// Keys is the number of distinct credit commands (default 5000).
	Keys int
	// Copies is how often each command is sent (default 3): some copies to
	// the command's partition, some to others, some much later.
	Copies int
	// Consumers is the number of processes of each service (default 3,
	// at least 2).
	Consumers int
	// Partitions of the commands and events topics (default 6).
	Partitions int
	// Duration is the fault window; producing ends at 80% of it (default
	// 60s).
	Duration time.Duration
	// Plan is the fault counts; nil means DefaultPlan(Duration).
	Plan *Plan
	// SwallowKeys is how many commands (seeded) meet a handler that
	// swallows a unique violation and returns nil with its transaction
	// aborted: each must end dead-lettered (default Keys/200, at least 1;
	// negative: none).
	SwallowKeys int
	// Oversized is how many oversized records of each kind are sent
	// (default 2; negative: none): undecodable records of
	// UndecodableBytes (near the broker's 1,048,588-byte limit), which
	// must end as truncated dead letters, and valid commands carrying a
	// PadBytes pad whose handler emits an event over the outbox's limit,
	// which must end dead-lettered.
	Oversized int
	// NoDenial turns off the produce denial of AuditTopic (from a seeded
	// time in 10-30% of the window until the faults end), whose keys the
	// relay must park while other topics flow, and publish once after
	// the harness retries them.
	NoDenial bool
	// GenerationSpan is how long the guard's current generation takes
	// claims before it is sealed (default Duration/4, so a run rotates
	// at least three times; negative: no rotation). The harness runs a
	// pruner loop of its own with it every second (as `exactly prune
	// -generation-span` from a scheduler would) and the services get it
	// as EXACTLY_GUARD_GENERATION_SPAN, so their pruners, which prune at
	// every start, rotate too. The retention stays the default (14 days,
	// past the 7-day redelivery horizon): no generation is dropped during
	// a run, so every duplicate meets the generation holding its key.
	GenerationSpan time.Duration
	// SessionTimeout of the services' group members (default 6s, kfake's
	// minimum); a paused process stays stopped longer than this.
	SessionTimeout time.Duration
	// DrainTimeout bounds the wait, after the faults, for every delivery
	// to be processed and every event published and consumed (default 2m).
	DrainTimeout time.Duration
	// Dir holds the run (binaries, data, process logs); empty means a
	// temporary directory, removed after a run without violations.
	Dir string
	// BinDir holds the service binaries; empty means the run directory.
	// Binaries already there are reused (tests share them between runs).
	BinDir string
	// Logger receives the harness's own diagnostics; nil discards them.
	Logger *slog.Logger
	// BeforeCheck, when set, runs after the services stopped and before
	// the checker: tests of the checker corrupt the database here.
	BeforeCheck func(ctx context.Context, pool *pgxpool.Pool) error
	// BeforeCheckKafka, when set, runs after BeforeCheck with the
	// broker's addresses: tests of the checker corrupt the topics here.
	BeforeCheckKafka func(ctx context.Context, brokers []string) error
}

func (c *Config) defaults() error {
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Keys == 0 {
		c.Keys = 5000
	}
	if c.Copies == 0 {
		c.Copies = 3
	}
	if c.Consumers == 0 {
		c.Consumers = 3
	}
	if c.Partitions == 0 {
		c.Partitions = 6
	}
	if c.SwallowKeys == 0 {
		c.SwallowKeys = max(1, c.Keys/200)
	}
	if c.Oversized == 0 {
		c.Oversized = 2
	}
	if c.Duration == 0 {
		c.Duration = 60 * time.Second
	}
	if c.GenerationSpan == 0 {
		c.GenerationSpan = c.Duration / 4
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = 6 * time.Second
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 2 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.Keys < 1:
		return fmt.Errorf("chaos: keys must be >= 1, got %d", c.Keys)
	case c.Copies < 1:
		return fmt.Errorf("chaos: copies must be >= 1, got %d", c.Copies)
	case c.Consumers < 2:
		return fmt.Errorf("chaos: consumers must be >= 2, got %d", c.Consumers)
	case c.Partitions < 2:
		return fmt.Errorf("chaos: partitions must be >= 2, got %d", c.Partitions)
	case c.Duration < 5*time.Second:
		return fmt.Errorf("chaos: duration must be >= 5s, got %s", c.Duration)
	case max(0, c.SwallowKeys)+max(0, c.Oversized) >= c.Keys:
		return fmt.Errorf("chaos: swallow keys (%d) and oversized commands (%d) must leave valid keys of the %d", c.SwallowKeys, c.Oversized, c.Keys)
	}
	if c.Plan == nil {
		p := DefaultPlan(c.Duration)
		c.Plan = &p
	}
	return nil
}

// Result is what a run did and what the checker found.
type Result struct {
	Seed uint64
	// Keys is the number of distinct commands; Sent the records the
	// workload sent (Keys x Copies); Delivered the records in the commands
	// topic at the end (more than Sent when the producer resent a record
	// whose acknowledgement was lost).
	Keys            int
	Sent, Delivered int64
	// Effects is the number of ledger rows; Lost and Doubled the keys
	// with no row and with more than one.
	Effects       int64
	Lost, Doubled []string
	// Credit and Notify are the outcome counters of the two scopes;
	// Redelivered is Credit's total minus Delivered (records processed
	// again after a crash or a lost offset commit).
	Credit, Notify Counts
	Redelivered    int64
	// Events is the records in the events topic; EventIDs its distinct
	// message ids; Notifications the notification rows.
	Events, EventIDs, Notifications int64
	// Faults counts the faults injected by kind; KafkaFaultHits the
	// requests the broker faults answered; UnexpectedExits the service
	// exits no fault caused (each was restarted).
	Faults          map[string]int
	KafkaFaultHits  int
	UnexpectedExits int
	// OffsetSamples is how many times the committed offsets of both
	// groups were checked against the database during the run.
	OffsetSamples int
	// Swallowed, Padded and Undecodable are the records of the user-code
	// faults (commands whose handler swallows an error, oversized valid
	// commands, oversized undecodable records); DeadLetters the records
	// of the commands' dead-letter topic, Truncated those cut to fit.
	Swallowed, Padded, Undecodable int
	DeadLetters, Truncated         int64
	// Audit is the records of AuditTopic; AuditIDs its distinct message
	// ids. Parked lists the outbox rows the relay parked (topic, key,
	// reason), Retried how many rows the harness released after the
	// denial ended.
	Audit, AuditIDs int64
	Parked          []string
	Retried         int
	// GenerationSpan is the run's generation span (negative: none).
	// Rotations is how many times the guard's current generation was
	// sealed (rows of the generations table with an end); Generations
	// lists each generation as name=rows. CrossGeneration lists the keys
	// applied in more than one generation (applied again across a
	// generation boundary), of both scopes; SeveralGenerations counts the
	// keys with rows in more than one generation (dead-lettered keys that
	// a copy took over after their row was sealed).
	GenerationSpan     time.Duration
	Rotations          int
	Generations        []string
	CrossGeneration    []string
	SeveralGenerations int
	Drained            time.Duration
	Elapsed            time.Duration
	// Violations lists every broken invariant, with the keys involved.
	Violations []string
	// Dir is the run's directory, kept when there were violations.
	Dir string
}

// Counts are outcome counters of one scope.
type Counts struct{ Applied, Duplicate, DeadLettered int64 }

// Total is the deliveries counted.
func (c Counts) Total() int64 { return c.Applied + c.Duplicate + c.DeadLettered }

// OK reports whether the run found no violation.
func (r *Result) OK() bool { return len(r.Violations) == 0 }

// Summary is the one line a run ends with.
func (r *Result) Summary() string {
	return fmt.Sprintf("chaos: seed=%d keys=%d delivered=%d effects=%d lost=%d doubled=%d dead=%d parked=%d rotations=%d cross-generation=%d",
		r.Seed, r.Keys, r.Delivered, r.Effects, len(r.Lost), len(r.Doubled), r.Credit.DeadLettered+r.Notify.DeadLettered, len(r.Parked),
		r.Rotations, len(r.CrossGeneration))
}

// FaultLine lists the faults injected, by kind.
func (r *Result) FaultLine() string {
	var b strings.Builder
	b.WriteString("chaos: faults:")
	for _, k := range FaultKinds {
		fmt.Fprintf(&b, " %s=%d", k, r.Faults[k])
	}
	fmt.Fprintf(&b, " (broker requests faulted=%d) unexpected-exits=%d", r.KafkaFaultHits, r.UnexpectedExits)
	return b.String()
}

// harness is one run.
type harness struct {
	cfg   Config
	log   *slog.Logger
	w     io.Writer
	wmu   sync.Mutex
	start time.Time
	dir   string

	pg    *pgserver.Server
	dbURL string
	pool  *pgxpool.Pool

	bmu       sync.Mutex
	b         *broker.Broker
	brokerDir string
	ports     []int
	addrs     []string
	handles   []*kfake.FaultHandle
	hits      int
	// denied: produce to AuditTopic is denied (re-installed after a
	// broker restart, lifted by heal).
	denied bool

	// parked lists the rows the relay parked, as the drain found them;
	// retried counts the rows it released.
	parked  []string
	retried int

	procs    []*proc
	stopping atomic.Bool
	exits    atomic.Int64

	fmu        sync.Mutex
	faults     map[string]int
	violations []string
}

// Run runs the harness and the checker, printing progress and the result to
// w. It returns an error when the environment cannot be set up or ctx ends;
// violations are in the Result (see Result.OK), not an error.
func Run(ctx context.Context, cfg Config, w io.Writer) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	h := &harness{cfg: cfg, log: cfg.Logger, w: w, faults: map[string]int{}, start: time.Now()}
	p := cfg.Plan
	h.printf("chaos: seed=%d keys=%d copies=%d consumers=%d partitions=%d duration=%s plan: kills=%d stops=%d pg-restarts=%d broker-restarts=%d kafka-faults=%d generation-span=%s",
		cfg.Seed, cfg.Keys, cfg.Copies, cfg.Consumers, cfg.Partitions, cfg.Duration,
		p.Kills, p.Stops, p.PGRestarts, p.BrokerRestarts, p.KafkaFaults, spanText(cfg.GenerationSpan))
	res, err := h.run(ctx)
	if res != nil {
		res.Elapsed = time.Since(h.start)
	}
	return res, err
}

func (h *harness) printf(format string, args ...any) {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	fmt.Fprintf(h.w, format+"\n", args...)
}

// event prints one timed line of the run.
func (h *harness) event(format string, args ...any) {
	h.printf("chaos: t=%5.1fs "+format, append([]any{time.Since(h.start).Seconds()}, args...)...)
}

func (h *harness) violation(format string, args ...any) {
	h.fmu.Lock()
	defer h.fmu.Unlock()
	h.violations = append(h.violations, fmt.Sprintf(format, args...))
}

func (h *harness) count(kind string) {
	h.fmu.Lock()
	defer h.fmu.Unlock()
	h.faults[kind]++
}

func (h *harness) run(ctx context.Context) (res *Result, err error) {
	cfg := h.cfg
	if cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "exactly-chaos-")
		if err != nil {
			return nil, fmt.Errorf("chaos: creating the run directory: %w", err)
		}
		h.dir = dir
		defer func() {
			if err == nil && res != nil && res.OK() && res.UnexpectedExits == 0 {
				_ = os.RemoveAll(dir)
			} else if res != nil {
				res.Dir = dir
			}
		}()
	} else {
		h.dir = cfg.Dir
		if err := os.MkdirAll(h.dir, 0o755); err != nil {
			return nil, fmt.Errorf("chaos: creating %s: %w", h.dir, err)
		}
	}
	logDir := filepath.Join(h.dir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: creating %s: %w", logDir, err)
	}

	buildStart := time.Now()
	binDir := cfg.BinDir
	if binDir == "" {
		binDir = h.dir
	}
	bins, err := buildBinaries(ctx, binDir)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	h.printf("chaos: built the chaos credit service and examples/notify in %s; run directory %s", time.Since(buildStart).Round(100*time.Millisecond), h.dir)

	// PostgreSQL, private to the run so it can be crashed.
	h.pg, err = pgserver.Start(ctx, pgserver.Options{Dir: filepath.Join(h.dir, "pg"), Logger: h.log})
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	defer func() {
		if err := h.pg.Stop(); err != nil {
			h.log.Warn("chaos: stopping PostgreSQL", "error", err)
		}
	}()
	h.dbURL, err = h.pg.CreateDatabase(ctx, "chaos")
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	pcfg, err := pgxpool.ParseConfig(h.dbURL)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	pcfg.MaxConns = 8
	h.pool, err = pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("chaos: connecting to the database: %w", err)
	}
	defer h.pool.Close()
	// The services migrate at start too; doing it first lets the checker
	// query the tables from the start.
	if err := credit.New().Migrate(ctx, h.pool); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	if err := notify.New("", "").Migrate(ctx, h.pool); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	// The chaos credit service's table too: its processes create it
	// at start, and concurrent creations of a table can fail.
	if _, err := h.pool.Exec(ctx, ChaosSeenTableSQL); err != nil {
		return nil, fmt.Errorf("chaos: creating chaos_seen: %w", err)
	}

	// The broker: three kfake nodes persisting to disk, in this process
	// so that faults can be injected and it can be restarted.
	h.brokerDir = filepath.Join(h.dir, "kafka")
	if err := h.startBroker(ctx); err != nil {
		return nil, err
	}
	defer func() {
		h.bmu.Lock()
		h.b.Close()
		h.bmu.Unlock()
	}()
	adm := kadm.NewClient(workload.Client(h.addrs))
	defer adm.Close()

	// The services.
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	wl := newWorkload(rng, cfg)
	sched := schedule(rng, cfg)
	h.faults[FaultSwallow] = len(wl.swallow)
	h.faults[FaultOversized] = len(wl.padded) + wl.undecodable
	for _, svc := range []struct{ name, group string }{{"credit", CreditGroup}, {"notify", NotifyGroup}} {
		for i := range cfg.Consumers {
			name := fmt.Sprintf("%s-%d", svc.name, i)
			vars := map[string]string{
				"EXACTLY_KAFKA_BROKERS":     strings.Join(h.addrs, ","),
				"EXACTLY_GROUP":             svc.group,
				"EXACTLY_CLIENT_ID":         name,
				"DATABASE_URL":              h.dbURL,
				"EXACTLY_COMMIT_INTERVAL":   "200ms",
				"EXACTLY_SESSION_TIMEOUT":   cfg.SessionTimeout.String(),
				"EXACTLY_REBALANCE_TIMEOUT": (2 * cfg.SessionTimeout).String(),
				"EXACTLY_RETRY_BACKOFF_MAX": "2s",
			}
			if cfg.GenerationSpan > 0 {
				vars["EXACTLY_GUARD_GENERATION_SPAN"] = cfg.GenerationSpan.String()
			}
			if svc.name == "credit" {
				vars[EnvSwallowOrders] = strings.Join(wl.swallowed(), ",")
				vars[EnvAuditTopic] = AuditTopic
			}
			env := childEnv(vars)
			p, err := newProc(name, bins[svc.name], env, logDir, h.log, h.unexpectedExit)
			if err != nil {
				return nil, fmt.Errorf("chaos: %w", err)
			}
			h.procs = append(h.procs, p)
		}
	}
	defer func() {
		h.stopping.Store(true)
		h.terminateAll()
		for _, p := range h.procs {
			_ = p.close()
		}
	}()
	for _, p := range h.procs {
		if err := p.start(); err != nil {
			return nil, fmt.Errorf("chaos: %w", err)
		}
	}
	// Wait for both groups to be formed, so the schedule starts with every
	// member at work.
	for _, g := range []string{CreditGroup, NotifyGroup} {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		_, err := h.b.Cluster().WaitGroupStable(wctx, g, cfg.Consumers)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("chaos: waiting for group %s to have %d members (process logs in %s): %w", g, cfg.Consumers, logDir, err)
		}
	}
	// The workload, the offset sampler and the faults run together; the
	// schedule's times count from here.
	h.start = time.Now()
	h.event("%d credit and %d notify processes up; brokers %s; database %s", cfg.Consumers, cfg.Consumers, strings.Join(h.addrs, ","), h.dbURL)

	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	cr, err := newLogReader(h.addrs, credit.CommandsTopic, cfg.Partitions, commandKey)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	defer cr.close()
	er, err := newLogReader(h.addrs, credit.EventsTopic, cfg.Partitions, eventKey)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	defer er.close()
	samp := &sampler{h: h, adm: adm, checks: []*offsetCheck{
		{group: CreditGroup, scope: "credit", r: cr, checked: make([]int64, cfg.Partitions)},
		{group: NotifyGroup, scope: "notify", r: er, checked: make([]int64, cfg.Partitions)},
	}}
	sampDone := make(chan struct{})
	go func() {
		defer close(sampDone)
		samp.loop(runCtx)
	}()

	// The pruner loop that seals generations during the faults.
	pruneDone := make(chan struct{})
	if cfg.GenerationSpan > 0 {
		pr, err := dedupe.New().NewPruner(h.pool, dedupe.PrunerConfig{
			GenerationSpan: cfg.GenerationSpan, Interval: min(time.Second, cfg.GenerationSpan), Logger: h.log,
		})
		if err != nil {
			return nil, fmt.Errorf("chaos: %w", err)
		}
		go func() {
			defer close(pruneDone)
			_ = pr.Run(runCtx) // logs its failures and retries (a database restart)
		}()
	} else {
		close(pruneDone)
	}

	prodErr := make(chan error, 1)
	go func() { prodErr <- wl.produce(runCtx, h) }()

	h.injectFaults(runCtx, sched)
	if err := <-prodErr; err != nil {
		return nil, fmt.Errorf("chaos: producing: %w", err)
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	// Heal: remove broker faults, wake paused processes, start dead ones.
	h.heal()
	h.event("faults over; draining")
	drainStart := time.Now()
	drainErr := h.drain(ctx, adm)
	drained := time.Since(drainStart)
	if drainErr != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		h.violation("not drained within %s: %v", cfg.DrainTimeout, drainErr)
	} else {
		h.event("drained in %s", drained.Round(100*time.Millisecond))
	}
	cancelRun()
	<-sampDone
	<-pruneDone

	// Stop the services cleanly, then check.
	h.stopping.Store(true)
	h.terminateAll()
	res = &Result{Seed: cfg.Seed, Keys: cfg.Keys, Sent: int64(len(wl.recs)), Drained: drained,
		UnexpectedExits: int(h.exits.Load()), OffsetSamples: samp.samples,
		Swallowed: len(wl.swallow), Padded: len(wl.padded), Undecodable: wl.undecodable,
		Parked: h.parked, Retried: h.retried, GenerationSpan: cfg.GenerationSpan}
	if cfg.BeforeCheck != nil {
		if err := cfg.BeforeCheck(ctx, h.pool); err != nil {
			return nil, fmt.Errorf("chaos: BeforeCheck: %w", err)
		}
	}
	if cfg.BeforeCheckKafka != nil {
		if err := cfg.BeforeCheckKafka(ctx, h.addrs); err != nil {
			return nil, fmt.Errorf("chaos: BeforeCheckKafka: %w", err)
		}
	}
	if err := h.check(ctx, adm, wl, samp, res); err != nil {
		return nil, err
	}
	h.fmu.Lock()
	res.Faults = maps(h.faults)
	res.Violations = append(res.Violations, h.violations...)
	h.fmu.Unlock()
	h.bmu.Lock()
	res.KafkaFaultHits = h.hits + hitsOf(h.handles)
	h.bmu.Unlock()
	return res, nil
}

// spanText is a generation span as printed: "none" when negative.
func spanText(d time.Duration) string {
	if d < 0 {
		return "none"
	}
	return d.String()
}

func maps(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func hitsOf(hs []*kfake.FaultHandle) int {
	n := 0
	for _, fh := range hs {
		n += fh.Hits()
	}
	return n
}

// startBroker starts the broker on h.ports (fresh ports the first time),
// reloading h.brokerDir. Ports just freed can take a moment to be
// reusable, so it retries for a few seconds.
func (h *harness) startBroker(ctx context.Context) error {
	opts := broker.Options{
		DataDir:    h.brokerDir,
		Partitions: int32(h.cfg.Partitions),
		Topics: []string{credit.CommandsTopic, credit.EventsTopic, AuditTopic,
			credit.CommandsTopic + DeadLetterSuffix, credit.EventsTopic + DeadLetterSuffix},
		Logger: h.log,
		Extra:  []kfake.Opt{kfake.NumBrokers(3)},
	}
	if h.ports != nil {
		opts.Extra = append(opts.Extra, kfake.Ports(h.ports...))
	}
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		var b *broker.Broker
		b, err = broker.Start(ctx, opts)
		if err == nil {
			h.b = b
			if h.ports == nil {
				h.addrs = b.Addrs()
				for _, a := range h.addrs {
					_, port, _ := net.SplitHostPort(a)
					n, _ := strconv.Atoi(port)
					h.ports = append(h.ports, n)
				}
			}
			return nil
		}
		if h.ports == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("chaos: starting the broker: %w", err)
}

// unexpectedExit restarts a service that exited on its own.
func (h *harness) unexpectedExit(p *proc, err error) {
	if h.stopping.Load() {
		return
	}
	h.exits.Add(1)
	h.event("%s exited on its own (%s); restarting it (see %s)", p.name, exitDescription(err), filepath.Join(h.dir, "logs", p.name+".log"))
	go func() {
		time.Sleep(time.Second)
		if h.stopping.Load() {
			return
		}
		if err := p.start(); err != nil {
			h.log.Error("chaos: restarting", "proc", p.name, "error", err)
		}
	}()
}

// heal ends every fault still in effect.
func (h *harness) heal() {
	h.bmu.Lock()
	for _, fh := range h.handles {
		fh.Remove()
	}
	if h.denied {
		h.denied = false
		h.event("produce to %s allowed again (its parked rows stay parked until retried)", AuditTopic)
	}
	h.bmu.Unlock()
	for _, p := range h.procs {
		p.cont()
		if !p.running() {
			if err := p.start(); err != nil {
				h.log.Error("chaos: restarting", "proc", p.name, "error", err)
			}
		}
	}
}

// terminateAll stops every service cleanly (in parallel).
func (h *harness) terminateAll() {
	var wg sync.WaitGroup
	for _, p := range h.procs {
		wg.Go(func() { p.terminate(20 * time.Second) })
	}
	wg.Wait()
}

// drain waits until every command was processed and committed by the credit
// group, the outbox is empty, and every event was processed and committed
// by the notify group, twice in a row.
func (h *harness) drain(ctx context.Context, adm *kadm.Client) error {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.DrainTimeout)
	defer cancel()
	var state string
	streak := 0
	lastPrint := time.Now()
	err := workload.Poll(ctx, func() (bool, error) {
		ok, s, err := h.drainedOnce(ctx, adm)
		state = s
		if time.Since(lastPrint) >= 10*time.Second {
			lastPrint = time.Now()
			h.event("draining: %s", s)
		}
		if err != nil || !ok {
			streak = 0
			return false, err
		}
		streak++
		return streak >= 2, nil
	})
	if err != nil {
		return fmt.Errorf("%w; last state: %s", err, state)
	}
	return nil
}

func (h *harness) drainedOnce(ctx context.Context, adm *kadm.Client) (bool, string, error) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lagC, err := groupLag(qctx, adm, CreditGroup, credit.CommandsTopic)
	if err != nil {
		return false, "credit lag unknown", err
	}
	var backlog, parked int64
	// The backlog is the rows the relay can publish: not parked, nor
	// held behind a parked row of their (topic, key).
	if err := h.pool.QueryRow(qctx, `select count(*) filter (where o.parked_at is null and not exists (
			select 1 from exactly_outbox p where p.parked_at is not null and p.topic = o.topic and p.key is not distinct from o.key)),
		count(*) filter (where o.parked_at is not null)
		from exactly_outbox o`).Scan(&backlog, &parked); err != nil {
		return false, fmt.Sprintf("credit lag %d, outbox unknown", lagC), err
	}
	lagN, err := groupLag(qctx, adm, NotifyGroup, credit.EventsTopic)
	if err != nil {
		return false, fmt.Sprintf("credit lag %d, outbox %d, notify lag unknown", lagC, backlog), err
	}
	state := fmt.Sprintf("credit lag %d, outbox backlog %d (parked %d), notify lag %d", lagC, backlog, parked, lagN)
	if lagC == 0 && backlog == 0 && lagN == 0 && parked > 0 {
		// Everything else flowed past the parked rows: list them, then
		// release them as `exactly outbox retry -all` does (the denial
		// was lifted by heal).
		if err := h.retryParked(qctx); err != nil {
			return false, state, err
		}
		return false, state, nil
	}
	return lagC == 0 && backlog == 0 && parked == 0 && lagN == 0, state, nil
}

// retryParked records the parked rows (one line per parked row, with the
// rows held behind it) and releases every one of them.
func (h *harness) retryParked(ctx context.Context) error {
	ob := outbox.New()
	ps, err := ob.Parked(ctx, h.pool, outbox.ParkFilter{})
	if err != nil {
		return err
	}
	for _, p := range ps {
		h.parked = append(h.parked, fmt.Sprintf("%s/%s id=%d held=%d reason=%q", p.Topic, p.Key, p.ID, p.Held, p.Reason))
	}
	released, err := ob.Retry(ctx, h.pool, outbox.ParkFilter{})
	if err != nil {
		return err
	}
	h.retried += len(released)
	h.event("every other row published with %d rows parked (%d held behind them); released them (exactly outbox retry -all)", len(ps), sumHeld(ps))
	return nil
}

func sumHeld(ps []outbox.Parked) int64 {
	var n int64
	for _, p := range ps {
		n += p.Held
	}
	return n
}

// groupLag is the records of topic the group has not committed past; a
// partition without a commit counts whole.
func groupLag(ctx context.Context, adm *kadm.Client, group, topic string) (int64, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	if err := ends.Error(); err != nil {
		return 0, err
	}
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return 0, err
	}
	if err := offs.Error(); err != nil {
		return 0, err
	}
	var lag int64
	ends.Each(func(o kadm.ListedOffset) {
		at := int64(0)
		if c, ok := offs.Lookup(topic, o.Partition); ok && c.At > 0 {
			at = c.At
		}
		lag += max(0, o.Offset-at)
	})
	return lag, nil
}

// keysList formats up to 20 keys, sorted, and how many more.
func keysList(keys []string) string {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	if len(keys) <= 20 {
		return strings.Join(keys, " ")
	}
	return strings.Join(keys[:20], " ") + fmt.Sprintf(" … (%d more)", len(keys)-20)
}

// Report prints the result: the summary line, the fault counts, the
// counters, then every violation (or "ok").
func (r *Result) Report(w io.Writer) {
	fmt.Fprintln(w, r.Summary())
	fmt.Fprintln(w, r.FaultLine())
	fmt.Fprintf(w, "chaos: sent=%d delivered=%d credit: applied=%d duplicate=%d dead_lettered=%d redelivered=%d; events=%d (distinct message ids %d) notify: applied=%d duplicate=%d; notifications=%d; offset samples=%d; drained in %s, total %s\n",
		r.Sent, r.Delivered, r.Credit.Applied, r.Credit.Duplicate, r.Credit.DeadLettered, r.Redelivered,
		r.Events, r.EventIDs, r.Notify.Applied, r.Notify.Duplicate, r.Notifications, r.OffsetSamples,
		r.Drained.Round(100*time.Millisecond), r.Elapsed.Round(time.Second))
	fmt.Fprintf(w, "chaos: user-code faults: swallowing-handler keys=%d, oversized valid commands=%d, undecodable records=%d; dead letters=%d (truncated %d); %s: %d records (distinct message ids %d); parked rows=%d, released=%d\n",
		r.Swallowed, r.Padded, r.Undecodable, r.DeadLetters, r.Truncated, AuditTopic, r.Audit, r.AuditIDs, len(r.Parked), r.Retried)
	for _, p := range r.Parked {
		fmt.Fprintln(w, "  parked:", p)
	}
	fmt.Fprintf(w, "chaos: guard generations: rotations=%d (span %s), keys applied in more than one generation=%d, keys with rows in several (dead-lettered, taken over)=%d; generations (table=rows, oldest first): %s\n",
		r.Rotations, spanText(r.GenerationSpan), len(r.CrossGeneration), r.SeveralGenerations, strings.Join(r.Generations, " "))
	if r.OK() {
		fmt.Fprintln(w, "chaos: ok")
		return
	}
	fmt.Fprintf(w, "chaos: FAIL: %d violations (seed %d; run directory with process logs: %s)\n", len(r.Violations), r.Seed, r.Dir)
	for _, v := range r.Violations {
		fmt.Fprintln(w, "  violation:", v)
	}
}
