package outbox

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/exactly-go/exactly/handler"
)

// Kafka's limits that Add checks, and the sizes the relay's producer uses.
const (
	// MaxTopicLen is the longest legal Kafka topic name.
	MaxTopicLen = 249
	// DefaultBrokerMaxMessageBytes is Kafka's default message.max.bytes
	// (and a topic's default max.message.bytes): the largest record batch
	// a broker accepts. The relay's producer batch limit never exceeds it.
	DefaultBrokerMaxMessageBytes = 1048588
	// recordBatchOverhead is the size of a record batch's header (v2): the
	// bytes a batch of one record adds to the record.
	recordBatchOverhead = 61
	// DefaultMaxRecordBytes is the largest record Add accepts and the
	// relay produces unless configured otherwise: a batch holding just that
	// record is exactly DefaultBrokerMaxMessageBytes.
	DefaultMaxRecordBytes = DefaultBrokerMaxMessageBytes - recordBatchOverhead
)

// MessageError describes why Add (or a dead-letter function, or the relay)
// refused a message. It wraps ErrInvalidMessage, so both errors.Is(err,
// ErrInvalidMessage) and errors.As(err, &*MessageError) work.
type MessageError struct {
	// Topic is the message's topic, as given.
	Topic string
	// Reason says what is wrong, e.g. "topic name is 250 characters, over
	// Kafka's 249" or "record is 2000000 bytes, over the 1048527-byte limit".
	Reason string
	// Size and Limit are the record's encoded size and the limit it broke,
	// both 0 when the problem is not the size.
	Size, Limit int
}

// Error names the topic (cut to 64 bytes) and what is wrong.
func (e *MessageError) Error() string {
	t := e.Topic
	if len(t) > 64 {
		t = t[:64] + "…"
	}
	return fmt.Sprintf("outbox: invalid message to %q: %s", t, e.Reason)
}

// Unwrap returns ErrInvalidMessage.
func (e *MessageError) Unwrap() error { return ErrInvalidMessage }

// ValidateTopic reports whether topic is a legal Kafka topic name: 1 to 249
// characters from [a-zA-Z0-9._-], and not "." or "..". It returns a
// *MessageError saying what is wrong, or nil.
func ValidateTopic(topic string) error {
	switch {
	case topic == "":
		return &MessageError{Topic: topic, Reason: "empty topic"}
	case topic == "." || topic == "..":
		return &MessageError{Topic: topic, Reason: `topic name "." and ".." are not allowed by Kafka`}
	case len(topic) > MaxTopicLen:
		return &MessageError{Topic: topic, Reason: fmt.Sprintf("topic name is %d characters, over Kafka's %d", len(topic), MaxTopicLen)}
	}
	for i := 0; i < len(topic); i++ {
		if !legalTopicByte(topic[i]) {
			return &MessageError{Topic: topic, Reason: fmt.Sprintf("topic name has %q at byte %d; Kafka allows only [a-zA-Z0-9._-]", topic[i], i)}
		}
	}
	return nil
}

func legalTopicByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// RecordSize returns the bytes a record with key, value and headers takes
// in a Kafka record batch, by Kafka's v2 encoding with every varint counted
// at its largest: at least the real size, so a record within a limit by
// RecordSize is within it on the wire.
func RecordSize(key, value []byte, headers []handler.Header) int {
	return recordSize(key, value, headers)
}

// header is a record header type: handler.Header or kgo.RecordHeader.
type header interface {
	~struct {
		Key   string
		Value []byte
	}
}

// recordSize is RecordSize for either header type, so the checks before a
// row is stored and before it is produced size it the same way.
func recordSize[H header](key, value []byte, headers []H) int {
	// length, attributes, timestamp delta, offset delta, key length,
	// value length, header count.
	n := 5 + 1 + 10 + 5 + 5 + len(key) + 5 + len(value) + 5
	for _, h := range headers {
		kv := struct {
			Key   string
			Value []byte
		}(h)
		n += 5 + len(kv.Key) + 5 + len(kv.Value)
	}
	return n
}

// relayHeaderBytes bounds what the relay adds to every record: its
// message-id (a UUID or the message's ID) and exactly-outbox-id headers.
func relayHeaderBytes(id string) int {
	return 10 + len(HeaderMessageID) + max(len(id), 36) + 10 + len(HeaderOutboxID) + 20
}

// checkSize returns a *MessageError when msg, with the headers the relay
// adds, is over limit bytes.
func checkSize(msg Message, headers []handler.Header, limit int) error {
	size := RecordSize(msg.Key, msg.Value, headers) + relayHeaderBytes(msg.ID)
	if size > limit {
		return &MessageError{Topic: msg.Topic, Size: size, Limit: limit,
			Reason: fmt.Sprintf("record is %d bytes (key %d, value %d, %d headers, with the relay's headers), over the %d-byte limit",
				size, len(msg.Key), len(msg.Value), len(headers), limit)}
	}
	return nil
}

// legalTopic returns topic when it is a legal Kafka topic name, and
// otherwise a legal one derived from it: illegal bytes become '_', and a
// name over 249 characters is cut to leave room for "-" and the first 16 hex
// digits of the SHA-256 of the original name, so distinct long names stay
// distinct. "." and ".." become "_" and "__".
func legalTopic(topic string) string {
	if ValidateTopic(topic) == nil {
		return topic
	}
	b := []byte(topic)
	for i, c := range b {
		if !legalTopicByte(c) {
			b[i] = '_'
		}
	}
	s := string(b)
	if s == "" {
		s = "_"
	}
	if s == "." || s == ".." {
		s = strings.Repeat("_", len(s))
	}
	if len(s) > MaxTopicLen {
		sum := sha256.Sum256([]byte(topic))
		suffix := "-" + hex.EncodeToString(sum[:8])
		s = s[:MaxTopicLen-len(suffix)] + suffix
	}
	return s
}
