package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/exactly-go/exactly/cmd/exactly/internal/devenv"
)

// runDev runs a standalone embedded Kafka broker (kfake) and, unless
// -postgres=false, a private PostgreSQL (the one `exactly demo` starts) until
// ctx is cancelled (SIGINT/SIGTERM), then stops both. Once both accept
// connections it prints "dev broker listening on <addr>", the PostgreSQL
// address, and the export lines to paste into a shell:
//
//	export DATABASE_URL='postgres://postgres@127.0.0.1:<port>/postgres?sslmode=disable'
//	export EXACTLY_KAFKA_BROKERS=127.0.0.1:9092
//
// It fails on bad flags, when the broker cannot start (port taken,
// unreadable data directory) or when PostgreSQL cannot (binaries missing and
// not installable, port taken); what it started is stopped again.
func runDev(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	fs.SetOutput(stdout)
	port := fs.Int("port", 9092, "broker's TCP port on 127.0.0.1 (0 picks a free one)")
	dataDir := fs.String("data", "", "directory to persist the broker's state in (empty: in memory)")
	partitions := fs.Int("partitions", 6, "partitions of created and auto-created topics")
	topics := fs.String("topics", "", "comma-separated topics to create at start")
	withPG := fs.Bool("postgres", true, "also start a private PostgreSQL (false: the broker only)")
	pgPort := fs.Int("pg-port", 0, "PostgreSQL's TCP port on 127.0.0.1 (0 picks a free one)")
	pgDir := fs.String("pg-dir", "", "directory to keep PostgreSQL's cluster in, reused across runs (empty: a temporary one, removed at exit)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: exactly dev [flags]\n\nRuns a development Kafka broker (kfake) and a private PostgreSQL until\ninterrupted, and prints the export lines that point a service at them:\n\n  export DATABASE_URL='postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable'\n  export EXACTLY_KAFKA_BROKERS=127.0.0.1:9092\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout); err != nil {
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
	opts := devenv.Options{
		BrokerPort:    *port,
		BrokerDataDir: *dataDir,
		Partitions:    int32(*partitions),
		Topics:        seed,
		PostgresDir:   *pgDir,
		PostgresPort:  *pgPort,
		NoPostgres:    !*withPG,
		Logger:        slog.Default(),
	}
	env, err := devenv.Start(ctx, opts)
	if err != nil {
		return fmt.Errorf("starting the dev environment: %w", err)
	}
	defer func() {
		if err := env.Close(); err != nil {
			slog.Error("stopping the dev environment", "error", err)
			return
		}
		slog.Info("dev environment stopped")
	}()
	for _, addr := range env.Brokers {
		fmt.Fprintf(stdout, "dev broker listening on %s\n", addr)
	}
	if env.Postgres != nil {
		where := "a temporary directory, removed at exit"
		if *pgDir != "" {
			where = "kept"
		}
		fmt.Fprintf(stdout, "dev PostgreSQL listening on 127.0.0.1:%d (cluster in %s, %s)\n", env.Postgres.Port(), env.Postgres.Dir(), where)
	}
	fmt.Fprintln(stdout, "# paste into the shell that runs a service; Ctrl-C here stops both:")
	if env.Postgres != nil {
		fmt.Fprintf(stdout, "export DATABASE_URL='%s'\n", env.DatabaseURL)
	}
	fmt.Fprintf(stdout, "export EXACTLY_KAFKA_BROKERS=%s\n", strings.Join(env.Brokers, ","))
	<-ctx.Done()
	slog.Info("dev environment shutting down")
	return nil
}
