package handler

import (
	"strconv"
)

// keyOrigin tells where a KeySource takes the key from.
type keyOrigin int

const (
	originUnset keyOrigin = iota
	originPayload
	originHeader
	originCoordinates
)

// KeySource says where a handler's deduplication key comes from. Build one
// with [FromPayload], [FromHeader] or [FromCoordinates]; the zero value is
// invalid and makes the consumer refuse the handler at start-up.
type KeySource[T any] struct {
	origin  keyOrigin
	payload func(T) string
	header  string
}

// FromPayload derives the key from the decoded payload, typically with
// dedupe.Key over the fields that name the business operation:
//
//	handler.FromPayload(func(c Credit) string { return dedupe.Key("credit", c.OrderID) })
//
// This is the strongest source: the same command sent twice by the producer
// yields the same key. A function that returns "" makes the record fail with
// a [*KeyError] (it goes to the dead-letter topic).
func FromPayload[T any](fn func(T) string) KeySource[T] {
	return KeySource[T]{origin: originPayload, payload: fn}
}

// FromHeader takes the key from the record header name, which the producer
// sets to a stable business identifier (exactly's outbox sets "message-id"
// on every record it publishes). A record without the header, or with an
// empty one, fails with a [*KeyError].
func FromHeader[T any](name string) KeySource[T] {
	return KeySource[T]{origin: originHeader, header: name}
}

// FromCoordinates keys each record by its topic, partition and offset.
//
// This is weaker than the other sources and must be chosen knowingly: it
// deduplicates redelivery of the same record (crash before the offset
// commit, rebalance, retry), but NOT a producer that sends the same command
// twice, because the copies sit at different offsets. Use it only when the
// payload has no business identity and the producer is idempotent.
func FromCoordinates[T any]() KeySource[T] {
	return KeySource[T]{origin: originCoordinates}
}

// String describes the source for logs: "payload", "header:<name>" or
// "coordinates".
func (k KeySource[T]) String() string {
	switch k.origin {
	case originPayload:
		return "payload"
	case originHeader:
		return "header:" + k.header
	case originCoordinates:
		return "coordinates"
	default:
		return "unset"
	}
}

func (k KeySource[T]) validate() error {
	switch k.origin {
	case originPayload:
		if k.payload == nil {
			return errString("FromPayload was given a nil function")
		}
	case originHeader:
		if k.header == "" {
			return errString("FromHeader was given an empty header name")
		}
	case originCoordinates:
	default:
		return errString("no key source: use handler.FromPayload, FromHeader or FromCoordinates")
	}
	return nil
}

func (k KeySource[T]) derive(rec *Record, v T) (string, error) {
	switch k.origin {
	case originPayload:
		key := k.payload(v)
		if key == "" {
			return "", &KeyError{Source: k.String(), Reason: "the payload key function returned an empty key"}
		}
		return key, nil
	case originHeader:
		b, ok := rec.Header(k.header)
		if !ok {
			return "", &KeyError{Source: k.String(), Reason: "header " + strconv.Quote(k.header) + " is missing"}
		}
		if len(b) == 0 {
			return "", &KeyError{Source: k.String(), Reason: "header " + strconv.Quote(k.header) + " is empty"}
		}
		return string(b), nil
	case originCoordinates:
		return rec.Coordinates(), nil
	default:
		return "", &KeyError{Source: k.String(), Reason: "handler has no key source"}
	}
}

type errString string

func (e errString) Error() string { return string(e) }
