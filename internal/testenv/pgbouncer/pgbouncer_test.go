package pgbouncer_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/internal/testenv/pgbouncer"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url+"&default_query_exec_mode=simple_protocol")
	if err != nil {
		t.Fatalf("connecting through the pooler: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func backendPID(t *testing.T, conn *pgx.Conn) int32 {
	t.Helper()
	var pid int32
	if err := conn.QueryRow(context.Background(), "select pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatalf("select pg_backend_pid(): %v", err)
	}
	return pid
}

// In transaction mode with one server connection, two clients that are both
// connected take turns on that one server connection.
func TestTransactionModeSharesOneServerConnection(t *testing.T) {
	b := pgbouncer.New(t, pgbouncer.Options{Upstream: os.Getenv(testenv.EnvDatabaseURL), DefaultPoolSize: 1})
	if b.PoolMode() != pgbouncer.Transaction {
		t.Fatalf("PoolMode() = %q, want the default %q", b.PoolMode(), pgbouncer.Transaction)
	}
	url := b.Through(testenv.DBURL(t))
	a, c := connect(t, url), connect(t, url)
	pa, pc := backendPID(t, a), backendPID(t, c)
	if pa != pc {
		t.Fatalf("two clients of a one-connection transaction pool ran on backends %d and %d, want one", pa, pc)
	}
	pools, err := b.Pools(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, p := range pools {
		if strings.HasPrefix(p.Database, "t_") {
			found = true
			if p.Mode != pgbouncer.Transaction || p.Servers() != 1 {
				t.Errorf("SHOW POOLS for %s: mode %q, %d server connections; want transaction, 1", p.Database, p.Mode, p.Servers())
			}
		}
	}
	if !found {
		t.Errorf("SHOW POOLS %+v lists no pool of the test database", pools)
	}
}

// In session mode a client keeps its server connection: a session setting
// survives another client's statements in between.
func TestSessionModeKeepsTheSession(t *testing.T) {
	b := pgbouncer.New(t, pgbouncer.Options{Upstream: os.Getenv(testenv.EnvDatabaseURL), PoolMode: pgbouncer.Session, DefaultPoolSize: 2})
	url := b.Through(testenv.DBURL(t))
	a, c := connect(t, url), connect(t, url)
	ctx := context.Background()
	if _, err := a.Exec(ctx, "set application_name = 'kept'"); err != nil {
		t.Fatal(err)
	}
	pa := backendPID(t, a)
	if pc := backendPID(t, c); pc == pa {
		t.Fatalf("two session clients share backend %d", pa)
	}
	var name string
	if err := a.QueryRow(ctx, "show application_name").Scan(&name); err != nil {
		t.Fatal(err)
	}
	if name != "kept" || backendPID(t, a) != pa {
		t.Fatalf("session mode lost the session: application_name %q, backend changed from %d", name, pa)
	}
}

func TestStartFailsClearly(t *testing.T) {
	ctx := context.Background()
	if _, err := pgbouncer.Start(ctx, pgbouncer.Options{}); err == nil || !strings.Contains(err.Error(), "Upstream") {
		t.Errorf("Start without Upstream: err = %v, want one naming Options.Upstream", err)
	}
	up := os.Getenv(testenv.EnvDatabaseURL)
	if _, err := pgbouncer.Start(ctx, pgbouncer.Options{Upstream: up, PoolMode: "sessions"}); err == nil || !strings.Contains(err.Error(), `"sessions"`) {
		t.Errorf("Start with a bad pool mode: err = %v, want one naming it", err)
	}
	_, err := pgbouncer.Start(ctx, pgbouncer.Options{Upstream: up, Binary: "/nonexistent/pgbouncer"})
	if !errors.Is(err, pgbouncer.ErrNotInstalled) {
		t.Errorf("Start with a missing binary: err = %v, want ErrNotInstalled", err)
	}
}

func TestStopIsIdempotentAndRemovesTheDirectory(t *testing.T) {
	b, err := pgbouncer.Start(context.Background(), pgbouncer.Options{Upstream: os.Getenv(testenv.EnvDatabaseURL)})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if _, err := os.Stat(b.LogPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Stop, its log %s: %v, want it removed", b.LogPath(), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, b.URL("postgres")); err == nil {
		conn.Close(ctx)
		t.Fatal("the pooler still accepts connections after Stop")
	}
}
