package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/exactly-go/exactly/internal/testenv/broker"
)

// runDev runs a standalone embedded Kafka broker (kfake) until ctx is
// cancelled (SIGINT/SIGTERM), printing "dev broker listening on <addr>" once
// it accepts connections. It fails on bad flags or when the broker cannot
// start (port taken, unreadable data directory).
func runDev(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	fs.SetOutput(stdout)
	port := fs.Int("port", 9092, "TCP port on 127.0.0.1 (0 picks a free one)")
	dataDir := fs.String("data", "", "directory to persist the broker's state in (empty: in memory)")
	partitions := fs.Int("partitions", 6, "partitions of created and auto-created topics")
	topics := fs.String("topics", "", "comma-separated topics to create at start")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: exactly dev [flags]\n\nRuns a standalone development Kafka broker until interrupted.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("parsing flags: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *partitions < 1 || *partitions > 1<<20 {
		return fmt.Errorf("-partitions %d: must be between 1 and %d", *partitions, 1<<20)
	}
	var seed []string
	for _, t := range strings.Split(*topics, ",") {
		if t = strings.TrimSpace(t); t != "" {
			seed = append(seed, t)
		}
	}

	b, err := broker.Start(ctx, broker.Options{
		Port:       *port,
		DataDir:    *dataDir,
		Partitions: int32(*partitions),
		Topics:     seed,
		Logger:     slog.Default(),
	})
	if err != nil {
		return fmt.Errorf("starting dev broker: %w", err)
	}
	defer b.Close()
	for _, addr := range b.Addrs() {
		fmt.Fprintf(stdout, "dev broker listening on %s\n", addr)
	}
	<-ctx.Done()
	slog.Info("dev broker shutting down")
	return nil
}
