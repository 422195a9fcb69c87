package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/demo"
)

// runDemo is `exactly demo`: the seed's experiment on embedded defaults.
func runDemo(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	commands := fs.Int("commands", 100, "distinct credit commands")
	copies := fs.Int("copies", 3, "deliveries of each command, to different partitions")
	verbose := fs.Bool("v", false, "log what the consumers do")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := consumer.ConfigFromEnv(ctx)
	if err != nil {
		return err
	}
	level := slog.LevelWarn + 4 // quiet unless -v
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	start := time.Now()
	_, err = demo.Run(ctx, demo.Config{
		Commands: *commands, Copies: *copies,
		DatabaseURL: cfg.DatabaseURL, Brokers: cfg.Brokers, Logger: log,
	}, stdout)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "demo: finished in %s\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}
