// Package localserver holds what the private servers the tests start
// (PostgreSQL in internal/testenv/pgserver, PgBouncer in
// internal/testenv/pgbouncer) need from the operating system: an
// unprivileged OS user to run as when the tests run as root, that user's
// access to the server's directory, and a free port on 127.0.0.1.
package localserver
