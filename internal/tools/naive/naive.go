// Package naive is the consumer a team writes without exactly: a franz-go
// group member that runs one PostgreSQL transaction per record, with no
// guard, and commits offsets after each poll. The demo and the benchmark
// run it side by side with exactly; it is correct only when nothing is ever
// delivered twice.
package naive

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ApplyFunc is the effect of one record, inside its transaction.
type ApplyFunc func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error

// Config is a naive consumer.
type Config struct {
	Brokers []string
	Group   string
	Topics  []string
	Pool    *pgxpool.Pool
	Apply   ApplyFunc
	// OnRecord, when set, runs after each record's commit.
	OnRecord func(rec *kgo.Record)
	Logger   *slog.Logger
	// KafkaOptions are extra franz-go client options (the benchmark's
	// hooks).
	KafkaOptions []kgo.Opt
}

// Run consumes until ctx ends. A failing record is logged and skipped, as
// hand-written loops often do. It fails when the client cannot be created.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	cl, err := kgo.NewClient(append(cfg.KafkaOptions,
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)...)
	if err != nil {
		return fmt.Errorf("naive: creating client: %w", err)
	}
	defer cl.Close()
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if fetches.IsClientClosed() {
			return nil
		}
		fetches.EachRecord(func(rec *kgo.Record) {
			err := pgx.BeginFunc(ctx, cfg.Pool, func(tx pgx.Tx) error { return cfg.Apply(ctx, tx, rec) })
			if err != nil {
				log.Error("naive: record failed", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "error", err)
				return
			}
			if cfg.OnRecord != nil {
				cfg.OnRecord(rec)
			}
		})
		if err := cl.CommitUncommittedOffsets(ctx); err != nil && ctx.Err() == nil {
			log.Warn("naive: committing offsets", "error", err)
		}
	}
}
