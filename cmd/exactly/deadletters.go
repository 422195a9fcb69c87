package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/exactly-go/exactly/cmd/exactly/internal/deadletters"
	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
)

// runDeadletters lists the latest dead letters of each dead-letter topic on
// EXACTLY_KAFKA_BROKERS (every topic ending in the consumer's dead-letter
// suffix, or -topic): reason, key, original topic, partition and offset,
// attempts and time, from the records' headers. It only reads. It fails on
// bad flags, an unset EXACTLY_KAFKA_BROKERS, a missing -topic or a broker
// error.
func runDeadletters(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("deadletters", flag.ContinueOnError)
	fs.SetOutput(stdout)
	topic := fs.String("topic", "", "only this dead-letter topic (default: every topic ending in EXACTLY_DEAD_LETTER_SUFFIX, .dlq)")
	n := fs.Int("n", deadletters.DefaultLatest, "the latest N dead letters of each topic (0: all)")
	key := fs.String("key", "", "only dead letters with this Kafka key (reads each topic whole)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: exactly deadletters [flags]\n\nLists the latest dead letters of each dead-letter topic on EXACTLY_KAFKA_BROKERS:\nwhen, key, original topic/partition/offset, attempts, handler and error, from\nthe headers the consumer wrote. Reads only; exactly replay republishes them.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return fmt.Errorf("parsing flags: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *n < 0 {
		return fmt.Errorf("-n must not be negative")
	}
	opts := deadletters.Options{Latest: *n}
	if *n == 0 {
		opts.Latest = -1
	}
	if *topic != "" {
		opts.Topics = []string{*topic}
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "key" {
			k := *key
			opts.Match = func(l deadletters.Letter) bool { return l.RawKey != nil && string(l.RawKey) == k }
		}
	})
	cl, _, suffix, err := kafkaClient(ctx)
	if err != nil {
		return err
	}
	defer cl.Close()
	opts.Suffix = suffix
	topics, err := deadletters.Read(ctx, cl, opts)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, topics)
	}
	if len(topics) == 0 {
		fmt.Fprintf(stdout, "no dead-letter topics (topics ending in %q)\n", opts.Suffix)
		return nil
	}
	for i, t := range topics {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		printLetters(stdout, t)
	}
	return nil
}

// printLetters writes one topic's dead letters as a table. Topics and
// handlers are printed with %q and errors quoted (status.ShowError), so
// that control characters cannot forge lines; keys as status.ShowKey
// prints them: text quoted, other bytes as hex:… unquoted (never taken for
// one another), both bounded like the logs' keys, so that one long key
// does not widen every row.
func printLetters(w io.Writer, t deadletters.Topic) {
	fmt.Fprintf(w, "%q: %d records, showing %d\n", t.Topic, t.Records, len(t.Letters))
	if len(t.Letters) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  AT\tKEY\tORIGINAL\tATTEMPTS\tHANDLER\tERROR")
	for _, l := range t.Letters {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%q\t%s\n", l.At.UTC().Format(time.RFC3339), status.ShowKey(l.RawKey),
			coordinates(l), optInt(l.Attempts), l.Handler, letterError(l))
	}
	tw.Flush()
}

// coordinates renders where a dead letter was consumed from:
// "topic/partition@offset", with "?" for what its headers lack.
func coordinates(l deadletters.Letter) string {
	t := l.OriginalTopic
	if t == "" {
		t = "?"
	}
	return fmt.Sprintf("%q/%s@%s", t, optInt(l.OriginalPartition), optInt(l.OriginalOffset))
}

// letterError is the quoted error text, marked when the dead letter was
// truncated.
func letterError(l deadletters.Letter) string {
	e := status.ShowError(l.Error)
	if l.Truncated {
		e = "(TRUNCATED: replay refuses it) " + e
	}
	return strings.TrimSpace(e)
}
