package apply

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/handler"
)

// IsTransient reports whether err signals an infrastructure condition that
// goes away by itself (the database restarting, a lost connection, a
// serialization failure or deadlock, too many connections), as opposed to
// a problem with the record or the handler. Transient errors are retried
// until the dependency is back and never count as handler attempts.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return transientCode(pgErr.Code)
	}
	if pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "conn busy") ||
		strings.Contains(msg, "connection reset") || strings.Contains(msg, "broken pipe") ||
		strings.Contains(msg, "unexpected EOF")
}

// IsContention reports whether err is a deadlock or serialization failure:
// transactions got in each other's way. Retrying at once with fewer records
// per transaction (fewer locks held at a time) makes it less likely again.
func IsContention(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// transientCode reports whether a PostgreSQL error code is the database's
// own failure rather than a problem with the statement: a lost connection
// (08), the server shutting down or not yet accepting connections (57P01
// admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now), a
// serialization failure (40001) or deadlock (40P01), or insufficient
// resources (53). Nothing a handler can provoke with its own statements
// (a unique violation, an aborted transaction, a lock timeout it set) is
// transient: those are failures of its record.
func transientCode(code string) bool {
	switch {
	case code == "40001", code == "40P01":
		return true
	case code == "57P01", code == "57P02", code == "57P03":
		return true
	case strings.HasPrefix(code, "08"), strings.HasPrefix(code, "53"):
		return true
	}
	return false
}

// handlerOutage reports whether a handler's error is the database's doing
// (a transient PostgreSQL error, or the transaction's connection lost)
// rather than the handler's own: its logic, or another system it called.
// Only the database's, and a codec's service that did not answer
// (handler.UnavailableError), count as outages; everything else is a failed attempt
// (retried with backoff, dead-lettered after the configured attempts), so a
// payment API that keeps timing out, or a truncated document a handler
// decodes, cannot hold a partition for ever.
func handlerOutage(err error, tx pgx.Tx) bool {
	if handler.IsUnavailable(err) {
		return true // a codec's service down (a schema registry), as a re-decode met it
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return transientCode(pgErr.Code)
	}
	if tx.Conn().IsClosed() {
		return true
	}
	var connErr *pgconn.ConnectError
	return errors.As(err, &connErr) || pgconn.SafeToRetry(err)
}
