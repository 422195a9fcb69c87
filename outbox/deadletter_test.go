package outbox_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// deadLetter dead-letters rec in a committed transaction.
func (e *env) deadLetter(t *testing.T, rec handler.Record, reason string) {
	t.Helper()
	ctx := context.Background()
	dl := outbox.DeadLetters(e.ob, "")
	if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return dl(ctx, tx, rec, "billing", 5, errors.New(reason))
	}); err != nil {
		t.Fatal(err)
	}
}

func TestDeadLettersAndReplay(t *testing.T) {
	e := setup(t, 2, "orders", "orders.dlq")
	ctx := context.Background()
	before := time.Now().UTC()
	for i := range 4 {
		key := "k" + strconv.Itoa(i%2) // k0, k1, k0, k1
		e.deadLetter(t, handler.Record{
			Topic: "orders", Partition: 1, Offset: int64(100 + i),
			Key: []byte(key), Value: []byte("v" + strconv.Itoa(i)),
			Headers: []handler.Header{{Key: "app", Value: []byte("x")}, {Key: outbox.HeaderMessageID, Value: []byte("orig-" + strconv.Itoa(i))}},
		}, "handler failed: boom")
	}
	// A rolled-back dead letter is no dead letter.
	tx := e.begin(t)
	if err := outbox.DeadLetters(e.ob, "")(ctx, tx, handler.Record{Topic: "orders", Key: []byte("rb")}, "billing", 1, errors.New("x")); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)
	e.startRelay(t, e.fastConfig(t))

	dlq := e.consume(t, "orders.dlq").waitFor(4, 10*time.Second)
	r := dlq[0]
	for _, r := range dlq {
		if string(r.Key) == "rb" {
			t.Fatal("rolled-back dead letter published")
		}
	}
	want := map[string]string{
		outbox.HeaderError:             "handler failed: boom",
		outbox.HeaderAttempts:          "5",
		outbox.HeaderHandler:           "billing",
		outbox.HeaderOriginalTopic:     "orders",
		outbox.HeaderOriginalPartition: "1",
		"app":                          "x",
	}
	for k, v := range want {
		if got, ok := header(r, k); !ok || got != v {
			t.Errorf("dead letter header %s = %q, %v; want %q", k, got, ok, v)
		}
	}
	if off, _ := header(r, outbox.HeaderOriginalOffset); off != "100" && off != "101" {
		t.Errorf("original offset %q", off)
	}
	at, _ := header(r, outbox.HeaderDeadLetteredAt)
	if ts, err := time.Parse(time.RFC3339, at); err != nil || ts.Before(before.Add(-time.Second)) || ts.After(time.Now().Add(time.Second)) {
		t.Errorf("dead-lettered-at %q: %v", at, err)
	}
	if id, _ := header(r, outbox.HeaderMessageID); id != "orig-0" && id != "orig-1" {
		t.Errorf("dead letter message-id %q, want the original's", id)
	}

	// Filters: key k1 only, limit 1 → the first k1 record (v1).
	res, err := outbox.Replay(ctx, e.brokers, outbox.ReplayOptions{Topic: "orders.dlq", Key: []byte("k1"), Limit: 1})
	if err != nil || res.Replayed != 1 {
		t.Fatalf("Replay = %+v, %v; want 1 replayed", res, err)
	}
	orders := e.consume(t, "orders")
	got := orders.waitFor(1, 10*time.Second)[0]
	if string(got.Key) != "k1" || string(got.Value) != "v1" {
		t.Fatalf("replayed %q=%q, want k1=v1", got.Key, got.Value)
	}
	for _, h := range got.Headers {
		if h.Key != "app" && h.Key != outbox.HeaderMessageID {
			t.Errorf("replayed record has header %s", h.Key)
		}
	}
	if id, _ := header(got, outbox.HeaderMessageID); id != "orig-1" {
		t.Errorf("replayed message-id %q, want orig-1", id)
	}

	// Time window: nothing before the dead letters, all within.
	res, err = outbox.Replay(ctx, e.brokers, outbox.ReplayOptions{Topic: "orders.dlq", Until: before.Add(-time.Second)})
	if err != nil || res.Replayed != 0 || res.Filtered != 4 {
		t.Fatalf("Replay until before = %+v, %v; want 0 replayed, 4 filtered", res, err)
	}
	res, err = outbox.Replay(ctx, e.brokers, outbox.ReplayOptions{Topic: "orders.dlq", Since: before.Add(-time.Second), DryRun: true})
	if err != nil || res.Replayed != 4 {
		t.Fatalf("dry run = %+v, %v; want 4", res, err)
	}
	if n := e.produced(t, "orders"); n != 1 {
		t.Fatalf("%d records in orders after a dry run, want 1", n)
	}
	res, err = outbox.Replay(ctx, e.brokers, outbox.ReplayOptions{Topic: "orders.dlq", Key: []byte("k0")})
	if err != nil || res.Replayed != 2 || res.Filtered != 2 || res.Read != 4 {
		t.Fatalf("Replay k0 = %+v, %v", res, err)
	}
	recs := orders.waitFor(3, 10*time.Second)
	if string(recs[1].Value) != "v0" || string(recs[2].Value) != "v2" {
		t.Fatalf("k0 replayed as %q, %q; want v0, v2 in order", recs[1].Value, recs[2].Value)
	}

	if _, err := outbox.Replay(ctx, e.brokers, outbox.ReplayOptions{Topic: "no-such.dlq"}); err == nil {
		t.Fatal("Replay of a missing topic succeeded")
	}
}

