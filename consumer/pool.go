package consumer

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/runtime/redact"
)

// NewPool connects a pool sized by the one pool-sizing rule ([PoolConns]):
// one connection per partition the instance works on at once, plus the
// relay's and the pruner's. A pool_max_conns setting in databaseURL wins
// over the rule. It fails, without naming the password, when databaseURL
// does not parse or the pool cannot be built; like pgxpool.NewWithConfig it
// does not wait for a first connection.
func NewPool(ctx context.Context, databaseURL string, partitions int) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("consumer: parsing the database URL %s: %w", redact.URL(databaseURL), redact.Error(err, databaseURL))
	}
	if !setsPoolMaxConns(databaseURL) {
		pcfg.MaxConns = PoolConns(partitions)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("consumer: connecting to %s: %w", redact.URL(databaseURL), redact.Error(err, databaseURL))
	}
	return pool, nil
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
