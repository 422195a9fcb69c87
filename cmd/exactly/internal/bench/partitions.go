package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/exactly-go/exactly/cmd/exactly/internal/devenv"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload"
	"github.com/exactly-go/exactly/consumer"
)

// idPartitions is the many-partitions scenario (ScenarioIDs): one consumer
// process owning Config.SweepPartitions partitions (default 256), at the
// pool consumer.NewPool builds and at each size of Config.SweepPools.
const idPartitions = "partitions"

// defaultSweepPartitions is the partitions of the many-partitions topic.
const defaultSweepPartitions = 256

// sweepPools returns the pool sizes the many-partitions scenario tries,
// from 8 to one per partition (consumer.PoolConns without its cap:
// partitions + 2), sorted, without repeats.
func sweepPools(partitions int, sizes []int) []int {
	if len(sizes) == 0 {
		for n := 8; n < partitions; n *= 2 {
			sizes = append(sizes, n)
		}
		sizes = append(sizes, partitions+2)
	}
	sizes = slices.Clone(sizes)
	slices.Sort(sizes)
	return slices.Compact(sizes)
}

// poolRun is one pool size's measurement.
type poolRun struct {
	conns int
	// peak is the most server connections the process held at once
	// (pg_stat_activity, sampled every 50 ms); -1 when not read.
	peak int
	res  Result
	// skipped says why the size was not run.
	skipped string
}

// runPartitions is the many-partitions scenario: a topic of
// cfg.SweepPartitions partitions holding cfg.Records credits, consumed by
// one exactly process with its handler defaults, at the pool
// consumer.NewPool builds for that many partitions and at each size of
// sweepPools, each run with a fresh schema and group, in cfg.Rounds rounds
// (the sizes in reverse order in even rounds, so that none always runs
// first); each size reports its round of median rate. A size larger than
// the connections the server has free is skipped (the process could not
// open its pool). The result's rate is the default pool's; its note lists
// every size's rate and server connections, and the best of them.
func runPartitions(ctx context.Context, w io.Writer, cfg Config, env *devenv.Env, pool *pgxpool.Pool, run string) (Result, error) {
	parts := cfg.SweepPartitions
	name := fmt.Sprintf("%d partitions", parts)
	topic := "bench-partitions-" + run
	adm := kadm.NewClient(workload.Client(env.Brokers))
	defer adm.Close()
	if _, err := adm.CreateTopics(ctx, int32(parts), 1, nil, topic); err != nil {
		return Result{}, fmt.Errorf("%s: creating the topic: %w", name, err)
	}
	if err := produceChunked(ctx, env.Brokers, topic, parts, workload.Commands(cfg.Records, cfg.Accounts), cfg.Chunk); err != nil {
		return Result{}, fmt.Errorf("%s: %w", name, err)
	}
	def, err := consumer.NewPool(ctx, env.DatabaseURL, parts)
	if err != nil {
		return Result{}, fmt.Errorf("%s: the default pool: %w", name, err)
	}
	defConns := int(def.Config().MaxConns)
	def.Close()

	var free int
	if err := pool.QueryRow(ctx, `select current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int
		- (select count(*) from pg_stat_activity where backend_type = 'client backend')::int`).Scan(&free); err != nil {
		return Result{}, fmt.Errorf("%s: reading the server's free connections: %w", name, err)
	}
	sizes := []int{defConns}
	for _, n := range sweepPools(parts, cfg.SweepPools) {
		if n != defConns {
			sizes = append(sizes, n)
		}
	}
	byConns := map[int]*poolRun{}
	for _, conns := range sizes {
		byConns[conns] = &poolRun{conns: conns, peak: -1}
		// The child opens its whole pool at start: leave one connection
		// for the bench's own pool.
		if conns > free-1 {
			byConns[conns].skipped = fmt.Sprintf("the server has %d connections free", free)
			fmt.Fprintf(w, "bench: %-40s skipped: the server has %d connections free\n", fmt.Sprintf("%s, pool %d", name, conns), free)
		}
	}
	rounds := map[int][]Result{}
	for round := 1; round <= cfg.Rounds; round++ {
		order := slices.Clone(sizes)
		if round%2 == 0 {
			slices.Reverse(order) // no size always runs first, on a cold start
		}
		for _, conns := range order {
			pr := byConns[conns]
			if pr.skipped != "" {
				continue
			}
			label := fmt.Sprintf("%s, pool %d", name, conns)
			if conns == defConns {
				label += " (default)"
			}
			if cfg.Rounds > 1 {
				label += fmt.Sprintf(", round %d", round)
			}
			spec := Spec{DatabaseURL: env.DatabaseURL, Brokers: env.Brokers, Topic: topic, Events: "bench-partitions-events-" + run,
				Records: cfg.Records, Accounts: cfg.Accounts, Partitions: parts, Batch: cfg.Batch, Conns: conns, Timeout: cfg.Timeout,
				Kind: kindExactly, Schema: "bench_partitions", Group: fmt.Sprintf("bench-partitions-%s-%d-r%d", run, conns, round)}
			res, peak, err := runPooled(ctx, cfg, pool, spec)
			if err != nil {
				return Result{}, fmt.Errorf("%s: %w", label, err)
			}
			pr.peak = max(pr.peak, peak)
			rounds[conns] = append(rounds[conns], res)
			fmt.Fprintf(w, "bench: %-40s %9.0f rec/s  (%s, %d server connections)\n", label, res.Rate,
				time.Duration(res.Seconds*float64(time.Second)).Round(time.Millisecond), peak)
		}
	}
	var runs []poolRun
	for _, conns := range sizes {
		pr := byConns[conns]
		if rs := rounds[conns]; len(rs) > 0 {
			slices.SortFunc(rs, func(a, b Result) int { return cmp.Compare(a.Rate, b.Rate) })
			pr.res = lowerMiddle(rs)
		}
		runs = append(runs, *pr)
	}
	return partitionsResult(name, defConns, runs), nil
}

