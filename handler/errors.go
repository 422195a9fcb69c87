package handler

import (
	"errors"
	"fmt"
)

// DecodeError reports a record whose value the handler's codec could not
// decode: garbage bytes, JSON of the wrong shape, or an empty value (a
// tombstone). It is permanent: retrying cannot help, so the consumer sends
// the record to the dead-letter topic with this error as the reason.
type DecodeError struct {
	Codec string
	Err   error
}

// Error describes what could not be decoded and why.
func (e *DecodeError) Error() string {
	return fmt.Sprintf("decoding record value with codec %s: %v", e.Codec, e.Err)
}

// Unwrap returns the codec's error.
func (e *DecodeError) Unwrap() error { return e.Err }

// KeyError reports a record from which no deduplication key could be
// derived (a missing header, an empty payload key). It is permanent: the
// consumer sends the record to the dead-letter topic.
type KeyError struct {
	Source string
	Reason string
}

// Error names the key source and what was missing.
func (e *KeyError) Error() string {
	return fmt.Sprintf("deriving key from %s: %s", e.Source, e.Reason)
}

// PanicError is a handler panic recovered by exactly. It counts as a failed
// attempt, like a returned error.
type PanicError struct {
	Value any
	Stack []byte
}

// Error includes the panic value.
func (e *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v", e.Value) }

// PermanentError is a handler failure that retrying cannot fix. Build it
// with [Permanent]; the consumer dead-letters the record at once, without
// further attempts.
type PermanentError struct {
	Err error
}

// Permanent wraps err so that the consumer dead-letters the record at once
// instead of retrying it: return it for input that will never be
// processable (a reference to something that can never exist, a request
// the handler cannot express). The record goes to the dead-letter topic
// with err as the reason; without a dead-letter topic it holds its
// partition like any failure. Permanent(nil) returns nil.
//
// A business rejection (insufficient funds, a closed account) is usually
// not an error at all: record the rejection in tx (a rejected row, an
// outbox event telling the requester) and return nil, so the decision
// commits with the guard row and is applied exactly once. Use Permanent
// for records nobody should have sent, which an operator must look at.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// Error returns the wrapped error's text.
func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// AbortedTxError reports a handler that returned nil although its
// transaction was aborted: a statement failed (a unique violation, say) and
// the handler swallowed the error. Nothing it wrote can commit, so the
// consumer treats it as a failure of that record: retried with backoff,
// then dead-lettered, while the records before it commit. It reaches
// dead-letter functions and retry hooks as the reason; use errors.As.
type AbortedTxError struct {
	// Handler is the name of the handler that returned nil.
	Handler string
	// Ended is true when the handler ended the transaction itself (it
	// committed or rolled back tx, which it must not do) rather than
	// leaving it aborted.
	Ended bool
}

// Error says what the handler did.
func (e *AbortedTxError) Error() string {
	if e.Ended {
		return fmt.Sprintf("handler %s returned nil but ended its transaction (it must not commit or roll back tx)", e.Handler)
	}
	return fmt.Sprintf("handler %s returned nil but its transaction was aborted: one of its statements failed and the handler did not return the error", e.Handler)
}

// UnavailableError reports a record that a codec could not decode because a
// service it reads from did not answer (a schema registry unreachable,
// timing out or answering 5xx): an outage, not a problem with the record.
// A codec returns it (wrapped or not) from Unmarshal; the handler passes it
// on as it is, never as a [*DecodeError], and the consumer retries the
// record with backoff, holding its partition from that record on, until the
// service answers. It is never dead-lettered and counts no attempts.
type UnavailableError struct {
	// Service names what did not answer ("schema registry").
	Service string
	Err     error
}

// Error names the service and what failed.
func (e *UnavailableError) Error() string {
	return fmt.Sprintf("%s unavailable: %v", e.Service, e.Err)
}

// Unwrap returns the service's error.
func (e *UnavailableError) Unwrap() error { return e.Err }

// IsUnavailable reports whether err is, or wraps, an [*UnavailableError].
func IsUnavailable(err error) bool {
	var ue *UnavailableError
	return errors.As(err, &ue)
}
