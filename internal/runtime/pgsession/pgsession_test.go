package pgsession_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/runtime/pgsession"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/internal/testenv/pgbouncer"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestAppNameFitsPostgreSQL(t *testing.T) {
	if got := pgsession.AppName("relay", `"exactly_outbox"`); got != `exactly relay "exactly_outbox"` {
		t.Fatalf("AppName = %q", got)
	}
	long := pgsession.AppName("relay", strings.Repeat("é", 40))
	if len(long) > 63 || !utf8.ValidString(long) || !strings.HasPrefix(long, "exactly relay é") {
		t.Fatalf("AppName of a long table = %q (%d bytes)", long, len(long))
	}
}

// SetLocal's settings hold for the transaction and end with it: on a pool
// of one connection, the next transaction sees the defaults again.
func TestSetLocalEndsWithTheTransaction(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.DBURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	read := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) (sc, app string) {
		t.Helper()
		if err := q.QueryRow(ctx, "select current_setting('synchronous_commit'), current_setting('application_name')").Scan(&sc, &app); err != nil {
			t.Fatal(err)
		}
		return sc, app
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := pgsession.SetLocal(ctx, tx, "synchronous_commit", "off", "application_name", "exactly test"); err != nil {
			return err
		}
		if sc, app := read(tx); sc != "off" || app != "exactly test" {
			t.Fatalf("inside the transaction: synchronous_commit %q, application_name %q", sc, app)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if sc, app := read(pool); sc != "on" || app == "exactly test" {
		t.Fatalf("after the transaction: synchronous_commit %q, application_name %q", sc, app)
	}
	if err := pgsession.SetLocal(ctx, pool, "synchronous_commit"); err == nil {
		t.Fatal("SetLocal with an odd number of arguments succeeded")
	}
	if err := pgsession.SetLocal(ctx, pool, "no_such_setting", "1"); err == nil || !strings.Contains(err.Error(), "no_such_setting") {
		t.Fatalf("SetLocal of an unknown parameter: %v, want an error naming it", err)
	}
}

// Probe finds a direct connection direct and PgBouncer, in transaction
// mode and in session mode, a pooler.
func TestProbe(t *testing.T) {
	ctx := context.Background()
	probe := func(url string) pgsession.Pooler {
		t.Helper()
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		p, err := pgsession.Probe(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	url := testenv.DBURL(t)
	if p := probe(url); p.Detected || !strings.Contains(p.String(), "direct") {
		t.Fatalf("direct connection probed as %+v (%s)", p, p)
	}
	for _, mode := range []string{pgbouncer.Transaction, pgbouncer.Session} {
		b := pgbouncer.New(t, pgbouncer.Options{Upstream: os.Getenv(testenv.EnvDatabaseURL), PoolMode: mode, DefaultPoolSize: 2})
		if p := probe(b.Through(url)); !p.Detected || !strings.Contains(p.String(), "pooler") {
			t.Fatalf("PgBouncer in %s mode probed as %+v (%s)", mode, p, p)
		}
	}
}
