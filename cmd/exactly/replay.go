package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/deadletters"
	"github.com/exactly-go/exactly/outbox"
)

// runReplay re-publishes dead letters from a dead-letter topic on
// EXACTLY_KAFKA_BROKERS to their original topics, filtered by key, time and
// count, and prints how many it replayed (with -dry-run, lists each it
// would replay: key, original coordinates, error). It fails on bad flags, an unset
// EXACTLY_KAFKA_BROKERS, a missing topic or a broker error.
func runReplay(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stdout)
	topic := fs.String("topic", "", "dead-letter topic to read (required), e.g. orders.dlq")
	key := fs.String("key", "", "replay only records with this key")
	since := fs.String("since", "", "replay only records dead-lettered at or after this time (RFC 3339, or a duration ago such as 24h)")
	until := fs.String("until", "", "replay only records dead-lettered before this time (RFC 3339, or a duration ago)")
	limit := fs.Int("limit", 0, "replay at most this many records (0: no limit)")
	dryRun := fs.Bool("dry-run", false, "list and count what would be replayed (key, original coordinates, error), publish nothing")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: exactly replay -topic T.dlq [flags]\n\nRe-publishes dead letters to their original topics with their original key,\nvalue and headers (minus the exactly-* dead-letter headers).\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return fmt.Errorf("parsing flags: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *topic == "" {
		return fmt.Errorf("-topic is required")
	}
	if *limit < 0 {
		return fmt.Errorf("-limit must not be negative")
	}
	now := time.Now()
	opts := outbox.ReplayOptions{Topic: *topic, Limit: *limit, DryRun: *dryRun}
	var err error
	if opts.Since, err = parseTimeFlag("since", *since, now); err != nil {
		return err
	}
	if opts.Until, err = parseTimeFlag("until", *until, now); err != nil {
		return err
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "key" {
			opts.Key = []byte(*key)
		}
	})
	if *dryRun {
		opts.Selected = func(rec *kgo.Record) {
			l := deadletters.FromRecord(rec)
			fmt.Fprintf(stdout, "would replay %q/%d@%d  key %q  (from %s)  dead-lettered %s  error %s\n",
				l.Topic, l.Partition, l.Offset, l.Key, coordinates(l), l.At.Format(time.RFC3339), letterError(l))
		}
	}
	brokers, err := kafkaBrokers()
	if err != nil {
		return err
	}
	res, err := outbox.Replay(ctx, brokers, opts)
	verb := "replayed"
	if *dryRun {
		verb = "would replay"
	}
	fmt.Fprintf(stdout, "%s %d of %d dead letters from %s (%d filtered out, %d without an original topic)\n",
		verb, res.Replayed, res.Read, *topic, res.Filtered, res.Invalid)
	if res.Truncated > 0 {
		fmt.Fprintf(stdout, "refused %d truncated dead letters (header %s=true): they were too large to keep whole; recover each from its original topic, partition and offset (headers %s, %s, %s; SHA-256 in %s)\n",
			res.Truncated, outbox.HeaderTruncated, outbox.HeaderOriginalTopic, outbox.HeaderOriginalPartition, outbox.HeaderOriginalOffset, outbox.HeaderOriginalSHA256)
	}
	if res.Held > 0 {
		fmt.Fprintf(stdout, "held %d later dead letters of those keys, to keep per-key order: replay them (for instance with -since after the truncated one) once the truncated originals are recovered\n",
			res.Held)
	}
	return err
}
