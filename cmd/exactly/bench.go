package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/exactly-go/exactly/cmd/exactly/internal/bench"
	"github.com/exactly-go/exactly/consumer"
)

// runBench is `exactly bench`: exactly side by side with its limits. With
// the hidden -child flag it runs one scenario (the spec is the argument)
// and prints its result: the parent re-executes itself that way so that
// each scenario's peak RSS is measured alone.
func runBench(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stdout)
	records := fs.Int("records", 100_000, "records in the main topic")
	small := fs.Int("small", 10_000, "records in the second topic, for the peak-RSS comparison (negative: skip)")
	chunk := fs.Int("chunk", 0, "records per produce call of the two topics, which caps their record batches at chunk/partitions records (0: the -small size)")
	partitions := fs.Int("partitions", 6, "partitions of the topics")
	conns := fs.Int("conns", 0, "connection pool size of each process (0: one per partition)")
	batch := fs.Int("batch", 100, "exactly's BatchMaxRecords and the limit's transaction size")
	accounts := fs.Int("accounts", 10_000, "accounts credited (events are keyed by account)")
	transfers := fs.Int("transfers", 10_000, "transfers of the hot-row workload (negative: skip)")
	rounds := fs.Int("rounds", 3, "rounds of the scenarios that feed a ratio or the tail target; each reports its median round")
	paceRate := fs.Int("pace-rate", 1000, "rate of the paced phases, records/s")
	paceFor := fs.Duration("pace-for", 5*time.Second, "duration of the paced phases")
	sweepPartitions := fs.Int("sweep-partitions", 256, "partitions of the many-partitions scenario")
	sweepPools := fs.String("sweep-pools", "", "pool sizes the many-partitions scenario tries beside the default pool (comma-separated; empty: 8, 16, … up to one per partition)")
	only := fs.String("only", "", "run only these scenarios (comma-separated: "+bench.ScenarioIDs+")")
	verbose := fs.Bool("v", false, "log what the consumers do")
	child := fs.Bool("child", false, "(internal) run the one scenario given as argument")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: exactly bench [flags]")
		fs.VisitAll(func(f *flag.Flag) {
			if f.Name != "child" {
				fmt.Fprintf(fs.Output(), "  -%s\t%s (default %q)\n", f.Name, f.Usage, f.DefValue)
			}
		})
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	level := slog.LevelWarn + 4 // quiet unless -v
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if *child {
		if fs.NArg() != 1 {
			return errors.New("-child takes the scenario as its one argument")
		}
		return bench.Child(ctx, fs.Arg(0), stdout, log)
	}
	pools, err := bench.ParsePools(*sweepPools)
	if err != nil {
		return fmt.Errorf("-sweep-pools: %w", err)
	}
	cfg, err := consumer.ConfigFromEnv(ctx)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this binary to run the scenarios: %w", err)
	}
	childArgs := []string{exe, "bench", "-child"}
	if *verbose {
		childArgs = append(childArgs, "-v")
	}
	start := time.Now()
	_, err = bench.Run(ctx, bench.Config{
		Records: *records, Small: *small, Chunk: *chunk, Partitions: *partitions, Conns: *conns, Batch: *batch, Accounts: *accounts,
		Transfers: *transfers, Rounds: *rounds, PaceRate: *paceRate, PaceFor: *paceFor, Only: *only,
		SweepPartitions: *sweepPartitions, SweepPools: pools,
		DatabaseURL: cfg.DatabaseURL, Brokers: cfg.Brokers, Child: childArgs, Logger: log,
	}, stdout)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench: finished in %s\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}
