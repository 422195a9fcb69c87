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

	"github.com/exactly-go/exactly/cmd/exactly/internal/chaos"
)

// runChaos is `exactly chaos`: the example services as real processes under
// a seeded fault schedule (process, database and broker faults, and the
// user-code faults: swallowing handlers, oversized records, a denied
// topic), then the ledger checker.
func runChaos(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stdout)
	seed := fs.Uint64("seed", uint64(time.Now().UnixNano()%1_000_000), "seed of the workload and the fault schedule (default: from the clock; printed first)")
	keys := fs.Int("keys", 5000, "distinct credit commands")
	copies := fs.Int("copies", 3, "sends of each command (same partition, other partitions, much later)")
	duration := fs.Duration("duration", 60*time.Second, "fault window; the whole run takes about this plus a minute")
	consumers := fs.Int("consumers", 3, "processes of each service (credit with its relay, notify), at least 2")
	partitions := fs.Int("partitions", 6, "partitions of the commands and events topics")
	drain := fs.Duration("drain-timeout", 2*time.Minute, "bound on the wait for everything to be processed after the faults")
	dir := fs.String("dir", "", "run directory (binaries, data, process logs); default a temporary one, kept on failure")
	swallow := fs.Int("swallow-keys", 0, "commands whose handler swallows a unique violation (must end dead-lettered); 0: keys/200, at least 1; -1: none")
	oversized := fs.Int("oversized", 0, "oversized records of each kind (undecodable near the broker's limit; valid, emitting an event over the outbox's limit); 0: 2; -1: none")
	noDenial := fs.Bool("no-denial", false, "do not deny produce to the audit topic for a while")
	span := fs.Duration("generation-span", 0, "how long the guard's current generation takes claims before the pruners seal it; 0: duration/4 (at least 3 rotations); negative: no rotation")
	verbose := fs.Bool("v", false, "log the harness's diagnostics")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: exactly chaos [flags]\n\nBuilds the example services, runs them as processes on a private PostgreSQL\nand broker under a seeded schedule of process, database, broker and\nuser-code faults, then checks the ledger: nothing lost, nothing applied\ntwice (docs/chaos.md). Exits 1 on a violation; -seed reproduces a run.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	res, err := chaos.Run(ctx, chaos.Config{
		Seed: *seed, Keys: *keys, Copies: *copies, Duration: *duration, Consumers: *consumers,
		Partitions: *partitions, DrainTimeout: *drain, Dir: *dir,
		SwallowKeys: *swallow, Oversized: *oversized, NoDenial: *noDenial, GenerationSpan: *span,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	}, stdout)
	if err != nil {
		return err
	}
	res.Report(stdout)
	if !res.OK() {
		return errors.New("violations found; reproduce with -seed " + fmt.Sprint(res.Seed))
	}
	return nil
}
