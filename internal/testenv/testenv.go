package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testenv/broker"
	"github.com/exactly-go/exactly/internal/testenv/pgserver"
)

// EnvDatabaseURL names the environment variable holding the URL of the
// PostgreSQL server tests create their databases on.
const EnvDatabaseURL = "DATABASE_URL"

// maxIdentifier is PostgreSQL's limit on identifier length, in bytes.
const maxIdentifier = 63

// Main runs a package's tests (call it from TestMain). When DATABASE_URL is
// unset it starts a private PostgreSQL server, sets DATABASE_URL to it for
// the duration of the run and stops it afterwards. It exits the process
// with m.Run's code, or with 1 (after printing why) when the server cannot
// be started.
func Main(m *testing.M) {
	if os.Getenv(EnvDatabaseURL) != "" {
		os.Exit(m.Run())
	}
	os.Exit(runWithServer(m))
}

func runWithServer(m *testing.M) int {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	srv, err := pgserver.Start(ctx, pgserver.Options{Logger: logger})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: starting a private PostgreSQL (or set %s): %v\n", EnvDatabaseURL, err)
		return 1
	}
	defer func() {
		if err := srv.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: stopping the private PostgreSQL: %v\n", err)
		}
	}()
	if err := os.Setenv(EnvDatabaseURL, srv.URL("postgres")); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: setting %s: %v\n", EnvDatabaseURL, err)
		return 1
	}
	defer os.Unsetenv(EnvDatabaseURL)
	return m.Run()
}

// DB returns a pool (at most 20 connections) on a fresh, empty database
// created for t. The pool is closed and the database dropped when t ends.
// It fails t when DATABASE_URL is unset or the database cannot be created
// or reached.
func DB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dbURL := DBURL(t)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatalf("testenv: parsing database URL: %v", err)
	}
	cfg.MaxConns = 20
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testenv: opening a pool on the test database: %v", err)
	}
	// Registered after DBURL's cleanup, so it runs before the drop.
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("testenv: reaching the test database: %v", err)
	}
	return pool
}

// DBURL creates a fresh, empty database for t on the server named by
// DATABASE_URL and returns its URL; the database is dropped (its
// connections forcibly closed) when t ends. It fails t when DATABASE_URL is
// unset or the database cannot be created.
func DBURL(t testing.TB) string {
	t.Helper()
	admin := os.Getenv(EnvDatabaseURL)
	if admin == "" {
		t.Fatalf("testenv: %s is unset: call testenv.Main from TestMain (func TestMain(m *testing.M) { testenv.Main(m) })", EnvDatabaseURL)
	}
	name := databaseName(t.Name())
	ident := pgx.Identifier{name}.Sanitize()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("testenv: connecting to %s to create a test database: %v", EnvDatabaseURL, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "create database "+ident); err != nil {
		t.Fatalf("testenv: creating test database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("testenv: connecting to drop test database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "drop database if exists "+ident+" with (force)"); err != nil {
			t.Errorf("testenv: dropping test database %s: %v", name, err)
		}
	})

	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("testenv: parsing %s: %v", EnvDatabaseURL, err)
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String()
}

// databaseName derives a unique database name from a test name:
// t_<sanitised lowercase name>_<random hex>, at most 63 bytes.
func databaseName(testName string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(testName) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:]) // crypto/rand.Read never fails
	suffix := "_" + hex.EncodeToString(rnd[:])
	base := "t_" + b.String()
	if len(base)+len(suffix) > maxIdentifier {
		base = base[:maxIdentifier-len(suffix)]
	}
	return base + suffix
}

// Kafka starts an in-process single-broker Kafka cluster (kfake) for t,
// with topics created up front and any other topic auto-created, all with
// the given partition count. It is closed when t ends; it fails t when the
// cluster cannot start.
func Kafka(t testing.TB, partitions int32, topics ...string) *kfake.Cluster {
	t.Helper()
	return KafkaWith(t, nil, partitions, topics...)
}

// KafkaWith is [Kafka] with extra kfake options applied last, e.g.
// kfake.GroupMinSessionTimeout for tests that let a member's session
// expire quickly.
func KafkaWith(t testing.TB, extra []kfake.Opt, partitions int32, topics ...string) *kfake.Cluster {
	t.Helper()
	b, err := broker.Start(context.Background(), broker.Options{Partitions: partitions, Topics: topics, Extra: extra})
	if err != nil {
		t.Fatalf("testenv: starting kfake: %v", err)
	}
	t.Cleanup(b.Close)
	return b.Cluster()
}

// Brokers returns the seed broker addresses of c.
func Brokers(c *kfake.Cluster) []string { return c.ListenAddrs() }

// Produce produces recs synchronously to the brokers with a fresh client,
// failing t on the first error or after 30 seconds.
func Produce(t testing.TB, brokers []string, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatalf("testenv: creating a producer: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("testenv: producing %d records: %v", len(recs), err)
	}
}

// ReadTopic reads topic from its start until want records arrived and
// returns them. It fails t after 60 seconds, or when the topic holds a
// number of records other than want (so a test also catches extra
// records). It reads committed records, as exactly's consumer does:
// records of aborted transactions (a fenced or failed relay transaction)
// are not counted, nor are transaction markers.
func ReadTopic(t testing.TB, brokers []string, topic string, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		t.Fatalf("testenv: creating a consumer: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var recs []*kgo.Record
	next := map[int32]int64{} // per partition, the offset after the last one read
	poll := func() {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("testenv: read %d records of %s, want %d", len(recs), topic, want)
		}
		fs.EachRecord(func(r *kgo.Record) {
			next[r.Partition] = r.Offset + 1
			if !r.Attrs.IsControl() {
				recs = append(recs, r)
			}
		})
	}
	for len(recs) < want {
		poll()
	}
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("testenv: listing the end offsets of %s: %v", topic, err)
	}
	behind := func() bool {
		b := false
		ends.Each(func(o kadm.ListedOffset) { b = b || next[o.Partition] < o.Offset })
		return b
	}
	for behind() {
		poll()
	}
	if len(recs) != want {
		t.Errorf("testenv: %s holds %d records, want %d", topic, len(recs), want)
	}
	return recs
}
