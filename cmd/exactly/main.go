// Command exactly is the one CLI of the exactly framework: schema
// migrations, the outbox relay, parked outbox rows, guard pruning, a
// development broker and PostgreSQL, the demo, the benchmark, the dead-letter
// listing and replay, the chaos harness, and the day-2 views: inspect (one key) and
// status (text, JSON or a page).
//
// Usage:
//
//	exactly <command> [flags]
//
// Run "exactly help" for the list of commands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// command is one subcommand of the CLI.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout io.Writer) error
}

// commands lists every subcommand. Each lives in its own file, named after it.
func commands() map[string]command {
	return map[string]command{
		// one line per subcommand; keep sorted.
		"bench":       {summary: "measure exactly side by side with its limits (embedded broker, private PostgreSQL)", run: runBench},
		"chaos":       {summary: "run the services as processes under seeded faults, then check the ledger (lost=0 doubled=0)", run: runChaos},
		"deadletters": {summary: "list the latest dead letters of each dead-letter topic: error, key, original coordinates, attempts, time", run: runDeadletters},
		"demo":        {summary: "run the experiment of Making Background Jobs Idempotent: naive vs guarded consumers on embedded defaults", run: runDemo},
		"dev":         {summary: "run a development Kafka broker (kfake, localhost:9092) and a private PostgreSQL; prints the export lines", run: runDev},
		"inspect":     {summary: "show one key: its guard row, dead-letter mark, trace id and pending or parked outbox rows", run: runInspect},
		"migrate":     {summary: "create or upgrade the guard and outbox tables on DATABASE_URL", run: runMigrate},
		"outbox":      {summary: "list, retry or drop parked outbox rows (rows the relay can never publish as they are)", run: runOutbox},
		"prune":       {summary: "delete expired guard rows once (retention-checked)", run: runPrune},
		"relay":       {summary: "publish the outbox table to Kafka (one active relay per table)", run: runRelay},
		"replay":      {summary: "re-publish dead letters to their original topics (filter by key, time, count)", run: runReplay},
		"version":     {summary: "print the module version and the VCS revision the binary was built from", run: runVersion},
		"status":      {summary: "lag, outbox backlog and parked rows, guard retention, dead letters, duplicates; -http serves a page", run: runStatus},
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command line args and returns the exit code: 0 on success
// (and for help, on stdout), 1 when the command failed, 2 for a command
// line it cannot run (no or an unknown command, a bad flag: usage on
// stderr).
func run(args []string, stdout, stderr io.Writer) int {
	slog.SetDefault(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
	cmds := commands()
	if len(args) == 0 {
		usage(stderr, cmds)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help":
		usage(stdout, cmds)
		return 0
	case "-version", "--version":
		args = []string{"version"}
	case "help":
		if len(args) == 1 {
			usage(stdout, cmds)
			return 0
		}
		if _, ok := cmds[args[1]]; !ok {
			fmt.Fprintf(stderr, "exactly help: unknown command %q\n\n", args[1])
			usage(stderr, cmds)
			return 2
		}
		args = []string{args[1], "-h"}
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "exactly: unknown command %q\n\n", args[0])
		usage(stderr, cmds)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmd.run(ctx, args[1:], stdout); err != nil {
		var ue *usageError
		switch {
		case errors.Is(err, flag.ErrHelp):
			return 0 // -h or -help: the command printed its usage
		case errors.As(err, &ue):
			fmt.Fprint(stderr, ue.output)
			return 2
		}
		// Errors of the command's own package may already name it
		// ("status: ..."): name it once.
		msg := strings.TrimPrefix(err.Error(), args[0]+": ")
		fmt.Fprintf(stderr, "exactly %s: %s\n", args[0], msg)
		return 1
	}
	return 0
}

func usage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "usage: exactly <command> [flags]")
	fmt.Fprintln(w)
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w, "\nRun \"exactly help <command>\" (or \"exactly <command> -h\") for a command's flags;\n\"exactly --version\" for the version.")
}
