package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/outbox"
)

// errNoKafkaBrokers is returned by the commands that need Kafka when
// EXACTLY_KAFKA_BROKERS is unset or empty.
var errNoKafkaBrokers = errors.New("EXACTLY_KAFKA_BROKERS is not set: export EXACTLY_KAFKA_BROKERS=host1:9092,host2:9092")

// kafkaBrokers reads the comma-separated EXACTLY_KAFKA_BROKERS. It fails with
// errNoKafkaBrokers when it is unset or names no broker.
func kafkaBrokers() ([]string, error) {
	var out []string
	for _, b := range strings.Split(os.Getenv("EXACTLY_KAFKA_BROKERS"), ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return nil, errNoKafkaBrokers
	}
	return out, nil
}

// outboxFlags registers -outbox-schema and -outbox-table on fs and returns a
// function building the configured Outbox after parsing.
func outboxFlags(fs *flag.FlagSet) func() *outbox.Outbox {
	schema := fs.String("outbox-schema", "", "schema of the outbox table (empty: the search_path)")
	table := fs.String("outbox-table", outbox.DefaultTable, "name of the outbox table")
	return func() *outbox.Outbox { return outbox.New(outbox.WithTable(*schema, *table)) }
}

// shardsOf returns the sharded outbox of n tables named after o's table
// (<table>_0 .. <table>_n-1, in o's schema), as outbox.NewSharded with
// WithTable names them. It fails like NewSharded for a bad n.
func shardsOf(o *outbox.Outbox, n int, opts ...outbox.Option) (*outbox.Sharded, error) {
	base := o.Table()
	schema, table := "", base[len(base)-1]
	if len(base) == 2 {
		schema = base[0]
	}
	return outbox.NewSharded(n, append([]outbox.Option{outbox.WithTable(schema, table)}, opts...)...)
}

// runRelay runs the outbox relay for DATABASE_URL's outbox table, publishing
// to EXACTLY_KAFKA_BROKERS, until interrupted. Several may run; one is
// active. It fails on bad flags or when either variable is unset or the
// database cannot be reached at start; later errors are logged and retried.
func runRelay(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	fs.SetOutput(stdout)
	ob := outboxFlags(fs)
	batch := fs.Int("batch", outbox.DefaultBatchSize, "rows published per batch")
	poll := fs.Duration("poll", outbox.DefaultPollInterval, "poll interval when no notification arrives")
	takeover := fs.Duration("takeover", outbox.DefaultTakeoverInterval, "how often a standby relay tries to become active")
	maxRecord := fs.Int("max-record-bytes", outbox.DefaultMaxRecordBytes, "largest record produced (the producer batch limit is this plus 61, Kafka's default message.max.bytes by default); larger rows are parked")
	shards := fs.Int("shards", 1, "relay a sharded outbox of this many tables (<outbox-table>_0 .. _N-1, outbox.NewSharded); 1: the single table")
	wal := fs.Bool("wal", false, "experimental: relay the WAL outbox (outbox.NewWAL) through logical replication instead of a table; needs wal_level=logical and a role with REPLICATION")
	walSlot := fs.String("wal-slot", outbox.DefaultWALSlot, "with -wal: the logical replication slot (created when absent; drop it when retiring the relay)")
	walPrefix := fs.String("wal-prefix", outbox.DefaultWALPrefix, "with -wal: the logical decoding message prefix the writers use")
	walPub := fs.String("wal-publication", outbox.DefaultWALPublication, "with -wal: the publication pgoutput is started with (created, empty, when absent)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: exactly relay [flags]\n\nPublishes the outbox table on DATABASE_URL to EXACTLY_KAFKA_BROKERS until\ninterrupted. Run several for availability: one is active (it holds the table's\nlease in exactly_relay_lease), the others stand by. Behind a transaction-mode\npooler, set EXACTLY_LISTEN_DATABASE_URL to a direct connection to LISTEN on\n(else the relay polls every -poll).\nRows it can never publish are parked (see \"exactly outbox\").\n-shards N relays N tables (one active relay per table); -wal relays the WAL\noutbox instead (docs/scaling.md).\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return fmt.Errorf("parsing flags: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *batch <= 0 || *poll <= 0 || *takeover <= 0 || *maxRecord <= 0 {
		return fmt.Errorf("-batch, -poll, -takeover and -max-record-bytes must be positive")
	}
	if *shards < 1 || *shards > outbox.MaxShards {
		return fmt.Errorf("-shards %d: want 1..%d", *shards, outbox.MaxShards)
	}
	if *wal && *shards != 1 {
		return errors.New("-wal and -shards exclude each other: the WAL relay has no tables to shard")
	}
	brokers, err := kafkaBrokers()
	if err != nil {
		return err
	}
	// SASL and TLS come from the same variables as the consumer's.
	cfg, err := consumer.ConfigFromEnv(ctx)
	if err != nil {
		return err
	}
	kopts, err := cfg.KafkaOptions()
	if err != nil {
		return err
	}
	if *wal {
		dbURL := os.Getenv("DATABASE_URL")
		if dbURL == "" {
			return errNoDatabaseURL
		}
		relay, err := outbox.NewWALRelay(brokers, outbox.WALRelayConfig{
			ConnString: dbURL, Prefix: *walPrefix, Slot: *walSlot, Publication: *walPub,
			KafkaOptions: kopts, BatchSize: *batch, MaxRecordBytes: *maxRecord, TakeoverInterval: *takeover, Logger: slog.Default(),
		})
		if err != nil {
			return err
		}
		defer relay.Close()
		slog.Info("outbox WAL relay starting", "slot", *walSlot, "prefix", *walPrefix, "brokers", brokers)
		return relay.Run(ctx)
	}
	pool, err := poolFromDatabaseURL(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	relayCfg := outbox.RelayConfig{
		KafkaOptions:     kopts,
		BatchSize:        *batch,
		PollInterval:     *poll,
		TakeoverInterval: *takeover,
		MaxRecordBytes:   *maxRecord,
		ListenConnString: cfg.ListenDatabaseURL,
		Logger:           slog.Default(),
	}
	if *shards > 1 {
		sharded, err := shardsOf(ob(), *shards, outbox.WithMaxRecordBytes(*maxRecord))
		if err != nil {
			return err
		}
		base := ob().Table()
		relay, err := outbox.NewShardedRelay(pool, brokers, sharded, relayCfg)
		if err != nil {
			return err
		}
		defer relay.Close()
		slog.Info("sharded outbox relay starting", "tables", base.Sanitize()+"_0.."+fmt.Sprint(*shards-1), "brokers", brokers)
		return relay.Run(ctx)
	}
	relay, err := outbox.NewRelay(pool, brokers, outbox.RelayConfig{
		KafkaOptions:     kopts,
		Outbox:           ob(),
		BatchSize:        *batch,
		PollInterval:     *poll,
		TakeoverInterval: *takeover,
		MaxRecordBytes:   *maxRecord,
		ListenConnString: cfg.ListenDatabaseURL,
		Logger:           slog.Default(),
	})
	if err != nil {
		return err
	}
	defer relay.Close()
	slog.Info("outbox relay starting", "table", ob().Table().Sanitize(), "brokers", brokers)
	return relay.Run(ctx)
}

// parseTimeFlag parses an RFC 3339 time, or a duration meaning that long
// ago; "" is the zero time.
func parseTimeFlag(name, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("-%s %q: want an RFC 3339 time (2026-01-02T15:04:05Z) or a duration ago (24h)", name, v)
}
