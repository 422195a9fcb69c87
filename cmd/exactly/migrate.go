package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/runtime/redact"
	"github.com/exactly-go/exactly/outbox"
)

// errNoDatabaseURL is returned by the commands that need PostgreSQL when
// DATABASE_URL is unset.
var errNoDatabaseURL = errors.New("DATABASE_URL is not set: export DATABASE_URL=postgres://user:password@host:5432/db")

// poolFromDatabaseURL opens a pool on DATABASE_URL and checks that the server
// answers. It fails with errNoDatabaseURL when the variable is unset.
func poolFromDatabaseURL(ctx context.Context) (*pgxpool.Pool, error) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return nil, errNoDatabaseURL
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("parsing DATABASE_URL: %w", redact.Error(err, url))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to DATABASE_URL: %w", redact.Error(err, url))
	}
	return pool, nil
}

// lazyPoolFromDatabaseURL is poolFromDatabaseURL without the first
// connection: the pool connects when first used, within 5 s unless
// DATABASE_URL sets connect_timeout, so a caller that reads each part on
// its own (status) starts, and reports, with the database down. It fails
// only when DATABASE_URL is unset or cannot be parsed.
func lazyPoolFromDatabaseURL() (*pgxpool.Pool, error) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return nil, errNoDatabaseURL
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parsing DATABASE_URL: %w", redact.Error(err, url))
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("parsing DATABASE_URL: %w", redact.Error(err, url))
	}
	return pool, nil
}

// guardFlags registers -guard-schema and -guard-table on fs and returns a
// function building the configured Guard after parsing.
func guardFlags(fs *flag.FlagSet) func() *dedupe.Guard {
	schema := fs.String("guard-schema", "", "schema of the guard table (empty: the search_path)")
	table := fs.String("guard-table", dedupe.DefaultTable, "name of the guard table")
	return func() *dedupe.Guard { return dedupe.New(dedupe.WithTable(*schema, *table)) }
}

// runMigrate creates or upgrades the framework's tables on DATABASE_URL and
// prints, per table, the schema version before and after. It fails on bad
// flags, an unset DATABASE_URL, or a failed migration (which leaves that
// table's schema unchanged).
func runMigrate(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stdout)
	guard := guardFlags(fs)
	ob := outboxFlags(fs)
	shards := fs.Int("shards", 1, "migrate a sharded outbox of this many tables (<outbox-table>_0 .. _N-1) instead of the single table")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: exactly migrate [flags]\n\nCreates or upgrades the guard and outbox tables on DATABASE_URL. Safe to rerun\nand to run from several instances at once.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return fmt.Errorf("parsing flags: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *shards < 1 || *shards > outbox.MaxShards {
		return fmt.Errorf("-shards %d: want 1..%d", *shards, outbox.MaxShards)
	}
	pool, err := poolFromDatabaseURL(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	g := guard()
	before, _, err := g.SchemaVersion(ctx, pool)
	if err != nil {
		return err
	}
	if err := g.Migrate(ctx, pool); err != nil {
		return err
	}
	after, _, err := g.SchemaVersion(ctx, pool)
	if err != nil {
		return err
	}
	reportMigration(stdout, "guard table "+g.Table().Sanitize(), before, after)

	outboxes := []*outbox.Outbox{ob()}
	if *shards != 1 {
		s, err := shardsOf(ob(), *shards)
		if err != nil {
			return err
		}
		outboxes = s.Shards()
	}
	for _, o := range outboxes {
		if before, _, err = o.SchemaVersion(ctx, pool); err != nil {
			return err
		}
		if err := o.Migrate(ctx, pool); err != nil {
			return err
		}
		if after, _, err = o.SchemaVersion(ctx, pool); err != nil {
			return err
		}
		reportMigration(stdout, "outbox table "+o.Table().Sanitize(), before, after)
	}
	return nil
}

// reportMigration prints one line saying what migrating what did.
func reportMigration(w io.Writer, what string, before, after int) {
	if before == after {
		fmt.Fprintf(w, "%s: up to date (schema version %d)\n", what, after)
		return
	}
	fmt.Fprintf(w, "%s: migrated from schema version %d to %d\n", what, before, after)
}
