// Package bench is `exactly bench`: the throughput of exactly side by side
// with its limits, on the embedded broker and a private PostgreSQL with
// synchronous_commit=on. Each scenario runs in a child process (the bench
// binary re-executed with a hidden flag), so its peak RSS is its own.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/exactly-go/exactly/internal/tools/devenv"
	"github.com/exactly-go/exactly/internal/tools/workload"
	"github.com/exactly-go/exactly/internal/tools/workload/credit"
)

// Config sizes a run.
type Config struct {
	// Records is the size of the main topic (default 100,000).
	Records int
	// Small is the size of the second topic exactly consumes with its
	// defaults, to compare peak RSS (default 10,000; negative skips).
	Small int
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
	// PaceRate and PaceFor: the paced phases (default 1,000/s for 5s).
	PaceRate int
	PaceFor  time.Duration
	// Only, when set, lists the scenarios to run (comma-separated ids:
	// limit1, limit, naive, exactly1, exactly, redelivery, small, paced,
	// relay); the others are skipped. Redelivery and relay need exactly.
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
		c.Small = 10_000
	}
	if c.Partitions == 0 {
		c.Partitions = 6
	}
	if c.Conns == 0 {
		c.Conns = c.Partitions
	}
	if c.Batch == 0 {
		c.Batch = 100
	}
	if c.Accounts == 0 {
		c.Accounts = 10_000
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

// scenario is one row of the table.
type scenario struct {
	id   string // for -only
	name string
	spec Spec
	// migrate: start from empty tables in spec.Schema.
	migrate bool
}

// Run runs every scenario and writes the table to w. It fails when the
// environment cannot be started or a scenario fails.
func Run(ctx context.Context, cfg Config, w io.Writer) ([]Result, error) {
	cfg.defaults()
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
	paced := "bench-credit-paced-" + run
	events := credit.EventsTopic + "-bench-" + run
	topics := []string{topic, paced}
	if cfg.Small > 0 {
		topics = append(topics, small)
	}
	if _, err := adm.CreateTopics(ctx, int32(cfg.Partitions), 1, nil, topics...); err != nil {
		return nil, fmt.Errorf("creating topics: %w", err)
	}
	start := time.Now()
	if err := workload.Produce(ctx, env.Brokers, topic, cfg.Partitions, workload.Commands(cfg.Records, cfg.Accounts), 1); err != nil {
		return nil, err
	}
	if cfg.Small > 0 {
		if err := workload.Produce(ctx, env.Brokers, small, cfg.Partitions, workload.Commands(cfg.Small, cfg.Accounts), 1); err != nil {
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
	scenarios := []scenario{
		{"limit1", "limit, 1 connection", with(func(s *Spec) { s.Kind, s.Schema, s.Conns = kindLimit, "bench_limit1", 1 }), true},
		{"limit", fmt.Sprintf("limit, %d connections", cfg.Conns), with(func(s *Spec) { s.Kind, s.Schema = kindLimit, "bench_limit" }), true},
		{"naive", "naive (1 tx/record, no guard)", with(func(s *Spec) {
			s.Kind, s.Schema, s.Group = kindNaive, "bench_naive", "bench-naive-"+run
			oneTxPerRecord(s)
		}), true},
		{"exactly1", "exactly, batch 1", with(func(s *Spec) {
			s.Kind, s.Schema, s.Group, s.Batch = kindExactly, "bench_exactly1", "bench-exactly1-"+run, 1
			oneTxPerRecord(s)
		}), true},
		{"exactly", "exactly, defaults", with(func(s *Spec) { s.Kind, s.Schema, s.Group = kindExactly, "bench_exactly", "bench-exactly-"+run }), true},
		{"redelivery", "exactly, redelivery (all duplicates)", with(func(s *Spec) { s.Kind, s.Schema, s.Group = kindExactly, "bench_exactly", "bench-redelivery-"+run }), false},
	}
	if cfg.Small > 0 {
		scenarios = append(scenarios, scenario{"small", fmt.Sprintf("exactly, defaults, %d records", cfg.Small), with(func(s *Spec) {
			s.Kind, s.Schema, s.Group, s.Topic, s.Records = kindExactly, "bench_exactly_small", "bench-small-"+run, small, cfg.Small
		}), true})
	}
	scenarios = append(scenarios,
		scenario{"paced", fmt.Sprintf("exactly, defaults, paced %d/s", cfg.PaceRate), with(func(s *Spec) {
			s.Kind, s.Schema, s.Group, s.Topic, s.Records, s.PaceRate = kindExactly, "bench_exactly_paced", "bench-paced-"+run, paced, pacedN, cfg.PaceRate
		}), true},
		scenario{"relay", "relay", with(func(s *Spec) {
			s.Kind, s.Schema, s.PaceRate, s.PaceFor, s.Conns = kindRelay, "bench_exactly", cfg.PaceRate, cfg.PaceFor, 2
		}), false},
	)

	var results []Result
	for _, sc := range scenarios {
		if !selected(cfg.Only, sc.id) {
			continue
		}
		if sc.migrate {
			if err := fixture(sc.spec.Schema, events).migrate(ctx, pool); err != nil {
				return results, fmt.Errorf("%s: %w", sc.name, err)
			}
		}
		// Start each scenario from a clean checkpoint, so one does not pay
		// for the previous one's dirty pages.
		if _, err := pool.Exec(ctx, "checkpoint"); err != nil {
			return results, fmt.Errorf("checkpoint: %w", err)
		}
		res, err := runChild(ctx, cfg.Child, sc.spec)
		if err != nil {
			return results, fmt.Errorf("%s: %w", sc.name, err)
		}
		res.Name = sc.name
		results = append(results, res)
		fmt.Fprintf(w, "bench: %-40s %9.0f rec/s  (%s)\n", sc.name, res.Rate, time.Duration(res.Seconds*float64(time.Second)).Round(time.Millisecond))
	}
	fmt.Fprintf(w, "bench: load average after: %s\n", loadavg())
	report(w, cfg, results)
	return results, nil
}

// peakRSS returns this process's peak resident set in KiB (VmHWM), or -1.
func peakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
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

func find(results []Result, prefix string) (Result, bool) {
	for _, r := range results {
		if strings.HasPrefix(r.Name, prefix) {
			return r, true
		}
	}
	return Result{}, false
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

// report writes the table, the targets and the last line.
func report(w io.Writer, cfg Config, results []Result) {
	limit, _ := find(results, fmt.Sprintf("limit, %d connections", cfg.Conns))
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\trecords\tseconds\trec/s\t× limit\tp50 ms\tp99 ms\tpeak RSS MiB\tCPU s\t")
	for _, r := range results {
		ratio := "—"
		if limit.Rate > 0 && !strings.HasPrefix(r.Name, "relay") && !strings.Contains(r.Name, "paced") {
			ratio = fmt.Sprintf("%.2f", r.Rate/limit.Rate)
		}
		p50, p99 := r.P50, r.P99
		if strings.HasPrefix(r.Name, "relay") {
			p50, p99 = r.AckP50, r.AckP99
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.0f\t%s\t%s\t%s\t%.1f\t%.1f\t\n", r.Name, r.Records, r.Seconds, r.Rate, ratio, ms(p50), ms(p99), float64(r.MaxRSS)/1024, r.CPU)
	}
	tw.Flush()
	fmt.Fprintln(w, "latency: produce (or, for a backlog, the scenario's start) to DB commit; relay: commit-to-ack of the paced phase")
	fmt.Fprintln(w, "peak RSS and CPU (user+system) are the scenario's own process; PostgreSQL and the broker are not included")
	fmt.Fprintln(w)

	ex, okEx := find(results, "exactly, defaults")
	naive, okNaive := find(results, "naive")
	check := func(ok bool, format string, args ...any) {
		verdict := "MISSED"
		if ok {
			verdict = "met"
		}
		fmt.Fprintf(w, "target %-6s "+format+"\n", append([]any{verdict}, args...)...)
	}
	if okEx && limit.Rate > 0 {
		check(ex.Rate >= 0.8*limit.Rate, "exactly ≥ 0.8 × limit: %.2f", ex.Rate/limit.Rate)
	}
	if okEx && okNaive {
		check(ex.Rate >= 5*naive.Rate, "exactly ≥ 5 × naive: %.1f", ex.Rate/naive.Rate)
	}
	if re, ok := find(results, "exactly, redelivery"); ok && okEx {
		check(re.Rate >= 2*ex.Rate, "redelivery ≥ 2 × first delivery: %.1f", re.Rate/ex.Rate)
	}
	if sm, ok := find(results, fmt.Sprintf("exactly, defaults, %d records", cfg.Small)); ok && okEx {
		check(float64(ex.MaxRSS) <= 1.2*float64(sm.MaxRSS), "peak RSS at %d within 20%% of %d: %.1f MiB vs %.1f MiB (%+.0f%%)",
			ex.Records, sm.Records, float64(ex.MaxRSS)/1024, float64(sm.MaxRSS)/1024, 100*(float64(ex.MaxRSS)/float64(sm.MaxRSS)-1))
	}
	if rl, ok := find(results, "relay"); ok {
		check(rl.AckP99 >= 0 && rl.AckP99 < 20, "relay p99 commit-to-ack < 20 ms at %d events/s: %s ms (p50 %s ms, %d events)",
			cfg.PaceRate, ms(rl.AckP99), ms(rl.AckP50), rl.PacedEvents)
	}
	ratio := 0.0
	if limit.Rate > 0 {
		ratio = ex.Rate / limit.Rate
	}
	fmt.Fprintf(w, "bench: exactly=%.0f rec/s limit=%.0f rec/s ratio=%.2f naive=%.0f rec/s\n", ex.Rate, limit.Rate, ratio, naive.Rate)
}
