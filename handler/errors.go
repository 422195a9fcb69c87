package handler

import "fmt"

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
