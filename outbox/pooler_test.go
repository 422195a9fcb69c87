package outbox_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/internal/testenv/pgbouncer"
	"github.com/exactly-go/exactly/outbox"
)

// pooledEnv is an env whose pool goes through a private PgBouncer in
// transaction mode (simple protocol, the mode such set-ups use), with the
// direct URL of the same database beside it.
type pooledEnv struct {
	*env
	direct string
}

func setupPooled(t *testing.T, serverConns int, topics ...string) *pooledEnv {
	t.Helper()
	b := pgbouncer.New(t, pgbouncer.Options{Upstream: os.Getenv(testenv.EnvDatabaseURL), DefaultPoolSize: serverConns})
	direct := testenv.DBURL(t)
	cfg, err := pgxpool.ParseConfig(b.Through(direct))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cfg.MaxConns = 8
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob := outbox.New()
	if err := ob.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	k := testenv.Kafka(t, 3, topics...)
	return &pooledEnv{env: &env{pool: pool, ob: ob, brokers: testenv.Brokers(k), kafka: k}, direct: direct}
}

// logAttrs is a slog handler that sends each record's message and
// attributes (as "k=v" joined by spaces) on a channel.
type logAttrs chan string

func (l logAttrs) Enabled(context.Context, slog.Level) bool { return true }
func (l logAttrs) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.Key + "=" + a.Value.String()); return true })
	select {
	case l <- b.String():
	default:
	}
	return nil
}
func (l logAttrs) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l logAttrs) WithGroup(string) slog.Handler      { return l }

// await returns the first line containing every part, failing t after 10s.
func (l logAttrs) await(t *testing.T, parts ...string) string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case line := <-l:
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(line, p)
			}
			if ok {
				return line
			}
		case <-deadline:
			t.Fatalf("no log line with %q within 10s", parts)
		}
	}
}

// Two relays on one table through PgBouncer in transaction mode: one is
// active at any moment (the other stands by, also across a takeover), each
// row is published once (distinct message ids = records a committed reader
// sees), the relays say at start that they poll, and afterwards 200 of 200
// fresh transactions of another client through the same pooler run with
// synchronous_commit on and their own application_name.
func TestRelaysThroughTransactionPooler(t *testing.T) {
	e := setupPooled(t, 3, "t")
	var mu sync.Mutex
	var active [2]bool
	var both atomic.Int64
	var published [2]atomic.Int64
	relays := make([]*runningRelay, 2)
	logs := make(logAttrs, 1000)
	for i := range relays {
		cfg := e.fastConfig(t)
		cfg.Logger = slog.New(logs)
		cfg.Hooks.OnActive = func(a bool) {
			mu.Lock()
			defer mu.Unlock()
			active[i] = a
			if active[0] && active[1] {
				both.Add(1)
			}
		}
		cfg.Hooks.OnPublished = func(n int, _ []time.Duration) { published[i].Add(int64(n)) }
		relays[i] = e.startRelay(t, cfg)
	}
	logs.await(t, "outbox relay polls", "mode=poll", "pooler")
	c := e.consume(t, "t")
	const rounds, perTx = 20, 10
	add := func(from int) {
		for r := range rounds {
			msgs := make([]outbox.Message, perTx)
			for j := range msgs {
				msgs[j] = outbox.Message{Topic: "t", Key: []byte{byte('a' + j%5)}, Value: []byte{byte(from + r), byte(j)}}
			}
			e.add(t, msgs...)
		}
	}
	add(0)
	c.waitDistinct(rounds*perTx, 20*time.Second)
	holder := func() int {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case active[0] && !active[1]:
			return 0
		case active[1] && !active[0]:
			return 1
		}
		return -1
	}
	eventually(t, 10*time.Second, "one active relay", func() bool { return holder() >= 0 })
	first := holder()
	relays[first].stop()
	eventually(t, 10*time.Second, "the standby to take over", func() bool { return holder() == 1-first })
	add(rounds)
	recs := c.waitDistinct(2*rounds*perTx, 20*time.Second)
	eventually(t, 10*time.Second, "empty backlog", func() bool { return e.backlog(t) == 0 })
	if records, distinct := distinctIDs(c.recs); records != distinct || distinct != 2*rounds*perTx {
		t.Fatalf("a committed reader saw %d records with %d distinct message ids, want %d of each", records, distinct, 2*rounds*perTx)
	}
	if n := both.Load(); n != 0 {
		t.Fatalf("both relays active at once %d times", n)
	}
	if got := published[0].Load() + published[1].Load(); got != 2*rounds*perTx {
		t.Fatalf("the relays reported %d rows published, want %d", got, 2*rounds*perTx)
	}
	_ = recs
	relays[1-first].stop()

	ctx := context.Background()
	on := 0
	for range 200 {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			var sc, app string
			if err := tx.QueryRow(ctx, "select current_setting('synchronous_commit'), current_setting('application_name')").Scan(&sc, &app); err != nil {
				return err
			}
			if sc == "on" && !strings.HasPrefix(app, "exactly relay") {
				on++
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if on != 200 {
		t.Fatalf("%d of 200 fresh transactions through the pooler ran with synchronous_commit on and their own application_name", on)
	}
}

// A relay whose pool goes through PgBouncer in transaction mode LISTENs on
// ListenConnString, a direct connection: rows another process writes (here
// another Outbox value, which notifies) are published at once, although
// the relay's poll interval is a minute.
func TestRelayListensOnListenConnString(t *testing.T) {
	e := setupPooled(t, 2, "t")
	cfg := e.fastConfig(t)
	cfg.PollInterval = time.Minute
	cfg.ListenConnString = e.direct
	logs := make(logAttrs, 100)
	cfg.Logger = slog.New(logs)
	active := make(chan bool, 4)
	cfg.Hooks.OnActive = func(a bool) { active <- a }
	e.startRelay(t, cfg)
	logs.await(t, "outbox relay wakes on notifications", "ListenConnString", "mode=listen", "pooler")
	if !<-active {
		t.Fatal("OnActive(false) first")
	}
	other := outbox.New() // another process's writer: it notifies
	c := e.consume(t, "t")
	for i := range 3 {
		e.addTo(t, other, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte{byte(i)}})
		other.Wake(e.pool)
		c.waitFor(i+1, 10*time.Second)
	}
}
