package consumer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/internal/testenv/pgserver"
)

// smallServer starts a private PostgreSQL with max_connections n (the
// default 3 reserved for superusers), stopped when t ends.
func smallServer(t *testing.T, n int) *pgserver.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgserver.Start(ctx, pgserver.Options{Settings: map[string]string{"max_connections": fmt.Sprint(n)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	return srv
}

// logDefault makes slog's default logger (the one NewPool logs with) write
// to the returned buffer until t ends.
func logDefault(t *testing.T) *syncWriter {
	t.Helper()
	w := &syncWriter{w: &bytes.Buffer{}}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(w, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	return w
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

// NewPool never takes more than half of the connections the server has
// free: on a server of 20 connections (3 reserved) the rule's 18 for 256
// partitions is capped at 8 and logged with the budget; with the pool full,
// another client still connects. pool_max_conns still wins, with a warning
// when it asks for more than is free; every connection is named "exactly"
// unless the URL names it.
func TestNewPoolKeepsWithinTheServersBudget(t *testing.T) {
	srv := smallServer(t, 20)
	logs := logDefault(t)
	ctx := context.Background()
	pool, err := consumer.NewPool(ctx, srv.URL("postgres"), 256)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if got := pool.Config().MaxConns; got != 8 {
		t.Fatalf("MaxConns = %d on a server with 17 connections free, want 8 (half of them)", got)
	}
	out := logs.String()
	for _, want := range []string{"level=WARN", "capped", "max_conns=8", "rule=18", "server_max_connections=20", "server_reserved=3", "server_free=17"} {
		if !strings.Contains(out, want) {
			t.Errorf("NewPool's log line lacks %q:\n%s", want, out)
		}
	}
	var conns []*pgxpool.Conn
	for range 8 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	var name string
	if err := conns[0].QueryRow(ctx, "show application_name").Scan(&name); err != nil || name != consumer.DefaultApplicationName {
		t.Errorf("application_name = %q (%v), want %q", name, err, consumer.DefaultApplicationName)
	}
	other, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		t.Fatalf("with the pool full, another client cannot connect: %v", err)
	}
	other.Close(ctx)
	for _, c := range conns {
		c.Release()
	}

	explicit, err := consumer.NewPool(ctx, srv.URL("postgres")+"&pool_max_conns=30&application_name=billing", 256)
	if err != nil {
		t.Fatal(err)
	}
	defer explicit.Close()
	if got := explicit.Config().MaxConns; got != 30 {
		t.Errorf("pool_max_conns=30: MaxConns = %d, want 30 (the setting wins)", got)
	}
	if !strings.Contains(logs.String(), "pool_max_conns asks for more connections than the server has free") {
		t.Errorf("no warning for a pool_max_conns past the free connections:\n%s", logs.String())
	}
	if err := explicit.QueryRow(ctx, "show application_name").Scan(&name); err != nil || name != "billing" {
		t.Errorf("application_name = %q (%v), want the URL's billing", name, err)
	}
}

// The rule for 6 partitions fits a roomy server: the pool is the rule's,
// logged at info with the budget.
func TestNewPoolLogsTheBudget(t *testing.T) {
	logs := logDefault(t)
	pool, err := consumer.NewPool(context.Background(), testenv.DBURL(t), 6)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if got := pool.Config().MaxConns; got != 8 {
		t.Errorf("MaxConns = %d, want PoolConns(6) = 8", got)
	}
	out := logs.String()
	if !strings.Contains(out, `level=INFO msg="database pool"`) || !strings.Contains(out, "max_conns=8") || !strings.Contains(out, "server_max_connections=") {
		t.Errorf("no info line naming the pool and the server's budget:\n%s", out)
	}
}

// 256 partitions on a server of PostgreSQL's default 100 connections, the
// pool from NewPool: every partition's record is applied, no other client
// is refused, and the start logs no warning (neither the wait rows' nor a
// request for more connections than the server has).
func TestManyPartitionsStartQuietly(t *testing.T) {
	const partitions = 256
	srv := smallServer(t, 100)
	logDefault(t)
	ctx := context.Background()
	url, err := srv.CreateDatabase(ctx, "many")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := consumer.NewPool(ctx, url, partitions)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	setupLedger(t, pool)
	kc := testenv.Kafka(t, partitions, "credits")
	brokers := testenv.Brokers(kc)
	var recs []*kgo.Record
	for p := range int32(partitions) {
		v, _ := json.Marshal(credit{OrderID: fmt.Sprintf("o-%d", p), Account: 1, Amount: 1})
		recs = append(recs, &kgo.Record{Topic: "credits", Partition: p, Value: v})
	}
	produceManual(t, brokers, recs...)
	w := &syncWriter{w: &bytes.Buffer{}}
	o := newOutcomes()
	startConsumer(t, testConfig(brokers, "many", "credits"), pool, consumer.Handle(creditHandler(0)), consumer.WithHooks(o.hooks()),
		consumer.WithLogger(slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	o.await(t, 90*time.Second, "every partition's record", func() bool { return o.get("applied") == partitions })
	if out := w.String(); out != "" {
		t.Errorf("warnings at the start of %d partitions:\n%s", partitions, out)
	}
	other, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("another client is refused while the consumer runs: %v", err)
	}
	other.Close(ctx)
}
