package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
)

// runInspect prints what is known of one key, a guard key (credit:order-1)
// or a Kafka key (order-1), saying which it matched: its guard rows (state,
// commit time, handler, partition and offset, trace id with a Jaeger link
// when EXACTLY_JAEGER_URL is set, dead-letter mark), the outbox rows still
// pending or parked under the matching Kafka key and, when
// EXACTLY_KAFKA_BROKERS is set, every dead letter of the key. It fails on
// bad flags, a missing key, an unset DATABASE_URL, bad Kafka variables or a
// database error. Finding nothing is not an error: it says so.
func runInspect(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	fs.SetOutput(stdout)
	guard := guardFlags(fs)
	ob := outboxFlags(fs)
	scope := fs.String("scope", "", "only the guard row of this scope (default: every scope)")
	outboxKey := fs.String("outbox-key", "", "match outbox rows on this Kafka key instead of KEY")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: exactly inspect [flags] KEY\n\nKEY is a guard key (credit:order-1) or a Kafka key (order-1: the guard keys\nending in \":order-1\"); the output says which it matched. Shows the guard rows\nand the outbox rows pending or parked for it on DATABASE_URL and, when\nEXACTLY_KAFKA_BROKERS is set, every dead letter of the key.\nEXACTLY_JAEGER_URL (e.g. http://localhost:16686) adds trace links.\n\nFlags:")
		fs.PrintDefaults()
	}
	// Flags may follow the key: exactly inspect credit:order-1 -scope credit.
	var key string
	rest := args
	for {
		if err := parseFlags(fs, rest, stdout); err != nil {
			return fmt.Errorf("parsing flags: %w", err)
		}
		if fs.NArg() == 0 {
			break
		}
		if key != "" {
			return fmt.Errorf("one KEY expected, got %q and %q", key, fs.Arg(0))
		}
		key, rest = fs.Arg(0), fs.Args()[1:]
	}
	if key == "" {
		fs.Usage()
		return errors.New("missing KEY")
	}
	env, err := openStatusEnv(ctx, false)
	if err != nil {
		return err
	}
	defer env.close()
	cfg := env.cfg
	cfg.Guard, cfg.Outbox = guard(), ob()
	opts := status.InspectOptions{Scope: *scope, JaegerURL: os.Getenv("EXACTLY_JAEGER_URL")}
	if *outboxKey != "" {
		opts.OutboxKey = []byte(*outboxKey)
	}
	if _, err := kafkaBrokers(); err == nil {
		cl, _, suffix, err := kafkaClient(ctx)
		if err != nil {
			return err
		}
		defer cl.Close()
		opts.Kafka, cfg.DeadLetterSuffix = cl, suffix
	}
	rep, err := status.Inspect(ctx, cfg, key, opts)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, rep)
	}
	printInspect(stdout, rep, cfg)
	return nil
}

func printInspect(w io.Writer, rep *status.KeyReport, cfg status.Config) {
	where := "in any scope"
	if rep.Scope != "" {
		where = fmt.Sprintf("in scope %q", rep.Scope)
	}
	fmt.Fprintf(w, "key %q %s, guard table %s:\n", rep.Key, where, cfg.Guard.Table().Sanitize())
	switch rep.Matched {
	case status.MatchedGuardKey:
		fmt.Fprintln(w, "  matched as a guard key")
	case status.MatchedKafkaKey:
		fmt.Fprintf(w, "  matched as a Kafka key: no guard key %q, the guard keys ending in %q\n", rep.Key, ":"+rep.Key)
	default:
		fmt.Fprintf(w, "  no guard row: not applied (or pruned after retention); no guard key is %q or ends in %q\n", rep.Key, ":"+rep.Key)
	}
	for _, g := range rep.Guard {
		state := g.State
		if state == "" {
			state = "applied"
		}
		if g.DeadLettered() {
			state = "DEAD-LETTERED (its record went to the dead-letter topic)"
		}
		fmt.Fprintf(w, "  scope %q: %s, committed at %s\n", g.Scope, state, g.ProcessedAt.UTC().Format(time.RFC3339Nano))
		if g.Key != rep.Key {
			fmt.Fprintf(w, "    guard key %q\n", g.Key)
		}
		if g.Handler != "" {
			fmt.Fprintf(w, "    handler %q\n", g.Handler)
		}
		if g.Topic != "" || g.Partition != nil {
			fmt.Fprintf(w, "    record %q partition %s offset %s\n", g.Topic, optInt(g.Partition), optInt(g.Offset))
		}
		if g.TraceID != "" {
			fmt.Fprintf(w, "    trace id %s\n", g.TraceID)
			if g.TraceURL != "" {
				fmt.Fprintf(w, "    trace: %s\n", g.TraceURL)
			} else {
				fmt.Fprintln(w, "    (set EXACTLY_JAEGER_URL=http://localhost:16686 for a Jaeger link)")
			}
		}
	}
	if len(rep.MissingColumns) > 0 {
		fmt.Fprintf(w, "  (the guard table has no %q columns yet: run exactly migrate for partition, offset, trace id, handler and state)\n", rep.MissingColumns)
	}
	fmt.Fprintf(w, "\noutbox %s, rows with Kafka key %q:\n", cfg.Outbox.Table().Sanitize(), rep.OutboxKey)
	if len(rep.Outbox) == 0 {
		fmt.Fprintln(w, "  none pending or parked (published rows are deleted)")
		if rep.OutboxKey == rep.Key {
			fmt.Fprintln(w, "  (a handler often keys its events by something else, e.g. the account: pass -outbox-key)")
		}
	}
	for _, o := range rep.Outbox {
		state := o.State()
		switch {
		case o.Parked:
			state = fmt.Sprintf("PARKED (reason %q, %d rows held behind it)", o.Reason, o.HeldBehind)
		case o.Held:
			state = "HELD behind a parked row"
		}
		fmt.Fprintf(w, "  id %d  topic %q  %s  size %d B  age %v\n", o.ID, o.Topic, state, o.Size, o.Age)
	}
	if !rep.OutboxParkedKnown {
		fmt.Fprintln(w, "  (the outbox has no parked column yet: every row shown is pending)")
	}
	printKeyHeld(w, rep)
	printKeyEffects(w, rep, cfg)
	printKeyDeadLetters(w, rep)
}

