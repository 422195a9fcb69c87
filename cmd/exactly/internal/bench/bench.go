// Package bench is `exactly bench`: the throughput of exactly side by side
// with its limits, on the embedded broker and a private PostgreSQL with
// synchronous_commit=on. Each scenario runs in a child process (the bench
// binary re-executed with a hidden flag), so its peak RSS is its own.
package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/exactly-go/exactly/cmd/exactly/internal/devenv"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/credit"
	"github.com/exactly-go/exactly/consumer"
)

// defaultSmall is the size of the small topic, and by default the commands
// per produce call of both topics (produceChunked).
const defaultSmall = 10_000

// Config sizes a run.
type Config struct {
	// Records is the size of the main topic (default 100,000).
	Records int
	// Small is the size of the second topic exactly consumes with its
	// defaults, to compare peak RSS (default 10,000; negative skips).
	Small int
	// Chunk is how many commands each produce call of the two topics
	// sends (default Small, or 10,000 when Small is skipped), so their
	// record batches have the same size (produceChunked).
	Chunk int
	// Partitions of the topics (default 6, as the demo's).
	Partitions int
	// Conns is each process's connection pool size (default Partitions:
	// one transaction per partition at a time).
	Conns int
	// Batch is exactly's default BatchMaxRecords and the limit's
	// transaction size (default 100).
	Batch int
	// Accounts is how many accounts the commands credit; events are keyed
	// by account (default 10,000).
	Accounts int
	// Transfers is the size of the hot-row workload's topic (default
	// 10,000; negative skips the hot-row scenarios).
	Transfers int
	// Rounds is how many times the scenarios that feed a ratio target or
	// the tail target run, interleaved (default 3): each reports the round
	// of median rate (a paced one: of median p99), so that one run's noise
	// (a checkpoint, a neighbour's burst on a 2-core machine) moves no
	// verdict. Each round uses fresh schemas and consumer groups, and the
	// paced ones fresh topics.
	Rounds int
	// PaceRate and PaceFor: the paced phases (default 1,000/s for 5s).
	PaceRate int
	PaceFor  time.Duration
	// SweepPartitions is the partitions of the many-partitions scenario's
	// topic (default 256), and SweepPools the pool sizes it tries beside
	// the default pool (default 8, 16, … up to one per partition).
	SweepPartitions int
	SweepPools      []int
	// Only, when set, lists the scenarios to run (comma-separated ids, see
	// ScenarioIDs); the others are skipped. Redelivery and relay need
	// exactly.
	Only string
	// DatabaseURL and Brokers: empty means embedded.
	DatabaseURL string
	Brokers     []string
	// Child is the command line that runs one scenario: the spec (JSON) is
	// appended as the last argument.
	Child   []string
	Timeout time.Duration
	Logger  *slog.Logger
}

