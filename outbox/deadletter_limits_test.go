package outbox_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/outbox"
)

// hugeValue is a record that is undecodable and 1,048,450 bytes, so the
// broker accepted it, but over the limit once dead-letter headers are
// added.
func hugeValue() []byte {
	v := make([]byte, 1048450)
	for i := range v {
		v[i] = byte('a' + i%26)
	}
	v[0] = 0xff // not JSON
	return v
}

// TestOversizedDeadLetterIsTruncatedVisibly: a record too large to
// dead-letter whole is dead-lettered with a bounded value and headers giving
// the original size and SHA-256; the relay publishes it; Replay refuses it.
func TestOversizedDeadLetterIsTruncatedVisibly(t *testing.T) {
	e := setup(t, 1, "orders", "orders.dlq")
	ctx := context.Background()
	value := hugeValue()
	e.deadLetter(t, handler.Record{Topic: "orders", Partition: 0, Offset: 7, Key: []byte("k"), Value: value,
		Headers: []handler.Header{{Key: "app", Value: []byte("x")}, {Key: outbox.HeaderMessageID, Value: []byte("orig-id")}}}, "decoding: invalid character")
	e.startRelay(t, e.fastConfig(t))
	r := e.consume(t, "orders.dlq").waitFor(1, 15*time.Second)[0]
	sum := sha256.Sum256(value)
	for k, v := range map[string]string{
		outbox.HeaderTruncated:      "true",
		outbox.HeaderOriginalSize:   "1048450",
		outbox.HeaderOriginalSHA256: hex.EncodeToString(sum[:]),
		outbox.HeaderOriginalOffset: "7",
		outbox.HeaderMessageID:      "orig-id",
		"app":                       "x",
	} {
		if got, _ := header(r, k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if len(r.Value) >= len(value) || len(r.Value) < len(value)-4096 || string(r.Value) != string(value[:len(r.Value)]) {
		t.Errorf("dead letter value is %d bytes, want a prefix of the original a little under %d", len(r.Value), len(value))
	}
	res, err := outbox.Replay(ctx, e.brokers, outbox.ReplayOptions{Topic: "orders.dlq"})
	if err != nil || res.Truncated != 1 || res.Replayed != 0 {
		t.Fatalf("Replay = %+v, %v; want the truncated dead letter refused", res, err)
	}
	if n := e.produced(t, "orders"); n != 0 {
		t.Fatalf("%d records replayed from a truncated dead letter", n)
	}
}

// TestDeadLetterErrorHeaderIsBoundedAndScrubbed: the error text is cut to
// MaxErrorHeaderBytes and loses connection-string passwords.
func TestDeadLetterErrorHeaderIsBoundedAndScrubbed(t *testing.T) {
	e := setup(t, 1, "orders", "orders.dlq")
	reason := "connecting to postgres://app:s3cr3t-pw@db:5432/x failed (host=db password=hunter2 user=app): " + strings.Repeat("é", 3000)
	e.deadLetter(t, handler.Record{Topic: "orders", Key: []byte("k"), Value: []byte("v")}, reason)
	e.startRelay(t, e.fastConfig(t))
	r := e.consume(t, "orders.dlq").waitFor(1, 10*time.Second)[0]
	got, _ := header(r, outbox.HeaderError)
	if len(got) > outbox.MaxErrorHeaderBytes || strings.Contains(got, "s3cr3t") || strings.Contains(got, "hunter2") ||
		!strings.HasPrefix(got, "connecting to postgres://app:xxxxx@db:5432/x") || !strings.HasSuffix(got, "…") || !utf8Valid(got) {
		t.Fatalf("error header (%d bytes) = %.200q…", len(got), got)
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "") == s }

// TestDeadLetterTopicFallbackIsLegal: a record of a topic whose "<topic>.dlq"
// would be over 249 characters is dead-lettered to a legal, distinct topic
// that keeps the suffix, and the relay publishes it.
func TestDeadLetterTopicFallbackIsLegal(t *testing.T) {
	a, b := strings.Repeat("a", 247), strings.Repeat("a", 246)+"b"
	da, db := outbox.DeadLetterTopic(a, ""), outbox.DeadLetterTopic(b, "")
	for _, d := range []string{da, db} {
		if err := outbox.ValidateTopic(d); err != nil || !strings.HasSuffix(d, ".dlq") {
			t.Fatalf("DeadLetterTopic = %q: %v", d, err)
		}
	}
	if da == db {
		t.Fatalf("two long topics share the dead-letter topic %q", da)
	}
	if got := outbox.DeadLetterTopic("orders", "/bad suffix"); got != "orders_bad_suffix" {
		t.Fatalf("illegal suffix gives %q", got)
	}
	e := setup(t, 1, a)
	e.deadLetter(t, handler.Record{Topic: a, Key: []byte("k"), Value: []byte("v")}, "boom")
	e.startRelay(t, e.fastConfig(t))
	r := e.consume(t, da).waitFor(1, 10*time.Second)[0]
	if got, _ := header(r, outbox.HeaderOriginalTopic); got != a {
		t.Fatalf("original topic header %q", got)
	}
}

type event struct {
	N int `json:"n"`
}

// TestHugeUndecodableRecordDoesNotHaltTheRelay is hugeValue's case through
// the consumer: an undecodable 1,048,450-byte record, then five records
// whose handler emits one event each. The dead letter is truncated visibly
// and the five events are published.
func TestHugeUndecodableRecordDoesNotHaltTheRelay(t *testing.T) {
	ctx := context.Background()
	e := setup(t, 1, "cmds", "cmds.dlq", "events")
	if err := dedupe.Migrate(ctx, e.pool); err != nil {
		t.Fatal(err)
	}
	recs := []*kgo.Record{{Topic: "cmds", Key: []byte("huge"), Value: hugeValue()}}
	for i := 1; i <= 5; i++ {
		b, _ := json.Marshal(event{N: i})
		recs = append(recs, &kgo.Record{Topic: "cmds", Key: []byte("k" + strconv.Itoa(i)), Value: b})
	}
	// A producer at the broker's limit, as the one that wrote the record.
	pcl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ProducerBatchMaxBytes(outbox.DefaultBrokerMaxMessageBytes))
	if err != nil {
		t.Fatal(err)
	}
	if err := pcl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("producing the records: %v", err)
	}
	pcl.Close()

	h := handler.New("emit", handler.FromPayload(func(ev event) string { return dedupe.Key("emit", strconv.Itoa(ev.N)) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[event]) error {
			return e.ob.AddJSON(ctx, tx, "events", []byte(strconv.Itoa(msg.Value.N)), msg.Value)
		})
	cfg := consumer.DefaultConfig()
	cfg.Brokers, cfg.Group, cfg.Topics = e.brokers, "emit", []string{"cmds"}
	cfg.CommitInterval, cfg.RetryBackoff, cfg.RetryBackoffMax = 100*time.Millisecond, 20*time.Millisecond, 200*time.Millisecond
	c, err := consumer.New(cfg, e.pool, consumer.Handle(h), consumer.WithDeadLetters(outbox.DeadLetters(e.ob, "")),
		consumer.WithKafkaOptions(kgo.FetchMaxBytes(8<<20), kgo.FetchMaxPartitionBytes(8<<20)))
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	}()
	e.startRelay(t, e.fastConfig(t))

	got := e.consume(t, "events").waitFor(5, 60*time.Second)
	seen := map[string]bool{}
	for _, r := range got {
		seen[string(r.Key)] = true
	}
	if len(seen) != 5 {
		t.Fatalf("events published for keys %v, want 5", seen)
	}
	dl := e.consume(t, "cmds.dlq").waitFor(1, 30*time.Second)[0]
	if v, _ := header(dl, outbox.HeaderTruncated); v != "true" || string(dl.Key) != "huge" {
		t.Fatalf("dead letter %q truncated=%q, want the huge record, truncated", dl.Key, v)
	}
	if size, _ := header(dl, outbox.HeaderOriginalSize); size != "1048450" {
		t.Fatalf("original size header %q", size)
	}
	if n, err := e.ob.ParkedCount(ctx, e.pool); err != nil || n != 0 {
		t.Fatalf("parked rows = %d, %v; want none", n, err)
	}
}

