// Package apply runs consecutive records of one partition through a handler
// in one PostgreSQL transaction: guard claims in one statement, then each
// handler; a failing handler's record rolls back alone (the transaction is
// replayed without it, rather than paying a savepoint per record), dead
// letters in the same transaction.
//
// It is the one implementation of the path of a record shared by the
// consumer and by handler/handlertest, so what users test is what runs.
package apply
