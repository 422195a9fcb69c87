// Package pgsession keeps the framework's own connections free of session
// state, so that they are correct behind a transaction-mode pooler
// (PgBouncer), where each transaction may run on another server connection
// and whatever a session sets stays behind for the next client.
//
// SetLocal sets run-time parameters for one transaction only
// (set_config(name, value, true)); AppName builds the application_name a
// framework part shows in pg_stat_activity while it runs a transaction
// ("exactly relay exactly_outbox"); Probe tells whether a pool's
// connections are sessions of PostgreSQL or go through a pooler.
package pgsession