// TestDeadLetterKeyCutIsDeterministic: two dead letters of one key too long
// to keep whole, whose error texts differ in length (and whose offsets
// differ in width), get the same cut key (a prefix of the original, named by
// HeaderOriginalKeySHA256), so they stay one key on the dead-letter topic.
func TestDeadLetterKeyCutIsDeterministic(t *testing.T) {
	e := setup(t, 1, "orders", "orders.dlq")
	ctx := context.Background()
	key := make([]byte, outbox.DefaultMaxRecordBytes-200)
	for i := range key {
		key[i] = byte('a' + i%26)
	}
	e.deadLetter(t, handler.Record{Topic: "orders", Offset: 7, Key: key, Value: []byte("v")}, "short")
	e.deadLetter(t, handler.Record{Topic: "orders", Offset: 1234567890, Key: key, Value: []byte("v")}, strings.Repeat("long reason ", 80))
	rows, err := e.pool.Query(ctx, "select key, headers::text from exactly_outbox order by id")
	if err != nil {
		t.Fatal(err)
	}
	type stored struct {
		key     []byte
		headers string
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stored, error) {
		var s stored
		return s, r.Scan(&s.key, &s.headers)
	})
	if err != nil || len(got) != 2 {
		t.Fatalf("stored dead letters: %d, %v; want 2", len(got), err)
	}
	if len(got[0].key) != len(got[1].key) {
		t.Fatalf("cut keys are %d and %d bytes: the cut depends on the error text", len(got[0].key), len(got[1].key))
	}
	sum := sha256.Sum256(key)
	for _, s := range got {
		if len(s.key) >= len(key) || string(s.key) != string(key[:len(s.key)]) {
			t.Fatalf("dead letter key is %d bytes, want a cut prefix of the %d-byte key", len(s.key), len(key))
		}
		if !strings.Contains(s.headers, outbox.HeaderOriginalKeySHA256) {
			t.Fatalf("dead letter with a cut key lacks %s", outbox.HeaderOriginalKeySHA256)
		}
		var hs []struct {
			Key   string `json:"key"`
			Value []byte `json:"value"`
		}
		if err := json.Unmarshal([]byte(s.headers), &hs); err != nil {
			t.Fatal(err)
		}
		for _, h := range hs {
			if h.Key == outbox.HeaderOriginalKeySHA256 && string(h.Value) != hex.EncodeToString(sum[:]) {
				t.Fatalf("%s = %s, want the whole key's", h.Key, h.Value)
			}
		}
	}
}
