package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/handler"
)

// MaxShards bounds NewSharded's n: every shard is a table, a relay
// connection and a Kafka client.
const MaxShards = 256

// Sharded spreads messages over n outbox tables, each relayed by its own
// relay, so publication scales past one relay's ceiling. Build it with
// NewSharded; it is safe for concurrent use.
//
// A keyed message goes to the shard chosen by a stable hash of its (topic,
// key), so every message of one key lands in one table and keeps the
// single-table order guarantee (commit order per key). Keyless messages
// have no order guarantee to keep and are spread round-robin, so a topic
// written mostly without keys still uses every shard (a hash of the topic
// would put its whole load on one relay).
//
// The shard of a key depends on n: changing n moves keys between tables,
// and a key's older rows in its old table may then be published after
// newer rows in its new one. Drain the outbox (Backlog 0, writers stopped)
// before changing n.
type Sharded struct {
	shards []*Outbox
	next   atomic.Uint64 // round-robin cursor for keyless messages
}

// NewSharded returns n outboxes configured by opts whose tables are the
// configured table name (default DefaultTable) suffixed with _0 .. _n-1,
// for example exactly_outbox_0 .. exactly_outbox_3. It fails when n is
// below 1 or above MaxShards.
func NewSharded(n int, opts ...Option) (*Sharded, error) {
	if n < 1 || n > MaxShards {
		return nil, fmt.Errorf("outbox: NewSharded: %d shards, want 1..%d", n, MaxShards)
	}
	base := New(opts...)
	s := &Sharded{shards: make([]*Outbox, n)}
	for i := range n {
		shardOpts := append(append([]Option{}, opts...), WithTable(base.schema, base.name+"_"+strconv.Itoa(i)))
		s.shards[i] = New(shardOpts...)
	}
	return s, nil
}

// Shards returns the shards' outboxes, shard i at index i. The slice is a
// copy; the outboxes are shared.
func (s *Sharded) Shards() []*Outbox { return append([]*Outbox(nil), s.shards...) }

// Shard returns the index of the shard a keyed message of (topic, key)
// goes to: a stable hash of both, modulo the number of shards. For a nil
// key it returns -1: keyless messages are spread round-robin by Add.
func (s *Sharded) Shard(topic string, key []byte) int {
	if key == nil {
		return -1
	}
	return int(uint64(hash64("exactly-outbox-shard", topic, string(key))) % uint64(len(s.shards)))
}

// pick returns the outbox a message goes to.
func (s *Sharded) pick(msg Message) *Outbox {
	if i := s.Shard(msg.Topic, msg.Key); i >= 0 {
		return s.shards[i]
	}
	return s.shards[(s.next.Add(1)-1)%uint64(len(s.shards))]
}

// Add writes msg inside tx to the shard chosen for its key (see Sharded).
// It behaves, and fails, like Outbox.Add on that shard: the row is
// published after tx commits, and never if tx rolls back.
func (s *Sharded) Add(ctx context.Context, tx pgx.Tx, msg Message) error {
	return s.pick(msg).Add(ctx, tx, msg)
}

// AddValue encodes v with codec and adds it like Add. It fails like
// Outbox.AddValue.
func (s *Sharded) AddValue(ctx context.Context, tx pgx.Tx, topic string, key []byte, v any, codec handler.Codec, headers ...handler.Header) error {
	return s.pick(Message{Topic: topic, Key: key}).AddValue(ctx, tx, topic, key, v, codec, headers...)
}

// AddJSON encodes v as JSON and adds it like Add. It fails like
// Outbox.AddValue.
func (s *Sharded) AddJSON(ctx context.Context, tx pgx.Tx, topic string, key []byte, v any, headers ...handler.Header) error {
	return s.AddValue(ctx, tx, topic, key, v, handler.JSON{}, headers...)
}

// Migrate creates or upgrades every shard's table, in shard order. It fails
// with the first shard's error (naming its table); shards before it stay
// migrated, which is harmless: Migrate is idempotent, run it again.
func (s *Sharded) Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	for _, o := range s.shards {
		if err := o.Migrate(ctx, pool); err != nil {
			return err
		}
	}
	return nil
}

// Backlog sums the shards' backlogs and reports the oldest row's age across
// them. It fails with the first shard's error.
func (s *Sharded) Backlog(ctx context.Context, q Querier) (count int64, oldest time.Duration, err error) {
	for _, o := range s.shards {
		n, age, err := o.Backlog(ctx, q)
		if err != nil {
			return 0, 0, err
		}
		count += n
		oldest = max(oldest, age)
	}
	return count, oldest, nil
}

// ShardedRelay runs one Relay per shard of a Sharded outbox. Run several
// (one per service instance) for availability: per shard, exactly one relay
// is active (each shard's table has its own relay lease), so the active
// relays of different shards may live in different processes.
type ShardedRelay struct {
	relays []*Relay
}

// NewShardedRelay returns a relay per shard of s, each configured by cfg
// with cfg.Outbox set to its shard (cfg.Outbox must be nil) and its own
// Kafka client. cfg.Hooks are shared: they run on every shard's goroutine,
// possibly at once, so they must be safe for concurrent use. It fails like
// NewRelay, or when cfg.Outbox is set.
func NewShardedRelay(pool *pgxpool.Pool, brokers []string, s *Sharded, cfg RelayConfig) (*ShardedRelay, error) {
	if s == nil {
		return nil, errors.New("outbox: NewShardedRelay: nil Sharded")
	}
	if cfg.Outbox != nil {
		return nil, errors.New("outbox: NewShardedRelay: RelayConfig.Outbox is set; the shards are the outboxes")
	}
	sr := &ShardedRelay{}
	for i, o := range s.shards {
		c := cfg
		c.Outbox = o
		r, err := NewRelay(pool, brokers, c)
		if err != nil {
			sr.Close()
			return nil, fmt.Errorf("outbox: relay of shard %d: %w", i, err)
		}
		sr.relays = append(sr.relays, r)
	}
	return sr, nil
}

// Run runs every shard's relay (see Relay.Run) until ctx is done, then
// returns nil once all have returned. When one relay's Run returns an error
// (an AfterAck hook stopped it), Run stops the others and returns that
// error.
func (r *ShardedRelay) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(r.relays))
	for i, rl := range r.relays {
		wg.Go(func() {
			if errs[i] = rl.Run(ctx); errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Close closes every shard's relay. Call it after Run has returned.
func (r *ShardedRelay) Close() {
	for _, rl := range r.relays {
		rl.Close()
	}
}
