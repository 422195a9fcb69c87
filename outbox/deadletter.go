package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/redact"
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
	// HeaderTruncated is "true" on a dead letter whose record was too
	// large to publish whole: its value was cut (and, if that was not
	// enough, its original headers dropped and its key cut). Replay
	// refuses such dead letters.
	HeaderTruncated = "exactly-truncated"
	// HeaderOriginalSize is the original value's size in bytes (decimal),
	// on a truncated dead letter.
	HeaderOriginalSize = "exactly-original-size"
	// HeaderOriginalSHA256 is the SHA-256 of the original value (hex), on
	// a truncated dead letter.
	HeaderOriginalSHA256 = "exactly-original-sha256"
	// HeaderOriginalKeySHA256 is the SHA-256 of the original key (hex), on
	// a truncated dead letter whose key was cut: Replay holds the later
	// dead letters of that key by it.
	HeaderOriginalKeySHA256 = "exactly-original-key-sha256"
)

// MaxErrorHeaderBytes bounds the HeaderError value: the error text, with
// connection-string secrets redacted, cut to this many bytes.
const MaxErrorHeaderBytes = 1024

// What a dead letter whose key must be cut keeps room for besides its key,
// whatever the key: the error text and handler name up to these sizes (cut
// further only when the message id is longer than deadLetterIDRoom), so the
// cut key depends on the key, the original topic and the limit only.
const (
	deadLetterReasonRoom  = 256
	deadLetterHandlerRoom = 128
	deadLetterIDRoom      = 128
)

