package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/internal/testenv/broker"
)

// Hostile records through the real consumer on kfake: a 5 MB value, keys
// (from the message-id header) of 10,000 characters, invalid UTF-8 and NUL
// bytes, each sent twice, and garbage traceparent headers. Every key is
// claimed once and its copy detected as a duplicate, by the rule of
// dedupe.NormalizeKey (long or unstorable keys are stored as their
// SHA-256); a traceparent that does not parse starts a new trace.
func TestHostileRecords(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	b, err := broker.Start(context.Background(), broker.Options{Partitions: 1, Topics: []string{"hostile"},
		Extra: []kfake.Opt{kfake.BrokerConfigs(map[string]string{"message.max.bytes": fmt.Sprint(16 << 20)})}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	brokers := b.Addrs()

	long := strings.Repeat("k", 10000)
	keys := []string{long, "\xff\xfe-not-utf8", "nul\x00inside", "plain-1"}
	value := func(id string, pad int) []byte {
		return []byte(fmt.Sprintf(`{"order_id":%q,"account":1,"amount":1,"pad":%q}`, id, strings.Repeat("x", pad)))
	}
	var recs []*kgo.Record
	for i, k := range keys { // each key twice
		for range 2 {
			recs = append(recs, &kgo.Record{Topic: "hostile", Value: value(fmt.Sprint("o-", i), 0),
				Headers: []kgo.RecordHeader{{Key: "message-id", Value: []byte(k)}}})
		}
	}
	const fiveMB = 5 << 20
	recs = append(recs, &kgo.Record{Topic: "hostile", Value: value("big", fiveMB),
		Headers: []kgo.RecordHeader{{Key: "message-id", Value: []byte("big-1")}}})
	garbage := []string{"garbage", "00-zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz-zzzzzzzzzzzzzzzz-01",
		"00-00000000000000000000000000000000-0000000000000000-01", strings.Repeat("00-", 4000), "\xff\x00"}
	for i, tp := range garbage {
		recs = append(recs, &kgo.Record{Topic: "hostile", Value: value(fmt.Sprint("tp-", i), 0),
			Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte(tp)}, {Key: "message-id", Value: []byte(fmt.Sprint("tp-", i))}}})
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerBatchMaxBytes(16<<20), kgo.MaxBufferedBytes(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatalf("producing: %v", err)
	}
	cl.Close()

	var mu sync.Mutex
	gotKeys := map[string]int{}
	var bigLen int
	h := handler.New("hostile", handler.FromHeader[credit]("message-id"),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			mu.Lock()
			gotKeys[msg.Key]++
			if msg.Value.OrderID == "big" {
				bigLen = len(msg.Record.Value)
			}
			mu.Unlock()
			return insertCredit(ctx, tx, msg.Value)
		})
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	o := newOutcomes()
	startConsumer(t, testConfig(brokers, "hostile", "hostile"), pool, consumer.Handle(h),
		consumer.WithHooks(o.hooks()), consumer.WithTracerProvider(tp))
	o.await(t, 60*time.Second, "every record", func() bool { return o.total() >= len(recs) })

	wantApplied := len(keys) + 1 + len(garbage)
	if a, d, dl := o.get("applied"), o.get("duplicate"), o.get("dead_lettered"); a != wantApplied || d != len(keys) || dl != 0 {
		t.Errorf("applied=%d duplicate=%d dead_lettered=%d, want %d, %d, 0", a, d, dl, wantApplied, len(keys))
	}
	if got := count(t, pool, `select count(*) from ledger`); got != wantApplied {
		t.Errorf("ledger rows = %d, want %d", got, wantApplied)
	}
	if got := count(t, pool, `select count(*) from exactly_guard`); got != wantApplied {
		t.Errorf("guard rows = %d, want %d", got, wantApplied)
	}
	for _, k := range keys {
		n := dedupe.NormalizeKey(k)
		if got := count(t, pool, `select count(*) from exactly_guard where scope = 'hostile' and key = $1`, n); got != 1 {
			t.Errorf("guard rows for %.20q (stored as %.30q) = %d, want 1", k, n, got)
		}
		mu.Lock()
		if gotKeys[k] != 1 {
			t.Errorf("handler saw key %.20q %d times, want once (the handler gets the raw key)", k, gotKeys[k])
		}
		mu.Unlock()
	}
	if got := count(t, pool, `select count(*) from exactly_guard where key like 'sha256:%'`); got != 3 {
		t.Errorf("hashed guard keys = %d, want 3 (10k, invalid UTF-8, NUL)", got)
	}
	mu.Lock()
	if bigLen < fiveMB {
		t.Errorf("the 5 MB record reached the handler with %d bytes", bigLen)
	}
	mu.Unlock()

	// Garbage trace context: a root span, no parent, for each such record.
	roots := 0
	for _, s := range spans.Ended() {
		if !strings.HasSuffix(s.Name(), " process") {
			continue
		}
		if s.Parent().IsValid() {
			t.Errorf("span %s has a parent %v: no record here carries a valid traceparent", s.Name(), s.Parent())
		}
		roots++
	}
	if roots < len(recs) {
		t.Errorf("%d process spans, want one per record (%d)", roots, len(recs))
	}
}
