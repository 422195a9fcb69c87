package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// deadLetter is a dead letter of key on orders.dlq as the consumer writes
// it, consumed from orders partition 0 at offset off.
func deadLetter(key, reason, off, at string) *kgo.Record {
	return &kgo.Record{Topic: "orders.dlq", Key: []byte(key), Value: []byte("v"), Headers: []kgo.RecordHeader{
		{Key: outbox.HeaderError, Value: []byte(reason)},
		{Key: outbox.HeaderAttempts, Value: []byte("3")},
		{Key: outbox.HeaderHandler, Value: []byte("credit")},
		{Key: outbox.HeaderOriginalTopic, Value: []byte("orders")},
		{Key: outbox.HeaderOriginalPartition, Value: []byte("0")},
		{Key: outbox.HeaderOriginalOffset, Value: []byte(off)},
		{Key: outbox.HeaderDeadLetteredAt, Value: []byte(at)},
	}}
}

func TestDeadlettersCommandListsTheLatest(t *testing.T) {
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "orders", "orders.dlq"))
	t.Setenv("EXACTLY_KAFKA_BROKERS", strings.Join(brokers, ","))
	testenv.Produce(t, brokers,
		deadLetter("order-1", "boom 1", "7", "2026-01-01T00:00:00Z"),
		deadLetter("order-2", "other", "8", "2026-01-01T00:01:00Z"),
		deadLetter("order-1", "boom 2", "9", "2026-01-01T00:02:00Z"))

	var out bytes.Buffer
	if err := runDeadletters(t.Context(), []string{"-n", "2"}, &out); err != nil {
		t.Fatalf("deadletters: %v\n%s", err, out.String())
	}
	text := out.String()
	for _, want := range []string{`"orders.dlq": 3 records, showing 2`, `2026-01-01T00:02:00Z  "order-1"  "orders"/0@9  3         "credit"  "boom 2"`, `"order-2"`} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "boom 1") {
		t.Errorf("-n 2 listed the oldest dead letter:\n%s", text)
	}

	out.Reset()
	if err := runDeadletters(t.Context(), []string{"-json", "-topic", "orders.dlq", "-key", "order-1", "-n", "0"}, &out); err != nil {
		t.Fatalf("deadletters -json: %v\n%s", err, out.String())
	}
	var topics []struct {
		Topic   string
		Records int64
		Letters []struct {
			Key, Error     string
			OriginalOffset *int64 `json:"original_offset"`
		}
	}
	if err := json.Unmarshal(out.Bytes(), &topics); err != nil {
		t.Fatalf("-json output: %v\n%s", err, out.String())
	}
	if len(topics) != 1 || len(topics[0].Letters) != 2 || topics[0].Letters[0].Error != "boom 1" ||
		topics[0].Letters[1].OriginalOffset == nil || *topics[0].Letters[1].OriginalOffset != 9 {
		t.Errorf("-key order-1 -json: %s; want both dead letters of order-1", out.String())
	}

	if err := runDeadletters(t.Context(), []string{"-n", "-1"}, &out); err == nil {
		t.Error("-n -1 accepted")
	}
	t.Setenv("EXACTLY_KAFKA_BROKERS", "")
	if err := runDeadletters(t.Context(), nil, &out); err == nil {
		t.Error("no EXACTLY_KAFKA_BROKERS accepted")
	}
}

// A 5,000-byte key is listed cut to 256 bytes with its length and hash
// (the rows stay short), a key that is not text as hex:… without quotes,
// and a text key that reads like hex in quotes: the two never look alike.
func TestDeadlettersBoundsAndMarksKeys(t *testing.T) {
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "orders", "orders.dlq"))
	t.Setenv("EXACTLY_KAFKA_BROKERS", strings.Join(brokers, ","))
	long := strings.Repeat("k", 5000)
	binary := deadLetter("", "bad bytes", "2", "2026-01-01T00:02:00Z")
	binary.Key = []byte{0xde, 0xad, 0xbe, 0xef}
	testenv.Produce(t, brokers,
		deadLetter(long, "long key", "1", "2026-01-01T00:01:00Z"),
		binary,
		deadLetter("hex:deadbeef", "looks like hex", "3", "2026-01-01T00:03:00Z"))
	var out bytes.Buffer
	if err := runDeadletters(t.Context(), nil, &out); err != nil {
		t.Fatalf("deadletters: %v\n%s", err, out.String())
	}
	text := out.String()
	for _, want := range []string{`"` + strings.Repeat("k", 256) + `…"(5000 bytes, sha256:`, "  hex:deadbeef  ", `  "hex:deadbeef"  `} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	for _, line := range strings.Split(text, "\n") {
		if len(line) > 1000 {
			t.Errorf("a %d-byte line: the long key is not bounded:\n%.300s…", len(line), line)
		}
	}
}
