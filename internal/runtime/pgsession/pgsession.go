package pgsession

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// maxAppName is the longest application_name PostgreSQL keeps
// (NAMEDATALEN-1 bytes); it truncates longer ones.
const maxAppName = 63

// Execer runs a statement: a pgx.Tx, a *pgx.Conn or a *pgxpool.Pool.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// AppName returns the application_name of a framework part working on a
// table: "exactly <part> <table>" (for example "exactly relay
// exactly_outbox"), cut at a character boundary to the 63 bytes PostgreSQL
// keeps. It never fails.
func AppName(part, table string) string {
	s := "exactly " + part
	if table != "" {
		s += " " + table
	}
	if len(s) <= maxAppName {
		return s
	}
	s = s[:maxAppName]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// SetLocal sets each (name, value) pair of kv for the current transaction
// only (set_config(name, value, true)), in one statement on tx: at COMMIT
// or ROLLBACK the settings end with it, so nothing stays on a pooled server
// connection. Outside an explicit transaction the settings last for the one
// statement. It fails when kv has an odd length, or with the wrapped
// database error (an unknown or read-only parameter).
func SetLocal(ctx context.Context, tx Execer, kv ...string) error {
	if len(kv) == 0 {
		return nil
	}
	if len(kv)%2 != 0 {
		return fmt.Errorf("pgsession: SetLocal: %d arguments, want name, value pairs", len(kv))
	}
	var b strings.Builder
	b.WriteString("select ")
	args := make([]any, len(kv))
	for i := 0; i < len(kv); i += 2 {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "set_config($%d, $%d, true)", i+1, i+2)
		args[i], args[i+1] = kv[i], kv[i+1]
	}
	if _, err := tx.Exec(ctx, b.String(), args...); err != nil {
		return fmt.Errorf("setting %s for the transaction: %w", names(kv), err)
	}
	return nil
}

func names(kv []string) string {
	ns := make([]string, 0, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		ns = append(ns, kv[i])
	}
	return strings.Join(ns, ", ")
}

// Pooler is what Probe found between a pool and PostgreSQL.
type Pooler struct {
	// Detected is true when the pool's connections are not sessions of
	// PostgreSQL: the backend pid a connection announced at start-up is
	// not the pid of the backend that runs its statements (a pooler such
	// as PgBouncer announces its own), or two statements of one
	// connection ran on different backends (transaction or statement
	// pooling).
	Detected bool
	// Announced is the pid the connection announced; Backends are the
	// pids pg_backend_pid() returned for two statements in a row.
	Announced uint32
	Backends  [2]uint32
}

// String says what was found, for a log line.
func (p Pooler) String() string {
	switch {
	case !p.Detected:
		return fmt.Sprintf("a direct connection (backend pid %d)", p.Announced)
	case p.Backends[0] != p.Backends[1]:
		return fmt.Sprintf("a transaction-mode pooler (two statements of one connection ran on backends %d and %d)", p.Backends[0], p.Backends[1])
	default:
		return fmt.Sprintf("a pooler (the connection announced backend pid %d, its statements ran on %d)", p.Announced, p.Backends[0])
	}
}

// Probe acquires one connection of pool and runs select pg_backend_pid()
// twice, as two transactions, comparing the pids with the one the
// connection announced. A direct connection (or a session-mode pooler that
// passes the server's pid through, which no common pooler does) is not
// Detected; a pooler is, whatever its mode, because the framework cannot
// tell a session-mode pooler from a transaction-mode one that happened to
// reuse one server connection. It fails with the wrapped error when no
// connection can be acquired or the statement fails.
func Probe(ctx context.Context, pool *pgxpool.Pool) (Pooler, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return Pooler{}, fmt.Errorf("pgsession: probing for a pooler: acquiring a connection: %w", err)
	}
	defer c.Release()
	p := Pooler{Announced: c.Conn().PgConn().PID()}
	for i := range p.Backends {
		if err := c.QueryRow(ctx, "select pg_backend_pid()::bigint").Scan(&p.Backends[i]); err != nil {
			return Pooler{}, fmt.Errorf("pgsession: probing for a pooler: %w", err)
		}
	}
	p.Detected = p.Announced != p.Backends[0] || p.Backends[0] != p.Backends[1]
	return p, nil
}

var _ Execer = pgx.Tx(nil)