// deadLetterHeaders are the headers DeadLetters adds and Replay removes.
var deadLetterHeaders = [...]string{
	HeaderError, HeaderAttempts, HeaderHandler, HeaderOriginalTopic,
	HeaderOriginalPartition, HeaderOriginalOffset, HeaderDeadLetteredAt,
	HeaderTruncated, HeaderOriginalSize, HeaderOriginalSHA256, HeaderOriginalKeySHA256,
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
// dead-lettered and the record is processed again.
//
// It never writes a row the relay could not publish:
//   - The dead letter keeps the record's message-id (Message.ID) when it
//     has one, so a replay republishes it under its original id.
//   - HeaderError holds the error text with connection-string passwords
//     redacted, cut to MaxErrorHeaderBytes.
//   - A record too large for o's limit once the dead-letter headers are
//     added keeps a bounded value: its value is cut to fit and the headers
//     HeaderTruncated ("true"), HeaderOriginalSize and HeaderOriginalSHA256
//     (of the whole value) are added; if that is not enough its original
//     headers are dropped, then the error text and handler name are cut.
//     A key too long to leave room for the dead-letter headers (over the
//     limit less about 1.3 KB, or over half a limit under 2.6 KB) is
//     always cut, to a length that depends only on the original topic and
//     the limit, never on the error text, so every dead letter of one key
//     gets the same key; HeaderOriginalKeySHA256 names the whole key.
//     Replay refuses truncated dead letters (and holds the later ones of
//     their key): the original must be recovered from its source.
//   - A dead-letter topic name that Kafka would refuse (over 249
//     characters, or a suffix with characters outside [a-zA-Z0-9._-]) is
//     replaced by a legal one: illegal characters become '_', and the
//     original topic is cut to leave room for "-", the first 16 hex digits
//     of the SHA-256 of the original topic, and the suffix.
//
// Dead-letter headers already on the record (a replayed dead letter that
// failed again) are replaced; header names that are not valid UTF-8 or hold
// NUL bytes are repaired (NULs dropped, invalid bytes replaced by U+FFFD).
// The returned function fails like Outbox.Add. A nil o means the default
// table.
func DeadLetters(o *Outbox, suffix string) handler.DeadLetterFunc {
	if o == nil {
		o = New()
	}
	if suffix == "" {
		suffix = DefaultDeadLetterSuffix
	}
	return func(ctx context.Context, tx pgx.Tx, rec handler.Record, handlerName string, attempts int, reason error) error {
		msg := Message{Topic: DeadLetterTopic(rec.Topic, suffix), Key: rec.Key, Value: rec.Value}
		var orig []handler.Header
		for _, h := range rec.Headers {
			switch {
			case h.Key == HeaderMessageID:
				msg.ID = strings.ToValidUTF8(string(h.Value), "\uFFFD")
			case !isDeadLetterHeader(h.Key) && h.Key != HeaderOutboxID:
				// A header name the outbox cannot store (invalid UTF-8,
				// NUL) must not keep the record from its dead-letter
				// topic: the name is repaired, the value kept.
				h.Key = strings.ToValidUTF8(strings.ReplaceAll(h.Key, "\x00", ""), "\uFFFD")
				orig = append(orig, h)
			}
		}
		why := "unknown"
		if reason != nil {
			why = reason.Error()
		}
		dl := []handler.Header{
			{Key: HeaderError, Value: []byte(boundText(redact.Text(why), MaxErrorHeaderBytes))},
			{Key: HeaderAttempts, Value: strconv.AppendInt(nil, int64(attempts), 10)},
			{Key: HeaderHandler, Value: []byte(boundText(handlerName, MaxErrorHeaderBytes))},
			{Key: HeaderOriginalTopic, Value: []byte(rec.Topic)},
			{Key: HeaderOriginalPartition, Value: strconv.AppendInt(nil, int64(rec.Partition), 10)},
			{Key: HeaderOriginalOffset, Value: strconv.AppendInt(nil, rec.Offset, 10)},
			{Key: HeaderDeadLetteredAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
		}
		msg.Headers = append(orig, dl...)
		if len(msg.Key) > keyBudget(o.maxRecord, dl) || checkSize(msg, msg.Headers, o.maxRecord) != nil {
			msg = truncateDeadLetter(msg, orig, dl, o.maxRecord)
		}
		// The original headers verbatim, trace context included: no
		// injection from ctx, so a replay restores them as they were.
		if err := o.add(ctx, tx, msg, false, false); err != nil {
			return fmt.Errorf("outbox: dead-lettering %s: %w", rec.Coordinates(), err)
		}
		return nil
	}
}

// truncateDeadLetter returns msg cut to fit limit, with the truncation
// headers added: a key longer than keyBudget cut to it (and
// HeaderOriginalKeySHA256 added), the value cut, then, if needed, the
// original headers dropped, then the error text, the handler name and (a
// long) message id cut.
func truncateDeadLetter(msg Message, orig, dl []handler.Header, limit int) Message {
	sum := sha256.Sum256(msg.Value)
	dl = append(dl,
		handler.Header{Key: HeaderTruncated, Value: []byte("true")},
		handler.Header{Key: HeaderOriginalSize, Value: strconv.AppendInt(nil, int64(len(msg.Value)), 10)},
		handler.Header{Key: HeaderOriginalSHA256, Value: []byte(hex.EncodeToString(sum[:]))},
	)
	if budget := keyBudget(limit, dl); len(msg.Key) > budget {
		keySum := sha256.Sum256(msg.Key)
		dl = append(dl, handler.Header{Key: HeaderOriginalKeySHA256, Value: []byte(hex.EncodeToString(keySum[:]))})
		msg.Key = msg.Key[:budget]
	}
	value := msg.Value
	msg.Value = nil
	msg.Headers = append(orig, dl...)
	room := limit - (RecordSize(msg.Key, nil, msg.Headers) + relayHeaderBytes(msg.ID))
	if room < 0 {
		msg.Headers = dl
		room = limit - (RecordSize(msg.Key, nil, msg.Headers) + relayHeaderBytes(msg.ID))
	}
	// The rest gives way to the key: the error text, then the handler
	// name, then a message id longer than deadLetterIDRoom.
	for _, name := range []string{HeaderError, HeaderHandler} {
		for i, h := range msg.Headers {
			if room < 0 && h.Key == name {
				v := boundText(string(h.Value), max(len("…"), len(h.Value)+room))
				room += len(h.Value) - len(v)
				msg.Headers[i].Value = []byte(v)
			}
		}
	}
	if room < 0 {
		room += relayHeaderBytes(msg.ID) - relayHeaderBytes("")
		msg.ID = ""
	}
	msg.Value = value[:min(max(room, 0), len(value))]
	return msg
}

// keyBudget returns the longest key a dead letter with the dead-letter
// headers dl keeps within limit: limit less the
// largest those headers can be (every dead-letter header, the error text
// and handler name at deadLetterReasonRoom and deadLetterHandlerRoom, the
// numbers and time at their widest, the original topic as it is) and the
// relay's headers with a message id of deadLetterIDRoom bytes, or half the
// limit if that is more. It depends
// on the original topic and limit only, never on the error text, so every
// dead letter of one key gets the same cut key.
func keyBudget(limit int, dl []handler.Header) int {
	widest := map[string]int{
		HeaderError: deadLetterReasonRoom, HeaderHandler: deadLetterHandlerRoom, HeaderAttempts: 20,
		HeaderOriginalPartition: 11, HeaderOriginalOffset: 20, HeaderDeadLetteredAt: len(time.RFC3339Nano),
		HeaderTruncated: len("true"), HeaderOriginalSize: 20, HeaderOriginalSHA256: 64, HeaderOriginalKeySHA256: 64,
	}
	for _, h := range dl {
		if h.Key == HeaderOriginalTopic {
			widest[h.Key] = len(h.Value)
		}
	}
	worst := make([]handler.Header, 0, len(deadLetterHeaders))
	for _, name := range deadLetterHeaders {
		worst = append(worst, handler.Header{Key: name, Value: make([]byte, widest[name])})
	}
	// Under a small limit (a few KB), the key keeps half of it.
	return max(limit/2, limit-RecordSize(nil, nil, worst)-relayHeaderBytes(strings.Repeat("x", deadLetterIDRoom)))
}

// DeadLetterTopic returns the dead-letter topic of topic with suffix
// (DefaultDeadLetterSuffix when ""): topic+suffix when that is a legal Kafka
// topic name, else a legal name derived from it as DeadLetters documents.
func DeadLetterTopic(topic, suffix string) string {
	if suffix == "" {
		suffix = DefaultDeadLetterSuffix
	}
	if ValidateTopic(topic+suffix) == nil {
		return topic + suffix
	}
	suffix = legalTopic(suffix)
	if len(suffix) > MaxTopicLen/2 {
		suffix = suffix[:MaxTopicLen/2]
	}
	base := legalTopic(topic)
	if len(base)+len(suffix) <= MaxTopicLen {
		if t := base + suffix; ValidateTopic(t) == nil {
			return t
		}
	}
	sum := sha256.Sum256([]byte(topic))
	tag := "-" + hex.EncodeToString(sum[:8])
	return base[:min(len(base), MaxTopicLen-len(suffix)-len(tag))] + tag + suffix
}
