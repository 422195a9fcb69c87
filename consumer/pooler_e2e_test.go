package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/internal/testenv/pgbouncer"
	"github.com/exactly-go/exactly/outbox"
)

// logLine is one log record of one service instance.
type logLine struct {
	instance string
	level    slog.Level
	text     string // the message and its attributes, "k=v" joined by spaces
}

// logBook records the log lines of several instances in the order they
// were logged.
type logBook struct {
	mu    sync.Mutex
	lines []logLine
}

func (b *logBook) logger(instance string) *slog.Logger {
	return slog.New(&bookHandler{b: b, instance: instance})
}

func (b *logBook) snapshot() []logLine {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]logLine(nil), b.lines...)
}

type bookHandler struct {
	b        *logBook
	instance string
	attrs    []slog.Attr
}

func (h *bookHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (h *bookHandler) Handle(_ context.Context, r slog.Record) error {
	var s strings.Builder
	s.WriteString(r.Message)
	for _, a := range h.attrs {
		s.WriteString(" " + a.Key + "=" + a.Value.String())
	}
	r.Attrs(func(a slog.Attr) bool { s.WriteString(" " + a.Key + "=" + a.Value.String()); return true })
	h.b.mu.Lock()
	h.b.lines = append(h.b.lines, logLine{h.instance, r.Level, s.String()})
	h.b.mu.Unlock()
	return nil
}
func (h *bookHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &bookHandler{b: h.b, instance: h.instance, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}
func (h *bookHandler) WithGroup(string) slog.Handler { return h }

// TestEndToEndThroughTransactionPooler runs the real parts through PgBouncer
// 1.18 in transaction mode, in each query exec mode that works there: two
// consumer.Service instances of one group (so two relays, relay leadership
// being a lease, and two pruners), 5,000 credit records. Every record
// becomes one ledger row; every outbox row is published once (as many
// distinct message ids as records a read_committed consumer sees); at most
// one relay is active at any moment (in the order the relays log it);
// neither pruner fails or warns (its exclusion is a transaction-scoped
// lock) and nothing else is logged as an error; and 200 of 200 fresh
// transactions of another
// client of the pooler, run while the services work, see
// synchronous_commit on (no session setting is left on a server
// connection).
func TestEndToEndThroughTransactionPooler(t *testing.T) {
	for _, mode := range []struct {
		name string
		mode pgx.QueryExecMode
	}{{"simple_protocol", pgx.QueryExecModeSimpleProtocol}, {"exec", pgx.QueryExecModeExec}} {
		t.Run(mode.name, func(t *testing.T) { endToEndPooled(t, mode.mode) })
	}
}

func endToEndPooled(t *testing.T, mode pgx.QueryExecMode) {
	const records, partitions, fresh = 5000, 6, 200
	ctx := context.Background()
	b := pgbouncer.New(t, pgbouncer.Options{Upstream: os.Getenv(testenv.EnvDatabaseURL), DefaultPoolSize: 12})
	direct := testenv.DBURL(t)
	pooled := b.Through(direct)
	check := modePool(t, direct, pgx.QueryExecModeCacheStatement, 4) // the test's own reads, direct
	kc := testenv.Kafka(t, partitions, "credits", "credited")
	brokers := testenv.Brokers(kc)
	book := &logBook{}
	o := newOutcomes()
	var svcs []*consumer.Service
	for _, name := range []string{"a", "b"} {
		svc, err := consumer.NewService(testConfig(brokers, "pooled", "credits"), modePool(t, pooled, mode, consumer.PoolConns(partitions)),
			consumer.Handle(creditEmitter(nil)), consumer.WithHooks(o.hooks()), consumer.WithLogger(book.logger(name)))
		if err != nil {
			t.Fatal(err)
		}
		svcs = append(svcs, svc)
	}
	other := modePool(t, pooled, mode, 4)
	setupLedger(t, other)
	if err := svcs[0].Migrate(ctx); err != nil {
		t.Fatalf("Migrate through the pooler: %v", err)
	}
	produceCopies(t, brokers, "credits", records, 1, partitions)
	var stops []func() error
	for _, svc := range svcs {
		stops = append(stops, runService(t, svc))
	}

	// Another client's fresh transactions, while the services consume and
	// publish: each sees the server's synchronous_commit.
	o.await(t, 60*time.Second, "the first records applied", func() bool { return o.get("applied") > 0 })
	var mu sync.Mutex
	on := 0
	var g errgroup.Group
	for w := range 4 {
		g.Go(func() error {
			for range fresh / 4 {
				err := pgx.BeginFunc(ctx, other, func(tx pgx.Tx) error {
					var s string
					if err := tx.QueryRow(ctx, "show synchronous_commit").Scan(&s); err != nil {
						return err
					}
					mu.Lock()
					defer mu.Unlock()
					if s == "on" {
						on++
					}
					return nil
				})
				if err != nil {
					return fmt.Errorf("fresh transaction of client %d: %w", w, err)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if on != fresh {
		t.Errorf("%d of %d fresh transactions of another client saw synchronous_commit on", on, fresh)
	}

	o.await(t, 90*time.Second, "every record applied", func() bool { return o.get("applied") == records })
	if got := count(t, check, `select count(distinct order_id) from ledger`); got != records {
		t.Errorf("%d distinct orders in the ledger, want %d", got, records)
	}
	if got := count(t, check, `select count(*) from ledger`); got != records {
		t.Errorf("%d ledger rows, want %d", got, records)
	}
	o.await(t, 60*time.Second, "the outbox drained", func() bool {
		return count(t, check, `select count(*) from exactly_outbox`) == 0
	})
	for i, stop := range stops {
		if err := stop(); err != nil {
			t.Errorf("service %d: Run = %v", i, err)
		}
	}

	published, ids := readCommitted(t, brokers, "credited", partitions)
	if published != records || ids != records {
		t.Errorf("%d records published with %d distinct message ids, want %d of each (each outbox row once)", published, ids, records)
	}

	lines := book.snapshot()
	active := ""
	activations := 0
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l.text, "outbox relay active"):
			if active != "" {
				t.Errorf("relay %s active while relay %s is (log order): %s", l.instance, active, l.text)
			}
			active = l.instance
			activations++
		case strings.HasPrefix(l.text, "outbox relay inactive") && active == l.instance:
			active = ""
		case strings.Contains(l.text, "prune"):
			if l.level >= slog.LevelWarn {
				t.Errorf("pruner of %s: %s", l.instance, l.text)
			}
		case l.level >= slog.LevelError:
			t.Errorf("error logged by %s: %s", l.instance, l.text)
		}
	}
	if activations == 0 {
		t.Error("no relay logged that it became active")
	}
}

// readCommitted reads topic from its start with read_committed isolation
// (what a relay fenced mid-transaction aborted is not seen), up to a
// sentinel it produces to each of the topic's partitions, and returns how
// many records came before the sentinels and how many distinct message
// ids they carry.
func readCommitted(t *testing.T, brokers []string, topic string, partitions int32) (records, ids int) {
	t.Helper()
	var sentinels []*kgo.Record
	for p := range partitions {
		sentinels = append(sentinels, &kgo.Record{Topic: topic, Partition: p, Headers: []kgo.RecordHeader{{Key: "sentinel"}}})
	}
	produceManual(t, brokers, sentinels...)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	seen := map[string]bool{}
	done := map[int32]bool{}
	for len(done) < int(partitions) {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s: sentinels of %d of %d partitions seen after %d records", topic, len(done), partitions, records)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if len(r.Headers) > 0 && r.Headers[0].Key == "sentinel" {
				done[r.Partition] = true
				return
			}
			if done[r.Partition] {
				return
			}
			records++
			for _, h := range r.Headers {
				if h.Key == outbox.HeaderMessageID {
					seen[string(h.Value)] = true
				}
			}
		})
	}
	return records, len(seen)
}