func (c *Config) defaults() {
	if c.Records == 0 {
		c.Records = 100_000
	}
	if c.Small == 0 {
		c.Small = defaultSmall
	}
	if c.Chunk <= 0 {
		c.Chunk = defaultSmall
		if c.Small > 0 {
			c.Chunk = c.Small
		}
	}
	if c.Partitions == 0 {
		c.Partitions = 6
	}
	if c.Conns == 0 {
		c.Conns = c.Partitions
	}
	if c.SweepPartitions <= 0 {
		c.SweepPartitions = defaultSweepPartitions
	}
	if c.Batch == 0 {
		c.Batch = 100
	}
	if c.Accounts == 0 {
		c.Accounts = 10_000
	}
	if c.Transfers == 0 {
		c.Transfers = 10_000
	}
	if c.Rounds <= 0 {
		c.Rounds = 3
	}
	if c.PaceRate == 0 {
		c.PaceRate = 1000
	}
	if c.PaceFor == 0 {
		c.PaceFor = 5 * time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = 3 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// ScenarioIDs are the scenario ids -only accepts, in the order they run.
const ScenarioIDs = "limit1,limit,pipelimit,setlimit,naive,guarded,guardedslice,exactly1,exactly,protobuf,redelivery,small,pipelined,setbased,iobound,pacedloop,paced,relay,outbox1,outbox4,outboxwal,hotrow,hotrow1,hotrowtx,hotrowtx1,hotlimit,partitions,guardempty,guardfull"

// Scenario ids the report and the last line refer to.
const (
	idLimit     = "limit"
	idPipeLimit = "pipelimit"
	idSetLimit  = "setlimit"
	idNaive     = "naive"
	idGuarded   = "guarded"
	idGuardedSl = "guardedslice"
	idExactly1  = "exactly1"
	idExactly   = "exactly"
	idRedeliver = "redelivery"
	idSmall     = "small"
	idPipelined = "pipelined"
	idSetBased  = "setbased"
	idPacedLoop = "pacedloop"
	idPaced     = "paced"
	idRelay     = "relay"
	idHotRow    = "hotrow"
	idHotRow1   = "hotrow1"
	idHotRowTx  = "hotrowtx"
	idHotRowTx1 = "hotrowtx1"
	idHotLimit  = "hotlimit"
)

// hotRow reports whether id is a scenario of the hot-row workload.
func hotRow(id string) bool {
	switch id {
	case idHotRow, idHotRow1, idHotRowTx, idHotRowTx1, idHotLimit:
		return true
	}
	return false
}

// paced reports whether id is a paced scenario: its rate is the pace, and
// its figure the latency.
func paced(id string) bool { return id == idPaced || id == idPacedLoop }

// hotRowTimeout bounds a hot-row scenario.
const hotRowTimeout = 90 * time.Second

// scenario is one row of the table.
type scenario struct {
	id   string // for -only
	name string
	spec Spec
	// migrate: start from empty tables in spec.Schema.
	migrate bool
}

// repeated reports whether scenario id runs in every round
// (Config.Rounds): those whose rates feed a ratio target do. The others
// run in the first round only.
func repeated(id string) bool {
	switch id {
	case idLimit, idPipeLimit, idSetLimit, idGuarded, idExactly1, idExactly, idRedeliver,
		idPipelined, idSetBased, idHotRow, idHotRow1, idPacedLoop, idPaced, idGuardEmpty, idGuardFull:
		return true
	}
	return false
}

// inRound returns sc's spec for round r (from 1): from the second round
// on, with schemas and consumer groups of their own.
func (sc scenario) inRound(r int) (Spec, bool) {
	if r == 1 {
		return sc.spec, true
	}
	if !repeated(sc.id) {
		return Spec{}, false
	}
	s := sc.spec
	suffix := "_r" + strconv.Itoa(r)
	s.Schema += suffix
	if s.Group != "" {
		s.Group += suffix
	}
	if paced(sc.id) {
		s.Topic += suffix // produced by the scenario: a topic of its own
	}
	return s, true
}

// median returns the result of median rate among rs (the lower middle one
// of an even count), or of median p99 for a paced scenario (its rate is
// the pace), with every round's rate in Rounds and CPU per record in
// CPUPerRecord.
func median(rs []Result) Result {
	sorted := slices.Clone(rs)
	slices.SortFunc(sorted, func(a, b Result) int {
		if paced(a.ID) {
			return cmp.Compare(a.P99, b.P99)
		}
		return cmp.Compare(a.Rate, b.Rate)
	})
	m := lowerMiddle(sorted)
	m.Rounds = make([]float64, len(rs))
	m.CPUPerRecord = make([]float64, len(rs))
	if paced(m.ID) {
		m.RoundP99 = make([]float64, len(rs))
	}
	for i, r := range rs {
		m.Rounds[i] = r.Rate
		if m.RoundP99 != nil {
			m.RoundP99[i] = r.P99
		}
		if r.Records > 0 {
			m.CPUPerRecord[i] = r.CPU / float64(r.Records)
		}
	}
	return m
}

// cpuPerRecord returns r's CPU per record, seconds: the median of its
// rounds' (the lower middle one of an even count), or its own for a
// scenario run once.
func cpuPerRecord(r Result) float64 {
	if len(r.CPUPerRecord) > 0 {
		return lowerMiddle(slices.Sorted(slices.Values(r.CPUPerRecord)))
	}
	return r.CPU / float64(r.Records)
}

// lowerMiddle returns the median of sorted, non-empty: its lower middle
// element for an even count.
func lowerMiddle[E any](sorted []E) E {
	return sorted[(len(sorted)-1)/2]
}

// Run runs every scenario and writes the table to w. It fails when
// cfg.Only names a scenario that does not exist (before starting
// anything), the environment cannot be started or a scenario fails.
func Run(ctx context.Context, cfg Config, w io.Writer) ([]Result, error) {
	cfg.defaults()
	if err := checkOnly(cfg.Only); err != nil {
		return nil, err
	}
	log := cfg.Logger
	env, err := devenv.Start(ctx, devenv.Options{DatabaseURL: cfg.DatabaseURL, Brokers: cfg.Brokers,
		Partitions: int32(cfg.Partitions), Logger: log,
		PostgresSettings: map[string]string{"synchronous_commit": "on", "fsync": "on"}})
	if err != nil {
		return nil, err
	}
	defer env.Close()
	pool, err := pgxpool.New(ctx, env.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("connecting to the database: %w", err)
	}
	defer pool.Close()
	var syncCommit string
	if err := pool.QueryRow(ctx, "show synchronous_commit").Scan(&syncCommit); err != nil {
		return nil, fmt.Errorf("reading synchronous_commit: %w", err)
	}
	fmt.Fprintf(w, "bench: %d records (and %d), %d partitions, batches of %d, pool of %d connections per process, %d accounts, synchronous_commit=%s, embedded db=%v broker=%v\n",
		cfg.Records, cfg.Small, cfg.Partitions, cfg.Batch, cfg.Conns, cfg.Accounts, syncCommit, env.EmbeddedDB, env.EmbeddedBroker)

	fmt.Fprintf(w, "bench: load average before: %s\n", loadavg())
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	adm := kadm.NewClient(workload.Client(env.Brokers))
	defer adm.Close()
	topic := "bench-credit-" + run
	small := "bench-credit-small-" + run
	pacedTopic := "bench-credit-paced-" + run
	pacedLoop := "bench-credit-pacedloop-" + run
	events := credit.EventsTopic + "-bench-" + run
	transfersTopic := "bench-transfers-" + run
	protobufTopic := "bench-credit-protobuf-" + run
	topics := []string{topic, pacedTopic, pacedLoop, protobufTopic}
	for r := 2; r <= cfg.Rounds; r++ {
		topics = append(topics, pacedTopic+"_r"+strconv.Itoa(r), pacedLoop+"_r"+strconv.Itoa(r))
	}
	if cfg.Small > 0 {
		topics = append(topics, small)
	}
	if cfg.Transfers > 0 {
		topics = append(topics, transfersTopic)
	}
	if _, err := adm.CreateTopics(ctx, int32(cfg.Partitions), 1, nil, topics...); err != nil {
		return nil, fmt.Errorf("creating topics: %w", err)
	}
	start := time.Now()
	if err := produceChunked(ctx, env.Brokers, topic, cfg.Partitions, workload.Commands(cfg.Records, cfg.Accounts), cfg.Chunk); err != nil {
		return nil, err
	}
	if cfg.Small > 0 {
		if err := produceChunked(ctx, env.Brokers, small, cfg.Partitions, workload.Commands(cfg.Small, cfg.Accounts), cfg.Chunk); err != nil {
			return nil, err
		}
	}
	// The hot-row scenarios that consume need the transfers topic; hotlimit
	// writes the transfers straight to PostgreSQL.
	if cfg.Transfers > 0 && slices.ContainsFunc(strings.Split(ScenarioIDs, ","), func(id string) bool { return hotRow(id) && id != idHotLimit && selected(cfg.Only, id) }) {
		if err := produceTransfers(ctx, env.Brokers, transfersTopic, cfg.Partitions, cfg.Transfers); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(w, "bench: produced the topics in %s\n", time.Since(start).Round(time.Millisecond))

	base := Spec{DatabaseURL: env.DatabaseURL, Brokers: env.Brokers, Topic: topic, Events: events, Records: cfg.Records,
		Accounts: cfg.Accounts, Partitions: cfg.Partitions, Batch: cfg.Batch, Conns: cfg.Conns, Timeout: cfg.Timeout}
	with := func(f func(*Spec)) Spec { s := base; f(&s); return s }
	// One transaction per record runs at the database's commit rate,
	// whatever the topic's size: those scenarios consume the small topic,
	// so that the default run stays within a few minutes.
	oneTxPerRecord := func(s *Spec) {
		if cfg.Small > 0 {
			s.Topic, s.Records = small, cfg.Small
		}
	}
	pacedN := int(cfg.PaceFor.Seconds() * float64(cfg.PaceRate))
	limit := func(shape string) func(*Spec) {
		return func(s *Spec) { s.Kind, s.Shape, s.Schema = kindLimit, shape, "bench_limit_"+shape }
	}
	scenarios := []scenario{
		{"limit1", "limit (a) row-wise, 1 connection", with(func(s *Spec) { limit(shapeRowWise)(s); s.Schema, s.Conns = "bench_limit1", 1 }), true},
		{idLimit, fmt.Sprintf("limit (a) row-wise, %d connections", cfg.Conns), with(limit(shapeRowWise)), true},
		{idPipeLimit, "limit (p) pipelined", with(limit(shapePipelined)), true},
		{idSetLimit, "limit (b) set-based", with(limit(shapeSetBased)), true},
		// The hand-written loops mark each record after its commit and let
		// kgo.AutoCommitMarks commit in the background: the strongest of
		// franz-go's goroutine-per-partition examples.
		{idNaive, "naive loop, no guard (1 tx/record)", with(func(s *Spec) {
			s.Kind, s.Schema, s.Group = kindNaive, "bench_naive", "bench-naive-"+run
			oneTxPerRecord(s)
		}), true},
		{idGuarded, "guarded loop (1 tx/record)", with(func(s *Spec) {
			s.Kind, s.Schema, s.Group, s.Guard = kindNaive, "bench_guarded", "bench-guarded-"+run, true
			oneTxPerRecord(s)
		}), true},
		// For information: the same loop committing with CommitRecords
		// after each slice, a synchronous round trip.
		{idGuardedSl, "guarded loop, CommitRecords per slice", with(func(s *Spec) {
			s.Kind, s.Schema, s.Group, s.Guard, s.SliceCommit = kindNaive, "bench_guardedslice", "bench-guardedslice-"+run, true, true
			oneTxPerRecord(s)
		}), true},
		{idExactly1, "exactly, batch 1", with(func(s *Spec) {
			s.Kind, s.Schema, s.Group, s.Batch = kindExactly, "bench_exactly1", "bench-exactly1-"+run, 1
			oneTxPerRecord(s)
		}), true},
		{idExactly, "exactly, defaults", with(func(s *Spec) { s.Kind, s.Schema, s.Group = kindExactly, "bench_exactly", "bench-exactly-"+run }), true},
		protobufScenario(with, protobufTopic, run),
		{idRedeliver, "exactly, redelivery (all duplicates)", with(func(s *Spec) { s.Kind, s.Schema, s.Group = kindExactly, "bench_exactly", "bench-redelivery-"+run }), false},
	}
	if cfg.Small > 0 {
		scenarios = append(scenarios, scenario{idSmall, fmt.Sprintf("exactly, defaults, %d records", cfg.Small), with(func(s *Spec) {
			s.Kind, s.Schema, s.Group, s.Topic, s.Records = kindExactly, "bench_exactly_small", "bench-small-"+run, small, cfg.Small
		}), true})
	}
	scenarios = append(scenarios,
		// The credit effect through exactly with the pipelined handler
		// form, against limit (p).
		scenario{idPipelined, "exactly, pipelined handler", with(func(s *Spec) {
			s.Kind, s.Form, s.Schema, s.Group = kindExactly, formPipelined, "bench_pipelined", "bench-pipelined-"+run
		}), true},
		// The credit effect through exactly with the set-based handler
		// form, against limit (b).
		scenario{idSetBased, "exactly, set-based handler", with(func(s *Spec) {
			s.Kind, s.Form, s.Schema, s.Group = kindExactly, formSetBased, "bench_setbased", "bench-setbased-"+run
		}), true},
		// A handler calling a provider that takes 20 ms, before its
		// transaction (handler.WithCall), with the pool at the sizing
		// rule: against calls in flight ÷ latency.
		scenario{idIOBound, fmt.Sprintf("exactly, I/O-bound (%s provider call)", providerLatency), with(func(s *Spec) {
			s.Kind, s.Schema, s.Group = kindIOBound, "bench_iobound", "bench-iobound-"+run
			s.Conns = int(consumer.PoolConns(cfg.Partitions))
			oneTxPerRecord(s) // the small topic: the rate is the calls', not the database's
		}), true},
		// The guarded loop and exactly, each producing its own topic at
		// the same rate while consuming it: produce-to-commit latency
		// at a moderate load, side by side.
		scenario{idPacedLoop, fmt.Sprintf("guarded loop, paced %d/s", cfg.PaceRate), with(func(s *Spec) {
			s.Kind, s.Schema, s.Group, s.Guard, s.Topic, s.Records, s.PaceRate = kindNaive, "bench_guarded_paced", "bench-pacedloop-"+run, true, pacedLoop, pacedN, cfg.PaceRate
		}), true},
		scenario{idPaced, fmt.Sprintf("exactly, defaults, paced %d/s", cfg.PaceRate), with(func(s *Spec) {
			s.Kind, s.Schema, s.Group, s.Topic, s.Records, s.PaceRate = kindExactly, "bench_exactly_paced", "bench-paced-"+run, pacedTopic, pacedN, cfg.PaceRate
		}), true},
		scenario{idRelay, "relay", with(func(s *Spec) {
			s.Kind, s.Schema, s.PaceRate, s.PaceFor, s.Conns = kindRelay, "bench_exactly", cfg.PaceRate, cfg.PaceFor, 2
		}), false},
	)
	scenarios = append(scenarios, scaleScenarios(base, cfg.Records, run)...)
	scenarios = append(scenarios, guardScenarios(base, run, with)...)
	if cfg.Transfers > 0 {
		hot := func(id, name string, batch int, form string) scenario {
			return scenario{id, name, with(func(s *Spec) {
				s.Kind, s.Schema, s.Group, s.Topic, s.Records, s.Batch = kindHotRow, "bench_"+id, "bench-"+id+"-"+run, transfersTopic, cfg.Transfers, batch
				s.Form = form
				// Deadlocks cost a second each: a run that has not drained
				// the topic by then reports the rate of what it committed.
				s.Timeout, s.Partial = min(cfg.Timeout, hotRowTimeout), true
			}), true}
		}
		scenarios = append(scenarios,
			// The target rows: the transfer handler in the pipelined form
			// (its two UPDATEs queued, each checked to touch one row), as
			// a write-only handler is written (docs/handlers.md, "Handler
			// forms").
			hot(idHotRow, fmt.Sprintf("hot rows (%d accounts), defaults", hotAccounts), cfg.Batch, formPipelined),
			hot(idHotRow1, fmt.Sprintf("hot rows (%d accounts), batch 1", hotAccounts), 1, formPipelined),
			// For information: the same transfers by the tx form, whose
			// two UPDATEs cost a round trip each, and the ceiling of that
			// form: the UPDATEs alone from one connection.
			hot(idHotRowTx, fmt.Sprintf("hot rows (%d accounts), tx form, defaults", hotAccounts), cfg.Batch, formTx),
			hot(idHotRowTx1, fmt.Sprintf("hot rows (%d accounts), tx form, batch 1", hotAccounts), 1, formTx),
			scenario{idHotLimit, fmt.Sprintf("hot rows (%d accounts), tx ceiling, 1 conn", hotAccounts), with(func(s *Spec) {
				s.Kind, s.Schema, s.Records = kindHotLimit, "bench_"+idHotLimit, cfg.Transfers
			}), true})
	}

	var order []string
	byID := map[string][]Result{}
	var results []Result
	for round := 1; round <= cfg.Rounds; round++ {
		if round > 1 {
			fmt.Fprintf(w, "bench: round %d of %d (the scenarios of the ratio and tail targets)\n", round, cfg.Rounds)
		}
		for _, sc := range scenarios {
			if !selected(cfg.Only, sc.id) {
				continue
			}
			spec, ok := sc.inRound(round)
			if !ok {
				continue
			}
			res, err := runScenario(ctx, w, cfg, pool, sc, spec, events)
			if err != nil {
				return medians(order, byID), err
			}
			if _, seen := byID[sc.id]; !seen {
				order = append(order, sc.id)
			}
			byID[sc.id] = append(byID[sc.id], res)
		}
	}
	results = medians(order, byID)
	if selected(cfg.Only, idPartitions) {
		res, err := runPartitions(ctx, w, cfg, env, pool, run)
		if err != nil {
			return results, err
		}
		results = append(results, res)
	}
	fmt.Fprintf(w, "bench: load average after: %s\n", loadavg())
	report(w, cfg, results)
	reportGuardAge(w, results)
	return results, nil
}

// medians returns, in order, each scenario's result of median rate.
func medians(order []string, byID map[string][]Result) []Result {
	results := make([]Result, 0, len(order))
	for _, id := range order {
		rs := byID[id]
		if rs[0].Missing {
			results = append(results, rs[0])
			continue
		}
		results = append(results, median(rs))
	}
	return results
}

// runScenario runs sc with spec (its spec for the current -rounds pass) in a child
// process, after migrating its schema, and prints its line.
func runScenario(ctx context.Context, w io.Writer, cfg Config, pool *pgxpool.Pool, sc scenario, spec Spec, events string) (Result, error) {
	if !formAvailable(spec.Form) {
		fmt.Fprintf(w, "bench: %-40s n/a (no %s handler form in this build)\n", sc.name, spec.Form)
		return Result{ID: sc.id, Name: sc.name, Missing: true}, nil
	}
	if sc.migrate {
		if err := fixture(spec.Schema, events).migrate(ctx, pool); err != nil {
			return Result{}, fmt.Errorf("%s: %w", sc.name, err)
		}
		if spec.Kind == kindHotRow || spec.Kind == kindHotLimit {
			if err := migrateAccounts(ctx, pool, spec.Schema); err != nil {
				return Result{}, fmt.Errorf("%s: %w", sc.name, err)
			}
		}
	}
	if err := prepareGuard(ctx, w, pool, sc, spec, events, cfg.Rounds); err != nil {
		return Result{}, fmt.Errorf("%s: %w", sc.name, err)
	}
	walStart := guardWALStart(ctx, pool, sc)
	// Start each scenario from a clean checkpoint, so one does not pay
	// for the previous one's dirty pages.
	if _, err := pool.Exec(ctx, "checkpoint"); err != nil {
		return Result{}, fmt.Errorf("checkpoint: %w", err)
	}
	before, err := deadlocks(ctx, pool)
	if err != nil {
		return Result{}, err
	}
	res, err := runChild(ctx, cfg.Child, spec)
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", sc.name, err)
	}
	res.ID, res.Name, res.Deadlocks = sc.id, sc.name, -1
	// The child's backends report their deadlocks when they end:
	// read the count once none is left.
	if err := awaitBackendsGone(ctx, pool); err == nil {
		if after, err := deadlocks(ctx, pool); err == nil {
			res.Deadlocks = after - before
		}
	}
	if paced(sc.id) {
		fmt.Fprintf(w, "bench: %-40s %9.0f rec/s  (%s, p50 %s ms, p99 %s ms)\n", sc.name, res.Rate, time.Duration(res.Seconds*float64(time.Second)).Round(time.Millisecond), ms(res.P50), ms(res.P99))
		return res, nil
	}
	fmt.Fprintf(w, "bench: %-40s %9.0f rec/s  (%s, %d deadlocks)\n", sc.name, res.Rate, time.Duration(res.Seconds*float64(time.Second)).Round(time.Millisecond), res.Deadlocks)
	reportGuardWAL(ctx, w, pool, sc, walStart, res.Records)
	if err := expiryCost(ctx, w, pool, sc, spec); err != nil {
		return Result{}, fmt.Errorf("%s: %w", sc.name, err)
	}
	return res, nil
}

// produceChunked produces cmds to topic's partitions round-robin, chunk
// commands per produce call. One call of a whole 100,000-record backlog
// fills the producer's batches up to their 1 MB limit (3,600 to 8,300
// records each, varying from run to run), while a 10,000-record topic is
// one batch per partition: a consumer holds at least a whole record batch
// per partition it fetches, so the peak-RSS comparison measured the batch
// sizes, not the backlog (docs/performance.md, peak RSS). Produced in
// chunks of the small topic's size, both topics hold batches of at most
// chunk/partitions records.
func produceChunked(ctx context.Context, brokers []string, topic string, partitions int, cmds []credit.Command, chunk int) error {
	for len(cmds) > 0 {
		n := min(len(cmds), chunk)
		if err := workload.Produce(ctx, brokers, topic, partitions, cmds[:n], 1); err != nil {
			return err
		}
		cmds = cmds[n:]
	}
	return nil
}

// peakRSS returns this process's peak resident set in KiB (VmHWM), or -1.
func peakRSS() int64 { return procStatus("VmHWM:") }

// procStatus returns the field of /proc/self/status (a size in KiB), or -1.
func procStatus(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}

// loadavg returns the 1, 5 and 15 minute load averages (the machine may be
// shared: a busy neighbour lowers every rate).
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// checkOnly returns an error naming the first id of only (Config.Only)
// that is not in ScenarioIDs.
func checkOnly(only string) error {
	if only == "" {
		return nil
	}
	known := strings.Split(ScenarioIDs, ",")
	for _, p := range strings.Split(only, ",") {
		if id := strings.TrimSpace(p); !slices.Contains(known, id) {
			return fmt.Errorf("bench: -only names scenario %q, which does not exist (known: %s)", id, ScenarioIDs)
		}
	}
	return nil
}

func selected(only, id string) bool {
	if only == "" {
		return true
	}
	for _, p := range strings.Split(only, ",") {
		if strings.TrimSpace(p) == id {
			return true
		}
	}
	return false
}

// runChild runs spec in a child process and returns its result with its
// peak RSS.
func runChild(ctx context.Context, child []string, spec Spec) (Result, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return Result{}, err
	}
	args := append(append([]string{}, child[1:]...), string(b))
	cmd := exec.CommandContext(ctx, child[0], args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return Result{}, fmt.Errorf("child process: %w", err)
	}
	var res Result
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		return Result{}, fmt.Errorf("reading the child's result %q: %w", out.String(), err)
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		// ru_maxrss is not used: Go starts children with vfork semantics
		// (CLONE_VM), and Linux carries the parent's high-water mark into
		// the child's at exec. The child reports its own VmHWM instead.
		if res.MaxRSS <= 0 {
			res.MaxRSS = ru.Maxrss // KiB on Linux
		}
		res.CPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	return res, nil
}

// Child runs the scenario encoded in specJSON and writes its result as one
// JSON line to w: the hidden side of Run.
func Child(ctx context.Context, specJSON string, w io.Writer, log *slog.Logger) error {
	var spec Spec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		return fmt.Errorf("reading the scenario: %w", err)
	}
	res, err := RunChild(ctx, spec, log)
	if err != nil {
		return err
	}
	res.MaxRSS = peakRSS()
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// find returns the result of the scenario id, if it ran.
func find(results []Result, id string) (Result, bool) {
	for _, r := range results {
		if r.ID == id && !r.Missing {
			return r, true
		}
	}
	return Result{}, false
}

// awaitBackendsGone waits until no connection of a child process is left
// in pg_stat_activity: a backend reports its statistics (the deadlock
// count) before it leaves pg_stat_activity.
func awaitBackendsGone(ctx context.Context, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return workload.Poll(ctx, func() (bool, error) {
		var n int
		err := pool.QueryRow(ctx, `select count(*) from pg_stat_activity where application_name = $1`, childAppName).Scan(&n)
		return err == nil && n == 0, err
	})
}

func ms(v float64) string {
	if v < 0 {
		return "—"
	}
	if v < 10 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

// rate formats a scenario's rate for the last line: n/a when it did not
// run.
func rate(results []Result, id string) string {
	if r, ok := find(results, id); ok {
		return strconv.FormatFloat(r.Rate, 'f', 0, 64)
	}
	return "n/a"
}

// roundRates formats the rates of a scenario's rounds, — for one round.
func roundRates(rates []float64) string {
	if len(rates) < 2 {
		return "—"
	}
	parts := make([]string, len(rates))
	for i, v := range rates {
		parts[i] = strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strings.Join(parts, " ")
}

// roundP99s formats the p99 of a paced scenario's rounds.
func roundP99s(p99s []float64) string {
	parts := make([]string, len(p99s))
	for i, v := range p99s {
		parts[i] = ms(v)
	}
	return "p99 " + strings.Join(parts, " ") + " ms"
}

// report writes the table, the targets and the last line.
func report(w io.Writer, cfg Config, results []Result) {
	limit, okLimit := find(results, idLimit)
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\trecords\tseconds\trec/s\t× limit (a)\tp50 ms\tp99 ms\tpeak RSS MiB\tCPU s\tdeadlocks\trounds rec/s\t")
	for _, r := range results {
		if r.Missing {
			fmt.Fprintf(tw, "%s\t—\t—\tn/a\t—\t—\t—\t—\t—\t—\t—\t\n", r.Name)
			continue
		}
		ratio := "—"
		if okLimit && r.ID != idRelay && r.ID != idPaced && r.ID != idPacedLoop && r.ID != idIOBound && !hotRow(r.ID) && !isScale(r.ID) && r.ID != idPartitions {
			ratio = fmt.Sprintf("%.2f", r.Rate/limit.Rate)
		}
		p50, p99 := r.P50, r.P99
		if r.ID == idRelay {
			p50, p99 = r.AckP50, r.AckP99
		}
		dl := "—"
		if r.Deadlocks >= 0 {
			dl = strconv.FormatInt(r.Deadlocks, 10)
		}
		rounds := roundRates(r.Rounds)
		if len(r.RoundP99) > 1 {
			rounds = roundP99s(r.RoundP99)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.0f\t%s\t%s\t%s\t%.1f\t%.1f\t%s\t%s\t\n", r.Name, r.Records, r.Seconds, r.Rate, ratio, ms(p50), ms(p99), float64(r.MaxRSS)/1024, r.CPU, dl, rounds)
	}
	tw.Flush()
	for _, r := range results {
		if r.Note != "" {
			fmt.Fprintf(w, "note: %s: %s\n", r.Name, r.Note)
		}
	}
	fmt.Fprintln(w, "limits (a) (p) (b): the business statements alone from pgx, no Kafka, no NOTIFY, locks or counters; loops: franz-go goroutine per partition")
	fmt.Fprintln(w, "latency: produce (or, for a backlog, the scenario's start) to DB commit; relay: commit-to-ack of the paced phase")
	fmt.Fprintln(w, "peak RSS and CPU (user+system) are the scenario's own process; PostgreSQL and the broker are not included")
	fmt.Fprintln(w, "deadlocks: pg_stat_database.deadlocks of the bench database, before and after the scenario")
	if cfg.Rounds > 1 {
		fmt.Fprintf(w, "rounds: the scenarios of the ratio and tail targets ran %d times, interleaved; each row is its round of median rate (paced: of median p99), and the CPU figures take the median of the rounds' CPU per record\n", cfg.Rounds)
	}
	fmt.Fprintln(w)

	check := func(ok bool, format string, args ...any) {
		verdict := "MISSED"
		if ok {
			verdict = "met"
		}
		fmt.Fprintf(w, "target %-6s "+format+"\n", append([]any{verdict}, args...)...)
	}
	ratioTarget := func(id, refID string, want float64, what string) {
		r, ok := find(results, id)
		ref, okRef := find(results, refID)
		for _, m := range results {
			if m.ID == id && m.Missing {
				fmt.Fprintf(w, "target n/a    %s ≥ %.1f × %s: its handler form is not in this build\n", what, want, refID)
				return
			}
		}
		if !ok || !okRef || ref.Rate <= 0 {
			fmt.Fprintf(w, "target n/a    %s ≥ %.1f × %s: not measured\n", what, want, refID)
			return
		}
		check(r.Rate >= want*ref.Rate, "%s ≥ %.1f × %s: %.2f", what, want, refID, r.Rate/ref.Rate)
	}
	ratioTarget(idExactly, idLimit, 0.8, "exactly, defaults (tx.Exec handler)")
	ratioTarget(idPipelined, idPipeLimit, 0.7, "pipelined handler")
	ratioTarget(idSetBased, idSetLimit, 0.7, "set-based handler")
	ratioTarget(idExactly1, idGuarded, 1.0, "exactly, batch 1")
	// CPU per record is a figure, not a target: on a shared 2-core machine
	// it moves with the neighbours more than with the code.
	cpuFigure := func(id, limitID, what string) {
		r, ok := find(results, id)
		lim, okLim := find(results, limitID)
		if !ok || !okLim || r.Records == 0 || lim.Records == 0 || lim.CPU <= 0 {
			return
		}
		per, limPer := cpuPerRecord(r), cpuPerRecord(lim)
		fmt.Fprintf(w, "info          %s CPU per record: %.2f × %s's (%.1f µs against %.1f µs)\n", what, per/limPer, limitID, 1e6*per, 1e6*limPer)
	}
	cpuFigure(idPipelined, idPipeLimit, "pipelined handler")
	cpuFigure(idSetBased, idSetLimit, "set-based handler")
	if hot, ok := find(results, idHotRow); ok {
		if hot1, ok1 := find(results, idHotRow1); ok1 && hot1.Rate > 0 {
			check(hot.Rate >= 3*hot1.Rate && hot.Deadlocks == 0, "hot rows, defaults ≥ 3 × batch 1 with 0 deadlocks: %.2f, %d deadlocks (batch 1: %d)",
				hot.Rate/hot1.Rate, hot.Deadlocks, hot1.Deadlocks)
			// Batch 1 of the tx form may be the faster one (no COMMIT
			// round trip of its own): the ratio against it too.
			if tx1, ok := find(results, idHotRowTx1); ok && tx1.Rate > hot1.Rate {
				fmt.Fprintf(w, "info          hot rows, defaults against the faster batch 1 (the tx form's, %.0f rec/s): %.2f\n", tx1.Rate, hot.Rate/tx1.Rate)
			}
		}
	}
	if tx, ok := find(results, idHotRowTx); ok {
		if tx1, ok1 := find(results, idHotRowTx1); ok1 && tx1.Rate > 0 {
			line := fmt.Sprintf("info          hot rows, tx form: defaults %.2f × batch 1, %d deadlocks", tx.Rate/tx1.Rate, tx.Deadlocks)
			if lim, ok := find(results, idHotLimit); ok && lim.Rate > 0 {
				line += fmt.Sprintf("; its ceiling (the UPDATEs alone, 1 connection) is %.2f × its batch 1, and the tx form reaches %.2f of it", lim.Rate/tx1.Rate, tx.Rate/lim.Rate)
			}
			fmt.Fprintln(w, line)
		}
	}
	ratioTarget(idRedeliver, idExactly, 2, "redelivery")
	io, okIO := find(results, idIOBound)
	if okIO && io.Ideal > 0 {
		check(io.Rate >= 0.8*io.Ideal, "I/O-bound handler ≥ 0.8 × calls in flight ÷ latency (%.0f rec/s): %.2f", io.Ideal, io.Rate/io.Ideal)
	}
	ex, okEx := find(results, idExactly)
	if sm, ok := find(results, idSmall); ok && okEx {
		check(float64(ex.MaxRSS) <= 1.2*float64(sm.MaxRSS), "peak RSS at %d within 20%% of %d: %.1f MiB vs %.1f MiB (%+.0f%%)",
			ex.Records, sm.Records, float64(ex.MaxRSS)/1024, float64(sm.MaxRSS)/1024, 100*(float64(ex.MaxRSS)/float64(sm.MaxRSS)-1))
	}
	if pc, ok := find(results, idPaced); ok {
		if lp, okLp := find(results, idPacedLoop); okLp && lp.P99 > 0 {
			check(pc.P99 >= 0 && pc.P99 <= 2*lp.P99, "exactly p99 produce-to-commit ≤ 2 × the guarded loop's at %d records/s: %.2f (%s ms against %s ms; p50 %s against %s ms)",
				cfg.PaceRate, pc.P99/lp.P99, ms(pc.P99), ms(lp.P99), ms(pc.P50), ms(lp.P50))
		} else {
			fmt.Fprintf(w, "target n/a    exactly p99 produce-to-commit ≤ 2 × the guarded loop's at %d records/s: the paced loop did not run\n", cfg.PaceRate)
		}
	}
	if rl, ok := find(results, idRelay); ok {
		check(rl.AckP99 >= 0 && rl.AckP99 < 20, "relay p99 commit-to-ack < 20 ms at %d events/s: %s ms (p50 %s ms, %d events)",
			cfg.PaceRate, ms(rl.AckP99), ms(rl.AckP50), rl.PacedEvents)
	}
	ratio := "n/a"
	if okEx && okLimit && limit.Rate > 0 {
		ratio = strconv.FormatFloat(ex.Rate/limit.Rate, 'f', 2, 64)
	}
	ioideal := "n/a"
	if okIO && io.Ideal > 0 {
		ioideal = strconv.FormatFloat(io.Ideal, 'f', 0, 64)
	}
	fmt.Fprintf(w, "bench: exactly=%s limit=%s ratio=%s naive=%s batch1=%s pipelined=%s pipelimit=%s setbased=%s setlimit=%s hotrow=%s hotrow_b1=%s iobound=%s ioideal=%s\n",
		rate(results, idExactly), rate(results, idLimit), ratio, rate(results, idGuarded), rate(results, idExactly1), rate(results, idPipelined),
		rate(results, idPipeLimit), rate(results, idSetBased), rate(results, idSetLimit), rate(results, idHotRow), rate(results, idHotRow1),
		rate(results, idIOBound), ioideal)
}
