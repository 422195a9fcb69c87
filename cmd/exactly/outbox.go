package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
	"github.com/exactly-go/exactly/outbox"
)

// outboxUsage is the help text of "exactly outbox".
const outboxUsage = `usage: exactly outbox <parked|retry|drop> [flags]

Rows the relay can never publish as they are (over the topic's size limit, an
illegal or forbidden topic, a policy violation) are parked: each holds only
the later rows of its own (topic, key); everything else keeps flowing.

  parked [-topic T] [-key K]          list parked rows, their reasons and the rows held behind them
  retry  [-topic T] [-key K | -all]   release parked rows after a fix: the relay publishes them in order
  drop   [-topic T] [-key K | -id N | -all -yes] [-dry-run]
                                      delete parked rows (never published); say what was dropped;
                                      -all needs -yes; -dry-run lists what would be dropped`

// runOutbox runs "exactly outbox parked|retry|drop" against DATABASE_URL's
// outbox table and prints what it found or did. It fails on an unknown
// subcommand or bad flags (retry and drop need -key, -id or -all, so a
// bare command never touches every parked row), an unset DATABASE_URL or a
// database error.
func runOutbox(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stdout, outboxUsage)
		if len(args) == 0 {
			return errors.New("missing subcommand: parked, retry or drop")
		}
		return nil
	}
	sub := args[0]
	if sub != "parked" && sub != "retry" && sub != "drop" {
		return fmt.Errorf("unknown subcommand %q: want parked, retry or drop", sub)
	}
	fs := flag.NewFlagSet("outbox "+sub, flag.ContinueOnError)
	fs.SetOutput(stdout)
	ob := outboxFlags(fs)
	topic := fs.String("topic", "", "only rows of this topic")
	key := fs.String("key", "", "only rows with exactly this key")
	var id *int64
	var all, yes, dryRun *bool
	if sub != "parked" {
		all = fs.Bool("all", false, "every parked row (of -topic, when given)")
	}
	if sub == "drop" {
		id = fs.Int64("id", 0, "only the row with this outbox id")
		yes = fs.Bool("yes", false, "confirm -all: drop every parked row (of -topic, when given)")
		dryRun = fs.Bool("dry-run", false, "list the rows that would be dropped; drop nothing")
	}
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), outboxUsage+"\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args[1:], stdout); err != nil {
		return fmt.Errorf("parsing flags: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var f outbox.ParkFilter
	f.Topic = *topic
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "key" {
			f.Key = []byte(*key)
		}
	})
	if id != nil {
		f.ID = *id
	}
	if all != nil {
		selected := f.Key != nil || f.ID != 0
		if selected == *all {
			return fmt.Errorf("outbox %s: give exactly one of -key, -id (drop only) or -all", sub)
		}
	}
	if sub == "drop" && *all && !*yes && !*dryRun {
		return errors.New("outbox drop -all deletes every parked row (of -topic, when given) for good: add -yes to confirm, or -dry-run to list them first")
	}
	pool, err := poolFromDatabaseURL(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	o := ob()
	var rows []outbox.Parked
	switch sub {
	case "parked":
		rows, err = o.Parked(ctx, pool, f)
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			fmt.Fprintln(stdout, "no parked rows")
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tTOPIC\tKEY\tHELD\tBYTES\tPARKED\tREASON")
		for _, p := range rows {
			fmt.Fprintf(tw, "%d\t%q\t%s\t%d\t%d\t%s\t%s\n", p.ID, p.Topic, printableKey(p.Key), p.Held, p.Bytes,
				p.ParkedAt.UTC().Format(time.RFC3339), status.ShowError(p.Reason))
		}
		return tw.Flush()
	case "retry":
		rows, err = o.Retry(ctx, pool, f)
	case "drop":
		if *dryRun {
			if rows, err = o.Parked(ctx, pool, f); err != nil {
				return err
			}
			fmt.Fprintln(stdout, summarizeParked("would drop", rows))
			for _, p := range rows {
				fmt.Fprintf(stdout, "  id %d  topic %q  key %s  held %d  parked %s  reason %s\n", p.ID, p.Topic, printableKey(p.Key), p.Held,
					p.ParkedAt.UTC().Format(time.RFC3339), status.ShowError(p.Reason))
			}
			return nil
		}
		rows, err = o.Drop(ctx, pool, f)
	}
	if err != nil {
		return err
	}
	verb := map[string]string{"retry": "released", "drop": "dropped"}[sub]
	fmt.Fprintln(stdout, summarizeParked(verb, rows))
	return nil
}

// summarizeParked says what a retry or drop did: the count, the topics, the
// keys and the ids (message ids too, for a drop's audit trail).
func summarizeParked(verb string, rows []outbox.Parked) string {
	if len(rows) == 0 {
		return verb + " 0 parked rows (none matched)"
	}
	topics, keys := map[string]bool{}, map[string]bool{}
	var ids, msgIDs []string
	for _, p := range rows {
		topics[p.Topic] = true
		keys[printableKey(p.Key)] = true
		ids = append(ids, strconv.FormatInt(p.ID, 10))
		msgIDs = append(msgIDs, p.MessageID)
	}
	return fmt.Sprintf("%s %d parked rows; topics: %s; keys: %s; ids: %s; message ids: %s",
		verb, len(rows), joinSorted(topics), joinSorted(keys), strings.Join(ids, ","), strings.Join(msgIDs, ","))
}

func joinSorted(set map[string]bool) string {
	out := make([]string, 0, len(set))
	for s := range set {
		out = append(out, s)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// printableKey shows a key as status.ShowKey does (quoted text, or
// hex:… unquoted; bounded), and "(none)" for a keyless row.
func printableKey(k []byte) string {
	if k == nil {
		return "(none)"
	}
	return status.ShowKey(k)
}
