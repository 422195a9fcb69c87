package broker

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Options configures Start. The zero value is a usable configuration: one
// broker on a random 127.0.0.1 port, in memory, topics auto-created with
// kfake's default of 10 partitions.
type Options struct {
	// Port is the TCP port on 127.0.0.1; 0 picks a free one.
	Port int
	// DataDir, when set, persists the broker's state there (kfake.DataDir)
	// and reloads it on the next Start with the same directory. Writes are
	// not fsynced per batch unless Extra holds kfake.SyncWrites().
	DataDir string
	// Partitions is the partition count of auto-created and seeded topics;
	// 0 keeps kfake's default (10).
	Partitions int32
	// Topics are created at start with Partitions partitions.
	Topics []string
	// Logger receives the broker's own messages (kfake's info and debug
	// messages at Debug); nil discards them.
	Logger *slog.Logger
	// Extra options are applied after the ones derived above, so they win.
	Extra []kfake.Opt
}

// Broker is a running embedded Kafka broker.
type Broker struct {
	cluster *kfake.Cluster
	logger  *slog.Logger
}

// Start starts a single-broker kfake cluster with automatic topic creation.
// ctx only bounds startup: the broker runs until Close. It fails when ctx
// is already done, when the port cannot be bound, or when persisted state
// in DataDir cannot be loaded.
func Start(ctx context.Context, opts Options) (*Broker, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("broker: starting: %w", err)
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	kopts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.AllowAutoTopicCreation(),
		kfake.WithLogger(slogAdapter{logger}),
	}
	if opts.Port != 0 {
		kopts = append(kopts, kfake.Ports(opts.Port))
	}
	if opts.Partitions > 0 {
		kopts = append(kopts, kfake.DefaultNumPartitions(int(opts.Partitions)))
	}
	if len(opts.Topics) > 0 {
		kopts = append(kopts, kfake.SeedTopics(opts.Partitions, opts.Topics...))
	}
	if opts.DataDir != "" {
		kopts = append(kopts, kfake.DataDir(opts.DataDir))
	}
	kopts = append(kopts, opts.Extra...)

	c, err := kfake.NewCluster(kopts...)
	if err != nil {
		return nil, fmt.Errorf("broker: starting kfake (port %d, data dir %q): %w", opts.Port, opts.DataDir, err)
	}
	b := &Broker{cluster: c, logger: logger}
	logger.Info("broker: started", "addrs", c.ListenAddrs(), "data_dir", opts.DataDir, "topics", opts.Topics)
	return b, nil
}

// Addrs returns the host:port addresses clients use as seed brokers.
func (b *Broker) Addrs() []string { return b.cluster.ListenAddrs() }

// Cluster returns the underlying kfake cluster, for tests that inject
// failures with its control functions.
func (b *Broker) Cluster() *kfake.Cluster { return b.cluster }

// Close stops the broker, flushing persisted state to DataDir if set.
// Calling it again does nothing.
func (b *Broker) Close() {
	b.cluster.Close()
	b.logger.Info("broker: closed")
}

// slogAdapter forwards kfake's log lines to slog. kfake logs every request
// at info, so its info and debug messages go to slog's Debug.
type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Logf(level kfake.LogLevel, format string, args ...any) {
	var lvl slog.Level
	switch level {
	case kfake.LogLevelNone:
		return
	case kfake.LogLevelError:
		lvl = slog.LevelError
	case kfake.LogLevelWarn:
		lvl = slog.LevelWarn
	default:
		lvl = slog.LevelDebug
	}
	if !a.l.Enabled(context.Background(), lvl) {
		return
	}
	a.l.Log(context.Background(), lvl, "kfake: "+fmt.Sprintf(format, args...))
}