// runPooled runs spec's child on a freshly migrated schema and returns its
// result and the most connections its processes held on the server at
// once (pg_stat_activity, sampled every 50 ms), once they have closed.
func runPooled(ctx context.Context, cfg Config, pool *pgxpool.Pool, spec Spec) (Result, int, error) {
	if err := fixture(spec.Schema, spec.Events).migrate(ctx, pool); err != nil {
		return Result{}, 0, err
	}
	if _, err := pool.Exec(ctx, "checkpoint"); err != nil {
		return Result{}, 0, fmt.Errorf("checkpoint: %w", err)
	}
	var peak atomic.Int64
	sctx, stop := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			var n int64
			if err := pool.QueryRow(sctx, `select count(*) from pg_stat_activity where application_name = $1`, childAppName).Scan(&n); err == nil && n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	res, err := runChild(ctx, cfg.Child, spec)
	stop()
	<-sampled
	if err != nil {
		return Result{}, 0, err
	}
	if err := awaitBackendsGone(ctx, pool); err != nil {
		return Result{}, 0, fmt.Errorf("the child's connections did not close: %w", err)
	}
	return res, int(peak.Load()), nil
}

// partitionsResult is the row of the many-partitions scenario: the default
// pool's measurement (runs[0]), with a note naming every size's rate and
// server connections and the best of them.
func partitionsResult(name string, defConns int, runs []poolRun) Result {
	res := Result{ID: idPartitions, Name: name, Deadlocks: -1, P50: -1, P99: -1}
	if len(runs) == 0 || runs[0].skipped != "" {
		res.Missing = true
		return res
	}
	d := runs[0]
	res.Records, res.Seconds, res.Rate, res.P50, res.P99, res.MaxRSS, res.CPU = d.res.Records, d.res.Seconds, d.res.Rate, d.res.P50, d.res.P99, d.res.MaxRSS, d.res.CPU
	best := d
	var sizes []string
	for _, r := range runs {
		if r.skipped != "" {
			sizes = append(sizes, fmt.Sprintf("pool %d skipped (%s)", r.conns, r.skipped))
			continue
		}
		sizes = append(sizes, fmt.Sprintf("pool %d: %.0f rec/s, %d server connections", r.conns, r.res.Rate, r.peak))
		if r.res.Rate > best.res.Rate {
			best = r
		}
	}
	res.Note = fmt.Sprintf("default pool (consumer.NewPool) max_conns %d: %.0f rec/s with %d server connections; best of the sizes tried: pool %d, %.0f rec/s with %d server connections (default = %.2f × best); %s",
		defConns, d.res.Rate, d.peak, best.conns, best.res.Rate, best.peak, d.res.Rate/best.res.Rate, strings.Join(sizes, "; "))
	return res
}

// ParsePools parses a comma-separated list of pool sizes for
// Config.SweepPools (the -sweep-pools flag of `exactly bench`); empty is
// nil, the default sizes. It fails naming a size that is not a positive
// integer.
func ParsePools(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("pool size %q: want a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}
