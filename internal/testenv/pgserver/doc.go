// Package pgserver starts a private PostgreSQL cluster from the machine's
// own binaries (initdb, pg_ctl, postgres), for tests, the demo and the chaos
// harness. No Docker and no existing server are needed.
//
// EXACTLY_PG_BIN (or Options.BinDir) names the binaries' directory outright,
// with no fallback: CI runs the database tests a second time on PostgreSQL
// 17 this way, from the binaries install-postgres17.sh puts outside the
// repository (Debian ships 15). Otherwise, binaries are looked up on PATH and under /usr/lib/postgresql/*/bin (the
// highest version wins). When they are missing and the process runs as root,
// Start installs Debian's postgresql package with apt-get; otherwise it
// fails, saying what to install. install-postgres.sh in this directory does
// the same installation for CI.
//
// initdb refuses to run as root, so when the process is root the cluster is
// initialised and run as the "postgres" OS user (created with useradd when
// absent) and its directory is handed to that user.
//
// The cluster trusts every local connection (no password), listens on
// 127.0.0.1 at the chosen port and on a unix socket inside the data
// directory, and keeps durability on (fsync and synchronous_commit are not
// touched) unless Options.Settings says otherwise.
//
// The server is a separate process tree started by pg_ctl. Start also
// starts a small watchdog (sh, in a session of its own, as the server's
// user) whose stdin is a pipe only the calling process holds open: if that
// process dies without calling Server.Stop (even by SIGKILL), the pipe
// closes, and the watchdog stops the server with pg_ctl stop -m immediate
// and removes the directory Start created (a Options.Dir is kept). Stop
// tells the watchdog to exit.
package pgserver
