// Package apply runs consecutive records of one partition through a handler
// in one PostgreSQL transaction: guard claims in one statement, each
// handler in its own savepoint, dead letters in the same transaction.
//
// It is the one implementation of the path of a record shared by the
// consumer and by handler/handlertest, so what users test is what runs.
package apply