// printKeyEffects writes the key's recorded external-call results.
func printKeyEffects(w io.Writer, rep *status.KeyReport, cfg status.Config) {
	switch {
	case !rep.EffectsKnown:
		fmt.Fprintln(w, "\neffects: n/a (no effects table: run exactly migrate)")
		return
	case len(rep.Effects) == 0:
		fmt.Fprintf(w, "\neffects %s: no external call recorded for the key\n", cfg.Guard.EffectsTable().Sanitize())
		return
	}
	fmt.Fprintf(w, "\neffects %s:\n", cfg.Guard.EffectsTable().Sanitize())
	for _, e := range rep.Effects {
		switch e.State {
		case "done":
			fmt.Fprintf(w, "  scope %q key %q: recorded result %s (attempts %d)\n", e.Scope, e.Key, e.Result, e.Attempts)
		default:
			fmt.Fprintf(w, "  scope %q key %q: %s, outcome not known yet (attempts %d)\n", e.Scope, e.Key, e.State, e.Attempts)
		}
	}
}

// printKeyHeld writes the key's records a consumer holds after a failed
// attempt.
func printKeyHeld(w io.Writer, rep *status.KeyReport) {
	switch {
	case !rep.HeldKnown:
		fmt.Fprintln(w, "\nheld: n/a (no held table: run exactly migrate)")
		return
	case len(rep.Held) == 0:
		fmt.Fprintln(w, "\nheld: no record of the key is held by a consumer")
		return
	}
	for _, h := range rep.Held {
		retry := "due now"
		if h.RetryIn > 0 {
			retry = "in " + h.RetryIn.Round(time.Millisecond).String()
		}
		if h.Attempts == 0 {
			// A slow pre-transaction call, listed while it runs.
			fmt.Fprintf(w, "\nHELD: record %q partition %d offset %d (group %q, handler %q, key %q): its call is still running, listed for %v; its deadline %s\n",
				h.Topic, h.Partition, h.Offset, h.Group, h.Handler, h.KeyText(), h.HeldFor.Round(time.Second), retry)
			fmt.Fprintf(w, "  %q\n", h.LastError)
			continue
		}
		fmt.Fprintf(w, "\nHELD: record %q partition %d offset %d (group %q, handler %q, key %q) failed %d attempts; held for %v, next attempt %s\n",
			h.Topic, h.Partition, h.Offset, h.Group, h.Handler, h.KeyText(), h.Attempts, h.HeldFor.Round(time.Second), retry)
		fmt.Fprintf(w, "  last error: %q\n", h.LastError)
	}
}

// printKeyDeadLetters writes the dead letters Inspect found for the key.
func printKeyDeadLetters(w io.Writer, rep *status.KeyReport) {
	switch {
	case rep.DeadLetterError != "":
		fmt.Fprintf(w, "\ndead letters: could not read them: %s\n", rep.DeadLetterError)
		return
	case rep.DeadLetters == nil:
		fmt.Fprintln(w, "\ndead letters: not read (set EXACTLY_KAFKA_BROKERS to list the key's dead letters)")
		return
	}
	fmt.Fprintf(w, "\ndead letters with Kafka key %q (or a guard row's coordinates): %d\n", rep.DeadLetterKeys, len(rep.DeadLetters))
	for _, l := range rep.DeadLetters {
		fmt.Fprintf(w, "  %s  %q/%d@%d  key %q  from %s  attempts %s  handler %q  error %s%s\n",
			l.At.UTC().Format(time.RFC3339Nano), l.Topic, l.Partition, l.Offset, l.Key, coordinates(l), optInt(l.Attempts), l.Handler, letterError(l), traceNote(l.TraceURL))
	}
}

func optInt(p *int64) string {
	if p == nil {
		return "?"
	}
	return fmt.Sprint(*p)
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding JSON: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
