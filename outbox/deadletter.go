package outbox

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/handler"
)

// DefaultDeadLetterSuffix is appended to a topic's name to form its
// dead-letter topic when DeadLetters is given an empty suffix.
const DefaultDeadLetterSuffix = ".dlq"

// Headers a dead-letter record carries in addition to the original record's
// headers. Replay removes them again.
const (
	// HeaderError is the reason the record was dead-lettered (the error text).
	HeaderError = "exactly-error"
	// HeaderAttempts is how many times the handler ran (decimal).
	HeaderAttempts = "exactly-attempts"
	// HeaderHandler is the name of the handler that gave up.
	HeaderHandler = "exactly-handler"
	// HeaderOriginalTopic is the topic the record was consumed from.
	HeaderOriginalTopic = "exactly-original-topic"
	// HeaderOriginalPartition is its partition (decimal).
	HeaderOriginalPartition = "exactly-original-partition"
	// HeaderOriginalOffset is its offset (decimal).
	HeaderOriginalOffset = "exactly-original-offset"
	// HeaderDeadLetteredAt is when it was dead-lettered (RFC 3339, UTC).
	HeaderDeadLetteredAt = "exactly-dead-lettered-at"
)

// deadLetterHeaders are the headers DeadLetters adds and Replay removes.
var deadLetterHeaders = [...]string{
	HeaderError, HeaderAttempts, HeaderHandler, HeaderOriginalTopic,
	HeaderOriginalPartition, HeaderOriginalOffset, HeaderDeadLetteredAt,
}

func isDeadLetterHeader(name string) bool {
	for _, h := range deadLetterHeaders {
		if name == h {
			return true
		}
	}
	return false
}

// DeadLetters returns the function the consumer calls (consumer.WithDeadLetters)
// to dead-letter a record: it adds the original record (key, value and
// headers, unchanged) to o, addressed to the record's topic plus suffix
// (DefaultDeadLetterSuffix when suffix is ""), with the Header* dead-letter
// headers describing why. The row commits with the transaction that lets the
// record's offset advance, or rolls back with it, in which case nothing is
// dead-lettered and the record is processed again. Dead-letter headers
// already on the record (a replayed dead letter that failed again) are
// replaced; header names that are not valid UTF-8 or hold NUL bytes are
// repaired (NULs dropped, invalid bytes replaced by U+FFFD). The returned
// function fails like Outbox.Add. A nil o means the
// default table.
func DeadLetters(o *Outbox, suffix string) handler.DeadLetterFunc {
	if o == nil {
		o = New()
	}
	if suffix == "" {
		suffix = DefaultDeadLetterSuffix
	}
	return func(ctx context.Context, tx pgx.Tx, rec handler.Record, handlerName string, attempts int, reason error) error {
		hs := make([]handler.Header, 0, len(rec.Headers)+len(deadLetterHeaders))
		for _, h := range rec.Headers {
			if !isDeadLetterHeader(h.Key) {
				// A header name the outbox cannot store (invalid UTF-8,
				// NUL) must not keep the record from its dead-letter
				// topic: the name is repaired, the value kept.
				h.Key = strings.ToValidUTF8(strings.ReplaceAll(h.Key, "\x00", ""), "\uFFFD")
				hs = append(hs, h)
			}
		}
		why := "unknown"
		if reason != nil {
			why = reason.Error()
		}
		why = strings.ToValidUTF8(why, "\uFFFD")
		hs = append(hs,
			handler.Header{Key: HeaderError, Value: []byte(why)},
			handler.Header{Key: HeaderAttempts, Value: strconv.AppendInt(nil, int64(attempts), 10)},
			handler.Header{Key: HeaderHandler, Value: []byte(handlerName)},
			handler.Header{Key: HeaderOriginalTopic, Value: []byte(rec.Topic)},
			handler.Header{Key: HeaderOriginalPartition, Value: strconv.AppendInt(nil, int64(rec.Partition), 10)},
			handler.Header{Key: HeaderOriginalOffset, Value: strconv.AppendInt(nil, rec.Offset, 10)},
			handler.Header{Key: HeaderDeadLetteredAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
		)
		// The original headers verbatim, trace context included: no
		// injection from ctx, so a replay restores them as they were.
		err := o.add(ctx, tx, Message{Topic: rec.Topic + suffix, Key: rec.Key, Value: rec.Value, Headers: hs}, false)
		if err != nil {
			return fmt.Errorf("outbox: dead-lettering %s: %w", rec.Coordinates(), err)
		}
		return nil
	}
}
