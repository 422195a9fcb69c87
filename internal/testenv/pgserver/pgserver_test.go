package pgserver

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestStartCreateRestartStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(testWriter{t}, nil))

	begin := time.Now()
	s, err := Start(ctx, Options{Logger: logger, Settings: map[string]string{"synchronous_commit": "on"}})
	if err != nil {
		if errors.Is(err, ErrNotInstalled) {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Logf("started in %v", time.Since(begin))
	defer s.Stop()

	url, err := s.CreateDatabase(ctx, "Weird \"Name\"")
	if err != nil {
		t.Fatal(err)
	}
	exec := func(url, sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatalf("connecting to %s: %v", url, err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(url, "create table t (id int primary key); insert into t values (1)")

	var sc string
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "show synchronous_commit").Scan(&sc); err != nil {
		t.Fatal(err)
	}
	if sc != "on" {
		t.Errorf("synchronous_commit = %q, want on", sc)
	}

	begin = time.Now()
	if err := s.Restart(ctx, true); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted (immediate) in %v", time.Since(begin))
	if err := conn.Ping(ctx); err == nil {
		t.Error("connection survived an immediate restart")
	}
	conn.Close(ctx)

	conn, err = pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, "select count(*) from t").Scan(&n); err != nil || n != 1 {
		t.Fatalf("after restart: count = %d, err = %v; want 1 row", n, err)
	}
	conn.Close(ctx)

	if err := s.Restart(ctx, false); err != nil {
		t.Fatal(err)
	}
	exec(s.URL("postgres"), "select 1")

	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cluster dir %s still there after Stop (stat err %v)", s.Dir(), err)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := s.Restart(ctx, false); err == nil {
		t.Error("Restart after Stop succeeded")
	}
}

func TestGivenDirIsKeptAndReused(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir() + "/cluster"
	s, err := Start(ctx, Options{Dir: dir})
	if err != nil {
		if errors.Is(err, ErrNotInstalled) {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	if _, err := s.CreateDatabase(ctx, "kept"); err != nil {
		s.Stop()
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir + "/data/PG_VERSION"); err != nil {
		t.Fatalf("given dir not kept: %v", err)
	}

	s, err = Start(ctx, Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	conn, err := pgx.Connect(ctx, s.URL("kept"))
	if err != nil {
		t.Fatalf("database from the first start is gone: %v", err)
	}
	conn.Close(ctx)
}

func TestInvalidSetting(t *testing.T) {
	_, err := Start(t.Context(), Options{Settings: map[string]string{"bad\nname": "x"}})
	if err == nil {
		t.Fatal("Start accepted a setting name with a newline")
	}
}

func TestCompareVersions(t *testing.T) {
	if compareVersions("9.6", "15") >= 0 || compareVersions("17", "15") <= 0 || compareVersions("15", "15") != 0 {
		t.Error("compareVersions orders versions wrongly")
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

func TestBinDirWithoutBinariesFails(t *testing.T) {
	empty := t.TempDir()
	t.Setenv(EnvBinDir, empty)
	_, err := Start(t.Context(), Options{})
	if !errors.Is(err, ErrNotInstalled) {
		t.Fatalf("Start with %s=%s (empty): err = %v, want ErrNotInstalled", EnvBinDir, empty, err)
	}
	if !strings.Contains(err.Error(), EnvBinDir) || !strings.Contains(err.Error(), empty) {
		t.Errorf("error does not name %s and the directory: %v", EnvBinDir, err)
	}
}

// TestBinDirRunsThoseBinaries starts a server from an explicit binaries
// directory ($EXACTLY_PG_BIN when set, as in make test-pg17; otherwise the
// one found on this machine) and checks the running server is that version.
func TestBinDirRunsThoseBinaries(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	dir := os.Getenv(EnvBinDir)
	if dir == "" {
		var ok bool
		if dir, ok = findBinaries(); !ok {
			t.Skip("no PostgreSQL binaries on this machine")
		}
	}
	out, err := exec.CommandContext(ctx, filepath.Join(dir, "postgres"), "--version").Output()
	if err != nil {
		t.Fatalf("%s/postgres --version: %v", dir, err)
	}
	fields := strings.Fields(string(out)) // postgres (PostgreSQL) 17.10 [(Debian …)]
	if len(fields) < 3 {
		t.Fatalf("%s/postgres --version printed %q", dir, out)
	}
	want := fields[2]

	t.Setenv(EnvBinDir, t.TempDir()) // Options.BinDir wins over the variable
	s, err := Start(ctx, Options{BinDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if s.BinDir() != dir {
		t.Errorf("BinDir() = %s, want %s", s.BinDir(), dir)
	}
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var got string
	if err := conn.QueryRow(ctx, "show server_version").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got, want) {
		t.Errorf("server_version = %q, want %s (from %s)", got, want, dir)
	}
	t.Logf("server %s from %s", got, dir)
}
