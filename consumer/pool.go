package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/runtime/redact"
)

// DefaultApplicationName is the application_name NewPool gives its
// connections unless the database URL sets one: pg_stat_activity, the
// server's log and a pooler's SHOW CLIENTS then say which connections are
// exactly's.
const DefaultApplicationName = "exactly"

// budgetTimeout bounds NewPool's one look at the server's connection
// budget.
const budgetTimeout = 5 * time.Second

// NewPool connects a pool sized by the pool-sizing rule ([PoolConns]): one
// connection per partition the instance works on at once, up to
// [PartitionConns], plus the relay's and the pruner's. A pool_max_conns
// setting in databaseURL wins over the rule. Its connections carry
// application_name [DefaultApplicationName] unless databaseURL sets one.
//
// Before it builds the pool, NewPool connects once (within 5 s) and reads the
// server's connection budget: max_connections, the connections reserved
// for superusers (superuser_reserved_connections, and reserved_connections
// on PostgreSQL 16 and later), and the client connections in use. It caps a
// pool sized by the rule at half of the connections left free, so that one
// instance never takes every connection the server has and other clients
// (other instances, psql, exactly status) can still connect. It logs one
// line with slog's default logger saying the pool's size, the rule's and
// the budget it read: at Info when the rule stood, at Warn when it capped
// the pool or when pool_max_conns asks for more than is free (the setting
// still wins). When the budget cannot be read (the server unreachable,
// still starting), the pool is sized by the rule and the line says why.
//
// It fails, without naming the password, when databaseURL does not parse
// or the pool cannot be built; like pgxpool.NewWithConfig it does not wait
// for the pool's first connection.
func NewPool(ctx context.Context, databaseURL string, partitions int) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("consumer: parsing the database URL %s: %w", redact.URL(databaseURL), redact.Error(err, databaseURL))
	}
	if _, set := pcfg.ConnConfig.RuntimeParams["application_name"]; !set {
		pcfg.ConnConfig.RuntimeParams["application_name"] = DefaultApplicationName
	}
	explicit := setsPoolMaxConns(databaseURL)
	rule := PoolConns(partitions)
	if !explicit {
		pcfg.MaxConns = rule
	}
	log := slog.Default()
	b, berr := readBudget(ctx, pcfg.ConnConfig)
	attrs := []any{"max_conns", 0, "rule", rule, "partitions", partitions}
	switch {
	case berr != nil:
		attrs[1] = pcfg.MaxConns
		log.Info("database pool sized without reading the server's connection budget", append(attrs, "error", redact.Error(berr, databaseURL))...)
	case !explicit && pcfg.MaxConns > b.share():
		pcfg.MaxConns = b.share()
		attrs[1] = pcfg.MaxConns
		log.Warn("database pool capped at half of the server's free connections, so that other clients can still connect; partition workers share the pool (each holds a connection only for its transaction)",
			append(attrs, b.attrs()...)...)
	case explicit && int(pcfg.MaxConns) > b.Free:
		attrs[1] = pcfg.MaxConns
		log.Warn("pool_max_conns asks for more connections than the server has free: connections past them are refused (too many clients) and retried as an outage; lower pool_max_conns or raise max_connections",
			append(attrs, b.attrs()...)...)
	default:
		attrs[1] = pcfg.MaxConns
		log.Info("database pool", append(attrs, b.attrs()...)...)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("consumer: connecting to %s: %w", redact.URL(databaseURL), redact.Error(err, databaseURL))
	}
	return pool, nil
}

// connBudget is a server's connection budget, as readBudget reads it.
type connBudget struct {
	// MaxConnections is max_connections; Reserved the connections only
	// superusers (or, on PostgreSQL 16 and later, members of
	// pg_use_reserved_connections) may take; InUse the client connections
	// open, not counting the one that read the budget; Free what is left.
	MaxConnections, Reserved, InUse, Free int
}

// share is the most connections NewPool gives a pool sized by the rule:
// half of the free connections, at least one.
func (b connBudget) share() int32 { return int32(max(b.Free/2, 1)) }

func (b connBudget) attrs() []any {
	return []any{"server_max_connections", b.MaxConnections, "server_reserved", b.Reserved, "server_in_use", b.InUse, "server_free", b.Free}
}

// budgetSQL reads max_connections, the reserved connections and the client
// connections open (this one included). reserved_connections is absent
// before PostgreSQL 16.
const budgetSQL = `select current_setting('max_connections')::int,
	current_setting('superuser_reserved_connections')::int
		+ coalesce(nullif(current_setting('reserved_connections', true), '')::int, 0),
	(select count(*) from pg_stat_activity where backend_type = 'client backend')::int`

// readBudget connects once with cfg (bounded by budgetTimeout) and reads
// the server's connection budget. It runs its one statement in the simple
// protocol, which works through any pooler in any query exec mode. Through
// a pooler it reads the server behind it, whose connections the pooler
// holds. It fails when the server cannot be reached or answer.
func readBudget(ctx context.Context, cfg *pgx.ConnConfig) (connBudget, error) {
	ctx, cancel := context.WithTimeout(ctx, budgetTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
	if err != nil {
		return connBudget{}, fmt.Errorf("connecting: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var b connBudget
	if err := conn.QueryRow(ctx, budgetSQL, pgx.QueryExecModeSimpleProtocol).Scan(&b.MaxConnections, &b.Reserved, &b.InUse); err != nil {
		return connBudget{}, fmt.Errorf("reading max_connections and the connections in use: %w", err)
	}
	b.InUse = max(b.InUse-1, 0) // this one closes
	b.Free = max(b.MaxConnections-b.Reserved-b.InUse, 0)
	return b, nil
}

// setsPoolMaxConns reports whether databaseURL sets pool_max_conns.
// pgxpool.ParseConfig consumes the setting, so it is read from the
// connection settings pgconn parses (where it is an unknown run-time
// parameter), never by searching the text, which may hold the words in a
// password or an application name.
func setsPoolMaxConns(databaseURL string) bool {
	cfg, err := pgconn.ParseConfig(databaseURL)
	if err != nil {
		return false
	}
	_, set := cfg.RuntimeParams["pool_max_conns"]
	return set
}

// serverFree returns the connections the database has free (as readBudget
// counts them, through pool), or -1 when it cannot tell.
func serverFree(ctx context.Context, pool *pgxpool.Pool) int {
	ctx, cancel := context.WithTimeout(ctx, budgetTimeout)
	defer cancel()
	var b connBudget
	if err := pool.QueryRow(ctx, budgetSQL, pgx.QueryExecModeSimpleProtocol).Scan(&b.MaxConnections, &b.Reserved, &b.InUse); err != nil {
		return -1
	}
	return max(b.MaxConnections-b.Reserved-b.InUse, 0)
}
