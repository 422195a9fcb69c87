// Package naive is the consumer a team writes without exactly: franz-go's
// goroutine-per-partition pattern, as in franz-go's own examples
// (examples/goroutine_per_partition_consuming), with one PostgreSQL
// transaction per record. It commits offsets in one of that example's two
// ways: CommitRecords after each slice of a partition's records
// (manual_commit: a synchronous round trip to the broker per slice), or,
// with Config.Marks, MarkCommitRecords after each record's transaction and
// kgo.AutoCommitMarks committing the marks in the background and on revoke
// (autocommit_marks). The demo and the benchmark run it side by side with
// exactly. Whether it is correct when a record is delivered twice depends on
// its ApplyFunc: without a guard row claimed in the record's transaction, a
// redelivery applies the effect again.
package naive

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ApplyFunc is the effect of one record, inside its transaction. An error
// rolls the transaction back.
type ApplyFunc func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error

// Config is a naive consumer.
type Config struct {
	Brokers []string
	Group   string
	Topics  []string
	Pool    *pgxpool.Pool
	Apply   ApplyFunc
	// OnRecord, when set, runs after each record's commit, on the
	// record's partition goroutine.
	OnRecord func(rec *kgo.Record)
	Logger   *slog.Logger
	// KafkaOptions are extra franz-go client options (the benchmark's
	// hooks).
	KafkaOptions []kgo.Opt
	// Marks makes the loop mark each record after its transaction commits
	// and let kgo.AutoCommitMarks commit the marks in the background (and
	// the revoked partitions' marks on revoke), instead of calling
	// CommitRecords after each slice.
	Marks bool
}

// maxPollRecords bounds one poll, as franz-go's example does, so that a
// rebalance is not blocked for long.
const maxPollRecords = 10_000

type tp struct {
	topic     string
	partition int32
}

// partitionWorker runs the transactions of one partition, in order.
type partitionWorker struct {
	quit chan struct{}
	done chan struct{}
	recs chan []*kgo.Record
}

// member is one group member: its partition workers, started when
// partitions are assigned and stopped (after their current slice) when
// they are revoked or lost.
type member struct {
	ctx     context.Context
	cfg     Config
	log     *slog.Logger
	mu      sync.Mutex
	workers map[tp]*partitionWorker
}

// Run consumes until ctx ends. A failing record is logged and skipped, as
// hand-written loops often do; its offset is committed with the rest. Run
// fails when the client cannot be created or a fetch reports an error.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	m := &member{ctx: ctx, cfg: cfg, log: log, workers: make(map[tp]*partitionWorker)}
	opts := append(cfg.KafkaOptions,
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.OnPartitionsAssigned(m.assigned),
		kgo.OnPartitionsLost(m.lost),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if cfg.Marks {
		opts = append(opts, kgo.AutoCommitMarks(), kgo.OnPartitionsRevoked(m.revoked))
	} else {
		opts = append(opts, kgo.DisableAutoCommit(), kgo.OnPartitionsRevoked(m.lost))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("naive: creating client: %w", err)
	}
	defer func() {
		// Close alone would wait for the rebalance this loop blocks
		// between polls.
		cl.CloseAllowingRebalance()
		m.stopAll()
	}()
	for {
		fetches := cl.PollRecords(ctx, maxPollRecords)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return nil
		}
		var ferr error
		fetches.EachError(func(topic string, partition int32, err error) {
			ferr = errors.Join(ferr, fmt.Errorf("naive: fetching %s/%d: %w", topic, partition, err))
		})
		if ferr != nil {
			return ferr
		}
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			m.mu.Lock()
			w := m.workers[tp{p.Topic, p.Partition}]
			m.mu.Unlock()
			if w == nil || len(p.Records) == 0 {
				return
			}
			select {
			case w.recs <- p.Records:
			case <-ctx.Done():
			}
		})
		cl.AllowRebalance()
	}
}

func (m *member) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for topic, partitions := range assigned {
		for _, p := range partitions {
			w := &partitionWorker{quit: make(chan struct{}), done: make(chan struct{}), recs: make(chan []*kgo.Record, 5)}
			m.workers[tp{topic, p}] = w
			go m.consume(cl, w)
		}
	}
}

// lost stops the workers of the partitions and waits for them: each
// commits its own offsets, so a revoked partition's commit succeeds.
func (m *member) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	m.mu.Lock()
	var stopping []*partitionWorker
	for topic, partitions := range lost {
		for _, p := range partitions {
			if w := m.workers[tp{topic, p}]; w != nil {
				delete(m.workers, tp{topic, p})
				close(w.quit)
				stopping = append(stopping, w)
			}
		}
	}
	m.mu.Unlock()
	for _, w := range stopping {
		<-w.done
	}
}

// revoked stops the workers of the partitions, then commits the marks
// they made (Config.Marks): after the callback, the partitions are
// another member's.
func (m *member) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	m.lost(ctx, cl, revoked)
	if err := cl.CommitMarkedOffsets(ctx); err != nil && ctx.Err() == nil {
		m.log.Warn("naive: committing marked offsets on revoke", "error", err)
	}
}

func (m *member) stopAll() {
	all := make(map[string][]int32)
	m.mu.Lock()
	for k := range m.workers {
		all[k.topic] = append(all[k.topic], k.partition)
	}
	m.mu.Unlock()
	m.lost(m.ctx, nil, all)
}

// consume runs one transaction per record of each slice, marking each
// record once its transaction committed (Config.Marks) or committing the
// slice's offsets after it.
func (m *member) consume(cl *kgo.Client, w *partitionWorker) {
	defer close(w.done)
	for {
		select {
		case <-w.quit:
			return
		case recs := <-w.recs:
			for _, rec := range recs {
				err := pgx.BeginFunc(m.ctx, m.cfg.Pool, func(tx pgx.Tx) error { return m.cfg.Apply(m.ctx, tx, rec) })
				if err != nil {
					if m.ctx.Err() != nil {
						return
					}
					m.log.Error("naive: record failed", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "error", err)
					continue
				}
				if m.cfg.Marks {
					cl.MarkCommitRecords(rec)
				}
				if m.cfg.OnRecord != nil {
					m.cfg.OnRecord(rec)
				}
			}
			if m.cfg.Marks {
				continue
			}
			if err := cl.CommitRecords(m.ctx, recs...); err != nil && m.ctx.Err() == nil {
				m.log.Warn("naive: committing offsets", "error", err)
			}
		}
	}
}
