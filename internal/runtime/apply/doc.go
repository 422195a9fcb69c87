// Package apply runs consecutive records of one partition through a handler
// in one PostgreSQL transaction: BEGIN, the batch's lock keys and its guard
// claims in one round trip, then each handler (pipelined handlers queue,
// set-based ones run once per batch), then the queued statements, outbox
// rows, outcome counters and COMMIT in one round trip. A failing record
// rolls back alone (the transaction is replayed without it, rather than
// paying a savepoint per record; a failing set call is bisected under
// savepoints first), dead letters in the same transaction.
//
// It is the one implementation of the path of a record shared by the
// consumer and by handler/handlertest, so what users test is what runs.
package apply
