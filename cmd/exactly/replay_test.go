package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

func TestReplayCommandRepublishesFilteredDeadLetters(t *testing.T) {
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "orders", "orders.dlq"))
	t.Setenv("EXACTLY_KAFKA_BROKERS", strings.Join(brokers, ","))
	dl := func(key, value, at string) *kgo.Record {
		return &kgo.Record{Topic: "orders.dlq", Key: []byte(key), Value: []byte(value), Headers: []kgo.RecordHeader{
			{Key: "app", Value: []byte("x")},
			{Key: outbox.HeaderOriginalTopic, Value: []byte("orders")},
			{Key: outbox.HeaderError, Value: []byte("boom")},
			{Key: outbox.HeaderDeadLetteredAt, Value: []byte(at)},
		}}
	}
	testenv.Produce(t, brokers,
		dl("a", "old", "2020-01-01T00:00:00Z"),
		dl("a", "new-1", "2026-01-01T00:00:00Z"),
		dl("b", "new-b", "2026-01-01T00:00:00Z"),
		dl("a", "new-2", "2026-01-02T00:00:00Z"))

	var out bytes.Buffer
	err := runReplay(t.Context(), []string{"-topic", "orders.dlq", "-key", "a", "-since", "2025-01-01T00:00:00Z", "-limit", "1"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "replayed 1 of ") {
		t.Fatalf("output %q", out.String())
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) == 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("no replayed record")
		}
		recs = append(recs, fs.Records()...)
	}
	r := recs[0]
	if string(r.Key) != "a" || string(r.Value) != "new-1" || len(r.Headers) != 1 || r.Headers[0].Key != "app" {
		t.Fatalf("replayed %q=%q headers %v", r.Key, r.Value, r.Headers)
	}
}

func TestReplayAndRelayNameMissingVariables(t *testing.T) {
	t.Setenv("EXACTLY_KAFKA_BROKERS", "")
	var out bytes.Buffer
	if err := runReplay(t.Context(), []string{"-topic", "x.dlq"}, &out); !errors.Is(err, errNoKafkaBrokers) {
		t.Fatalf("replay err = %v, want errNoKafkaBrokers", err)
	}
	if err := runRelay(t.Context(), nil, &out); !errors.Is(err, errNoKafkaBrokers) || !strings.Contains(err.Error(), "EXACTLY_KAFKA_BROKERS") {
		t.Fatalf("relay err = %v, want errNoKafkaBrokers", err)
	}
	t.Setenv("EXACTLY_KAFKA_BROKERS", "localhost:1")
	t.Setenv("DATABASE_URL", "")
	if err := runRelay(t.Context(), nil, &out); !errors.Is(err, errNoDatabaseURL) {
		t.Fatalf("relay err = %v, want errNoDatabaseURL", err)
	}
	if err := runReplay(t.Context(), nil, &out); err == nil || !strings.Contains(err.Error(), "-topic") {
		t.Fatalf("replay without -topic: %v", err)
	}
	if err := runReplay(t.Context(), []string{"-topic", "x", "-since", "yesterday"}, &out); err == nil {
		t.Fatal("bad -since accepted")
	}
}

// TestReplayCommandRefusesTruncatedDeadLetters: a dead letter cut to fit
// (exactly-truncated: true) is not republished, and the command says why
// and where to find the original; the later dead letter of its key is held
// and reported; the whole one of another key is republished with its
// original message-id.
func TestReplayCommandRefusesTruncatedDeadLetters(t *testing.T) {
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "orders", "orders.dlq"))
	t.Setenv("EXACTLY_KAFKA_BROKERS", strings.Join(brokers, ","))
	dl := func(key, value string, truncated bool) *kgo.Record {
		r := &kgo.Record{Topic: "orders.dlq", Key: []byte(key), Value: []byte(value), Headers: []kgo.RecordHeader{
			{Key: outbox.HeaderMessageID, Value: []byte("orig-" + value)},
			{Key: outbox.HeaderOriginalTopic, Value: []byte("orders")},
		}}
		if truncated {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: outbox.HeaderTruncated, Value: []byte("true")})
		}
		return r
	}
	testenv.Produce(t, brokers, dl("k", "cut", true), dl("j", "whole", false), dl("k", "after", false))
	var out bytes.Buffer
	if err := runReplay(t.Context(), []string{"-topic", "orders.dlq"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "replayed 1 of 3") || !strings.Contains(out.String(), "refused 1 truncated dead letters") ||
		!strings.Contains(out.String(), outbox.HeaderOriginalOffset) || !strings.Contains(out.String(), "held 1 later dead letters") {
		t.Fatalf("output %q", out.String())
	}
	recs := testenv.ReadTopic(t, brokers, "orders", 1)
	if id := recs[0].Headers; string(recs[0].Value) != "whole" || len(id) != 1 || string(id[0].Value) != "orig-whole" {
		t.Fatalf("replayed %q with headers %v", recs[0].Value, recs[0].Headers)
	}
}

// replay -dry-run lists each dead letter it would replay (key, original
// coordinates, error) and publishes nothing.
func TestReplayDryRunListsWhatItWouldReplay(t *testing.T) {
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "orders", "orders.dlq"))
	t.Setenv("EXACTLY_KAFKA_BROKERS", strings.Join(brokers, ","))
	testenv.Produce(t, brokers,
		deadLetter("order-1", "boom 1", "7", "2026-01-01T00:00:00Z"),
		deadLetter("order-2", "other", "8", "2026-01-01T00:01:00Z"),
		deadLetter("order-1", "boom 2", "9", "2026-01-01T00:02:00Z"))
	var out bytes.Buffer
	if err := runReplay(t.Context(), []string{"-topic", "orders.dlq", "-key", "order-1", "-dry-run"}, &out); err != nil {
		t.Fatal(err)
	}
	want := `would replay "orders.dlq"/0@0  key "order-1"  (from "orders"/0@7)  dead-lettered 2026-01-01T00:00:00Z  error "boom 1"
would replay "orders.dlq"/0@2  key "order-1"  (from "orders"/0@9)  dead-lettered 2026-01-01T00:02:00Z  error "boom 2"
would replay 2 of 3 dead letters from orders.dlq (1 filtered out, 0 without an original topic)
`
	if out.String() != want {
		t.Errorf("replay -dry-run said\n%s\nwant\n%s", out.String(), want)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(t.Context(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := ends.Lookup("orders", 0); o.Offset != 0 {
		t.Errorf("orders holds %d records after a dry run, want 0", o.Offset)
	}
}
