// Package pgbouncer starts a private PgBouncer in front of a PostgreSQL
// server, for tests and benchmarks that check how the framework behaves
// behind a connection pooler. It runs the machine's own pgbouncer binary
// (Debian's package: /usr/sbin/pgbouncer); no Docker is needed.
//
// Start writes a configuration into a directory of its own (pgbouncer.ini,
// an auth file, the log), picks a free port on 127.0.0.1 and returns when
// the pooler accepts connections. Every database name is forwarded to the
// upstream server ("*" in [databases]), so URL("db") reaches database db of
// the upstream through the pooler. The pool mode is Options.PoolMode:
// "transaction" (the default: a server connection is lent for one
// transaction, the set-up production fleets run), "session" or
// "statement". Clients authenticate as "postgres" without a password
// (auth_type=trust), like the upstream private server of
// internal/testenv/pgserver. The admin console (database "pgbouncer",
// simple protocol only) is open to that user: Bouncer.ServerConns reads
// SHOW POOLS through it.
//
// pgbouncer refuses to run as root, so when the process is root it runs as
// the "postgres" OS user (which internal/testenv/pgserver creates) and its
// directory is handed to that user. It is started with a parent-death
// signal, so it does not outlive a test binary that dies without calling
// Bouncer.Stop.
//
// When the binary is missing, Start fails wrapping ErrNotInstalled and says
// to install Debian's pgbouncer package (.ci/run installs it).
package pgbouncer