// TestReplayHoldsTheKeyOfATruncatedDeadLetter: once Replay refuses a
// truncated dead letter, the later dead letters of its original topic and
// key are held (skipped, counted), not republished ahead of it; other keys,
// keyless ones and earlier ones are replayed. A dead letter whose key was
// cut holds the whole key by HeaderOriginalKeySHA256.
func TestReplayHoldsTheKeyOfATruncatedDeadLetter(t *testing.T) {
	e := setup(t, 1, "orders", "orders.dlq")
	ctx := context.Background()
	long := []byte("a-key-too-long-to-keep-whole")
	longSum := sha256.Sum256(long)
	dl := func(key []byte, value string, truncated bool, extra ...kgo.RecordHeader) *kgo.Record {
		r := &kgo.Record{Topic: "orders.dlq", Key: key, Value: []byte(value), Headers: append([]kgo.RecordHeader{
			{Key: outbox.HeaderMessageID, Value: []byte("id-" + value)},
			{Key: outbox.HeaderOriginalTopic, Value: []byte("orders")},
		}, extra...)}
		if truncated {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: outbox.HeaderTruncated, Value: []byte("true")})
		}
		return r
	}
	testenv.Produce(t, e.brokers,
		dl([]byte("k"), "k1", false),
		dl([]byte("k"), "k2-cut", true),
		dl([]byte("j"), "j1", false),
		dl([]byte("k"), "k3", false),
		dl(nil, "nokey-cut", true),
		dl(nil, "nokey", false),
		dl(long[:5], "long-cut", true, kgo.RecordHeader{Key: outbox.HeaderOriginalKeySHA256, Value: []byte(hex.EncodeToString(longSum[:]))}),
		dl(long, "long2", false),
		dl([]byte("k"), "k4", false),
	)
	res, err := outbox.Replay(ctx, e.brokers, outbox.ReplayOptions{Topic: "orders.dlq"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Read != 9 || res.Replayed != 3 || res.Truncated != 3 || res.Held != 3 {
		t.Fatalf("Replay = %+v; want 9 read, 3 replayed (k1, j1, nokey), 3 truncated, 3 held (k3, long2, k4)", res)
	}
	var got []string
	for _, r := range e.consume(t, "orders").waitFor(3, 10*time.Second) {
		got = append(got, string(r.Value))
	}
	if strings.Join(got, ",") != "k1,j1,nokey" {
		t.Fatalf("replayed %v, want k1, j1, nokey", got)
	}
	if n := e.produced(t, "orders"); n != 3 {
		t.Fatalf("%d records replayed, want 3", n)
	}
}

// A dead-letter topic written in Kafka transactions ends in a commit
// marker, which takes the last offset but is no record: Replay reads to it,
// replays the dead letter and returns, instead of waiting for that offset
// until its context ends. The marker is not counted as read.
func TestReplayEndsAtATransactionMarker(t *testing.T) {
	e := setup(t, 1, "orders", "orders.dlq")
	tx, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.TransactionalID("dlq-writer"))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	if err := tx.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	dead := &kgo.Record{Topic: "orders.dlq", Key: []byte("k"), Value: []byte("v"),
		Headers: []kgo.RecordHeader{{Key: outbox.HeaderOriginalTopic, Value: []byte("orders")}}}
	if err := tx.ProduceSync(t.Context(), dead).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := tx.EndTransaction(t.Context(), kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	res, err := outbox.Replay(ctx, e.brokers, outbox.ReplayOptions{Topic: "orders.dlq"})
	if err != nil {
		t.Fatalf("replaying a topic that ends in a commit marker: %v (%+v)", err, res)
	}
	if res.Read != 1 || res.Replayed != 1 {
		t.Fatalf("Replay = %+v, want the one dead letter read and replayed", res)
	}
	if got := e.consume(t, "orders").waitFor(1, 10*time.Second); string(got[0].Value) != "v" {
		t.Fatalf("replayed %q, want v", got[0].Value)
	}
}
