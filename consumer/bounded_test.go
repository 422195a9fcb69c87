package consumer_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// boundedLimit is the size no log line, span attribute or event attribute
// may reach, whatever a record carries.
const boundedLimit = 4096

// hashTag is what a bounded value carries after its prefix: its length and
// the first 16 hex digits of its SHA-256.
func hashTag(s string) string {
	sum := sha256.Sum256([]byte(s))
	return fmt.Sprintf("(%d bytes, sha256:%s)", len(s), hex.EncodeToString(sum[:8]))
}

// A 900 KB deduplication key (from a header), a 900 KB Kafka record key and
// a handler error quoting the big key go through a consumer whose handler
// always fails, until the records are dead-lettered: every log line and
// every span attribute and event stays under 4 KB and names each big value
// by its length and SHA-256; the dead-letter records keep them whole.
func TestHugeUserValuesAreBoundedInLogsAndSpans(t *testing.T) {
	const size = 900_000
	bigDedupe := "dk-" + strings.Repeat("d", size-3)
	bigRecordKey := "rk-" + strings.Repeat("r", size-3)
	pool, ob, brokers := outboxSetup(t, 1, "cmds")
	value, _ := json.Marshal(credit{OrderID: "o", Account: 1, Amount: 1})
	testenv.Produce(t, brokers,
		&kgo.Record{Topic: "cmds", Key: []byte("small"), Value: value,
			Headers: []kgo.RecordHeader{{Key: "order-id", Value: []byte(bigDedupe)}}},
		&kgo.Record{Topic: "cmds", Key: []byte(bigRecordKey), Value: value,
			Headers: []kgo.RecordHeader{{Key: "order-id", Value: []byte("small-order")}}},
	)

	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	relay, err := outbox.NewRelay(pool, brokers, outbox.RelayConfig{Outbox: ob, Logger: log, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancelRelay := context.WithCancel(context.Background())
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()
	stopRelay := sync.OnceFunc(func() { cancelRelay(); <-relayDone })
	t.Cleanup(func() { stopRelay(); relay.Close() })

	h := handler.New("credit", handler.FromHeader[credit]("order-id"),
		func(_ context.Context, _ pgx.Tx, msg handler.Message[credit]) error {
			return fmt.Errorf("refusing order %s", msg.Key)
		})
	o := newOutcomes()
	cfg := testConfig(brokers, "bounded", "cmds")
	cfg.MaxAttempts = 2
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()), consumer.WithLogger(log),
		consumer.WithTracerProvider(tp), consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)))
	o.await(t, 60*time.Second, "both records dead-lettered", func() bool { return o.get("dead_lettered") >= 2 })

	// Nothing is lost: the dead letters carry the big values whole.
	dead := testenv.ReadTopic(t, brokers, "cmds.dlq", 2)
	var sawDedupe, sawKey bool
	for _, r := range dead {
		sawDedupe = sawDedupe || recHeader(r, "order-id") == bigDedupe
		sawKey = sawKey || string(r.Key) == bigRecordKey
		if recHeader(r, outbox.HeaderTruncated) != "" {
			t.Errorf("dead letter %.40q was truncated", r.Key)
		}
	}
	if !sawDedupe || !sawKey {
		t.Errorf("dead letters lost a big value: header whole %v, record key whole %v", sawDedupe, sawKey)
	}

	stopRelay()
	text := logs.String()
	lines := strings.Split(strings.TrimSpace(text), "\n")
	for i, l := range lines {
		if len(l) >= boundedLimit {
			t.Errorf("log line %d is %d bytes (limit %d): %.300s…", i, len(l), boundedLimit, l)
		}
	}
	for _, want := range []string{`"msg":"handler failed`, `"msg":"record dead-lettered"`} {
		if !strings.Contains(text, want) {
			t.Errorf("no %s log line", want)
		}
	}
	if !strings.Contains(text, hashTag(bigDedupe)) {
		t.Errorf("the logs do not name the big key by %s", hashTag(bigDedupe))
	}
	if !strings.Contains(text, hashTag("refusing order "+bigDedupe)) {
		t.Errorf("the logs do not name the handler's error by %s", hashTag("refusing order "+bigDedupe))
	}

	ended := spans.Ended()
	if len(ended) == 0 {
		t.Fatal("no spans")
	}
	var all strings.Builder
	for _, s := range ended {
		check := func(where, v string) {
			if len(v) >= boundedLimit {
				t.Errorf("span %s: %s is %d bytes (limit %d): %.200s…", s.Name(), where, len(v), boundedLimit, v)
			}
			all.WriteString(v)
			all.WriteByte('\n')
		}
		check("status description", s.Status().Description)
		for _, a := range s.Attributes() {
			check("attribute "+string(a.Key), a.Value.String())
		}
		for _, e := range s.Events() {
			for _, a := range e.Attributes {
				check("event "+e.Name+" attribute "+string(a.Key), a.Value.String())
			}
		}
	}
	for _, v := range []string{bigDedupe, bigRecordKey, "refusing order " + bigDedupe} {
		if !strings.Contains(all.String(), hashTag(v)) {
			t.Errorf("no span names the %d-byte value %.20q… by %s", len(v), v, hashTag(v))
		}
	}
}
