package handler

import (
	"strconv"
	"time"
)

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Record is the Kafka record a message was decoded from: its coordinates, its
// raw key and value, and its headers.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	Timestamp time.Time
}

// Header returns the value of the last header named name and whether one
// exists. Kafka allows repeated header names; the last one wins, as in most
// clients.
func (r *Record) Header(name string) ([]byte, bool) {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if r.Headers[i].Key == name {
			return r.Headers[i].Value, true
		}
	}
	return nil, false
}

// Coordinates returns "topic/partition/offset", the record's position in
// Kafka, for logs and errors.
func (r *Record) Coordinates() string {
	return r.Topic + "/" + strconv.FormatInt(int64(r.Partition), 10) + "/" + strconv.FormatInt(r.Offset, 10)
}

// Message is what a handler sees: the decoded payload, the deduplication key
// and scope exactly derived for it, and the record it came from.
type Message[T any] struct {
	// Value is the decoded payload.
	Value T
	// Key is the deduplication key, after [KeySource] derivation. It names
	// the business operation, e.g. "credit:order-8812".
	Key string
	// Scope is the namespace of Key in the guard table (the handler's name
	// unless [WithScope] was given).
	Scope string
	// Record is the Kafka record: topic, partition, offset, raw key and
	// value, headers and timestamp. Its bytes and headers are this run's
	// copy: changing them changes nothing the runtime keeps.
	Record Record
	// Attempt counts deliveries of this record to the handler within this
	// consumer process, starting at 1. A retry after a handler error has
	// Attempt 2, and so on.
	Attempt int
}

// Clone returns a copy of r that shares no memory with it: its key, value
// and header values copied into one new array, its headers into a new
// slice. It cannot fail. A hook that keeps a record past its call (see
// consumer.OutcomeData) keeps a clone: the consumer lends the memory of a
// record it is done with to later fetches.
func (r *Record) Clone() Record { return own(*r) }

// own returns a copy of rec that shares no memory with it: its key, value
// and header values in one new array (each clipped to its length, so an
// append cannot run into the next), its headers in a new slice. Each run
// of a handler gets such a copy, so that whatever it does to the bytes
// (decrypting the value in place, appending or overwriting a header)
// leaves the record the runtime decodes on a replay, and dead-letters, as
// it came from Kafka.
func own(rec Record) Record {
	return ownInto(rec, make([]byte, 0, ownSize(rec)))
}

// ownSize returns the bytes own copies of rec: its key, value and header
// values.
func ownSize(rec Record) int {
	n := len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += len(h.Value)
	}
	return n
}

// ownInto is own copying rec's bytes into buf, which has room for
// ownSize(rec) of them (and length 0).
func ownInto(rec Record, buf []byte) Record {
	clip := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		start := len(buf)
		buf = append(buf, b...)
		return buf[start:len(buf):len(buf)]
	}
	rec.Key, rec.Value = clip(rec.Key), clip(rec.Value)
	if rec.Headers != nil {
		hs := make([]Header, len(rec.Headers))
		for i, h := range rec.Headers {
			hs[i] = Header{Key: h.Key, Value: clip(h.Value)}
		}
		rec.Headers = hs
	}
	return rec
}
