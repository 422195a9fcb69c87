package apply_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	noopmetric "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
	"github.com/exactly-go/exactly/internal/runtime/telemetry"
	"github.com/exactly-go/exactly/outbox"
)

// With an SDK behind it, the executor's telemetry counts every committed
// record by handler, outcome and topic (an applied, a duplicate, a
// dead-lettered and two more applied records in one batch, after a batch
// of two), times every handler call and transaction, and gives every
// record a process span with its messaging attributes, key and outcome,
// and a handle span for each handler call.
func TestTelemetryCountsAndTracesEveryRecord(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	e, spans := tracedEntryExecutor(t, sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	ctx := context.Background()
	rec := func(off int64, value string) apply.Item {
		return apply.Item{Record: handler.Record{Topic: "entries", Partition: 2, Offset: off, Key: []byte(fmt.Sprintf("k-%d", off)), Value: []byte(value)}, Attempt: 1}
	}
	first := []apply.Item{rec(0, `{"id":"e1","amount":1}`), rec(1, `{"id":"e2","amount":1}`)}
	if res, herr, err := e.Run(ctx, first); err != nil || herr != nil || len(res) != 2 {
		t.Fatalf("first batch: %v %v %v", res, herr, err)
	}
	second := []apply.Item{rec(2, `{"id":"e3","amount":1}`), rec(3, `{"id":"e1","amount":1}`), rec(4, `not json`),
		rec(5, `{"id":"e4","amount":1}`), rec(6, `{"id":"e5","amount":1}`)}
	res, herr, err := e.Run(ctx, second)
	if err != nil || herr != nil || len(res) != len(second) {
		t.Fatalf("second batch: %v %v %v", res, herr, err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	samples := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					counts[m.Name+" "+attrText(dp.Attributes)] += dp.Value
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					samples[m.Name+" "+attrText(dp.Attributes)] += dp.Count
				}
			}
		}
	}
	wantCounts := map[string]int64{
		telemetry.MetricRecords + " exactly.handler=entry exactly.outcome=applied messaging.destination.name=entries":       5,
		telemetry.MetricRecords + " exactly.handler=entry exactly.outcome=duplicate messaging.destination.name=entries":     1,
		telemetry.MetricRecords + " exactly.handler=entry exactly.outcome=dead_lettered messaging.destination.name=entries": 1,
		telemetry.MetricDeadLetters + " exactly.handler=entry messaging.destination.name=entries":                           1,
	}
	if fmt.Sprint(counts) != fmt.Sprint(wantCounts) {
		t.Errorf("counters\n got %v\nwant %v", counts, wantCounts)
	}
	wantSamples := map[string]uint64{
		telemetry.MetricHandlerDuration + " exactly.handler=entry":                                 5,
		telemetry.MetricTxDuration + " exactly.handler=entry exactly.transaction.status=committed": 2,
	}
	if fmt.Sprint(samples) != fmt.Sprint(wantSamples) {
		t.Errorf("histogram samples\n got %v\nwant %v", samples, wantSamples)
	}

	process := map[int64]string{}
	var handles []string
	for _, s := range spans.Ended() {
		switch s.Name() {
		case "entries process":
			a := attribute.NewSet(s.Attributes()...)
			off, _ := a.Value(telemetry.MessagingKafkaOffset)
			process[off.AsInt64()] = attrText(a)
		case "exactly.handle":
			handles = append(handles, attrText(attribute.NewSet(s.Attributes()...)))
		}
	}
	common := "exactly.attempt=1 exactly.handler=entry "
	msg := " exactly.scope=entry messaging.consumer.group.name=group-1 messaging.destination.name=entries messaging.destination.partition.id=2 "
	want := map[int64]string{
		0: common + "exactly.key=entry:e1 exactly.outcome=applied" + msg + "messaging.kafka.message.key=k-0 messaging.kafka.offset=0 messaging.message.body.size=22 messaging.operation.name=process messaging.operation.type=process messaging.system=kafka messaging.batch.message_count=2",
		1: common + "exactly.key=entry:e2 exactly.outcome=applied" + msg + "messaging.kafka.message.key=k-1 messaging.kafka.offset=1 messaging.message.body.size=22 messaging.operation.name=process messaging.operation.type=process messaging.system=kafka messaging.batch.message_count=2",
		2: common + "exactly.key=entry:e3 exactly.outcome=applied" + msg + "messaging.kafka.message.key=k-2 messaging.kafka.offset=2 messaging.message.body.size=22 messaging.operation.name=process messaging.operation.type=process messaging.system=kafka messaging.batch.message_count=5",
		3: common + "exactly.key=entry:e1 exactly.outcome=duplicate" + msg + "messaging.kafka.message.key=k-3 messaging.kafka.offset=3 messaging.message.body.size=22 messaging.operation.name=process messaging.operation.type=process messaging.system=kafka messaging.batch.message_count=5",
		4: common + "exactly.outcome=dead_lettered" + msg + "messaging.kafka.message.key=k-4 messaging.kafka.offset=4 messaging.message.body.size=8 messaging.operation.name=process messaging.operation.type=process messaging.system=kafka messaging.batch.message_count=5",
		5: common + "exactly.key=entry:e4 exactly.outcome=applied" + msg + "messaging.kafka.message.key=k-5 messaging.kafka.offset=5 messaging.message.body.size=22 messaging.operation.name=process messaging.operation.type=process messaging.system=kafka messaging.batch.message_count=5",
		6: common + "exactly.key=entry:e5 exactly.outcome=applied" + msg + "messaging.kafka.message.key=k-6 messaging.kafka.offset=6 messaging.message.body.size=22 messaging.operation.name=process messaging.operation.type=process messaging.system=kafka messaging.batch.message_count=5",
	}
	for off, w := range want {
		if got := process[off]; got != sortedText(w) {
			t.Errorf("process span of offset %d:\n got %s\nwant %s", off, got, sortedText(w))
		}
	}
	if len(process) != len(want) {
		t.Errorf("%d process spans, want %d", len(process), len(want))
	}
	if len(handles) != 5 {
		t.Errorf("%d handle spans, want 5 (one per handler call)", len(handles))
	}
	for _, a := range handles {
		if a != "exactly.attempt=1 exactly.handler=entry" {
			t.Errorf("handle span attributes %s", a)
		}
	}
}

// Batches of one record each, run one after the other through one executor
// (which keeps its span attribute arrays from batch to batch), each get
// their own record's attributes: a record with a key after one without
// carries its key, and a record on another topic and partition carries
// its own, whether its attributes number more than the previous batch's
// or the same.
func TestSpanAttributesOfConsecutiveBatchesAreTheirOwn(t *testing.T) {
	e, spans := tracedEntryExecutor(t, noopmetric.NewMeterProvider())
	items := []apply.Item{
		{Record: handler.Record{Topic: "entries", Partition: 2, Offset: 0, Value: []byte(`{"id":"a1","amount":1}`)}, Attempt: 1},
		{Record: handler.Record{Topic: "entries", Partition: 2, Offset: 1, Key: []byte("k-1"), Value: []byte(`{"id":"a2","amount":1}`)}, Attempt: 2},
		{Record: handler.Record{Topic: "others", Partition: 7, Offset: 9, Key: []byte("k-9"), Value: []byte(`{"id":"a3","amount":10}`)}, Attempt: 1},
	}
	for i, it := range items {
		if res, herr, err := e.Run(context.Background(), []apply.Item{it}); err != nil || herr != nil || len(res) != 1 {
			t.Fatalf("batch %d: %v %v %v", i, res, herr, err)
		}
	}
	got := map[string]string{}
	for _, s := range spans.Ended() {
		if strings.HasSuffix(s.Name(), " process") {
			a := attribute.NewSet(s.Attributes()...)
			off, _ := a.Value(telemetry.MessagingKafkaOffset)
			got[s.Name()+" "+fmt.Sprint(off.AsInt64())] = attrText(a)
		}
	}
	common := "exactly.handler=entry exactly.outcome=applied exactly.scope=entry messaging.consumer.group.name=group-1 messaging.operation.name=process messaging.operation.type=process messaging.system=kafka "
	want := map[string]string{
		"entries process 0": common + "exactly.attempt=1 exactly.key=entry:a1 messaging.destination.name=entries messaging.destination.partition.id=2 messaging.kafka.offset=0 messaging.message.body.size=22",
		"entries process 1": common + "exactly.attempt=2 exactly.key=entry:a2 messaging.destination.name=entries messaging.destination.partition.id=2 messaging.kafka.message.key=k-1 messaging.kafka.offset=1 messaging.message.body.size=22",
		"others process 9":  common + "exactly.attempt=1 exactly.key=entry:a3 messaging.destination.name=others messaging.destination.partition.id=7 messaging.kafka.message.key=k-9 messaging.kafka.offset=9 messaging.message.body.size=23",
	}
	for k, w := range want {
		if got[k] != sortedText(w) {
			t.Errorf("%s:\n got %s\nwant %s", k, got[k], sortedText(w))
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d process spans %v, want %d", len(got), got, len(want))
	}
}

// tracedEntryExecutor returns an executor whose handler inserts each entry,
// with telemetry for consumer group "group-1" from an SDK tracer that
// samples every span into the returned recorder, and from mp.
func tracedEntryExecutor(t *testing.T, mp metric.MeterProvider) (*apply.Executor, *tracetest.SpanRecorder) {
	t.Helper()
	h := handler.New("entry", handler.FromPayload(entryKey), func(ctx context.Context, tx pgx.Tx, m handler.Message[entry]) error {
		_, err := tx.Exec(ctx, `insert into entries (id, amount) values ($1, $2)`, m.Value.ID, m.Value.Amount)
		return err
	})
	e, _ := newFormExecutor(t, h)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	tel, err := apply.NewTelemetry(tp, mp, "group-1", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Telemetry = tel
	return e, spans
}

// attrText returns a set as "k=v" pairs in key order.
func attrText(s attribute.Set) string {
	out := ""
	for _, kv := range s.ToSlice() {
		if out != "" {
			out += " "
		}
		out += string(kv.Key) + "=" + kv.Value.String()
	}
	return out
}

// sortedText returns space-separated "k=v" pairs in key order.
func sortedText(pairs string) string {
	var kvs []attribute.KeyValue
	for _, p := range strings.Fields(pairs) {
		for i := range p {
			if p[i] == '=' {
				kvs = append(kvs, attribute.String(p[:i], p[i+1:]))
				break
			}
		}
	}
	return attrText(attribute.NewSet(kvs...))
}

// A record whose trace is not sampled gets no span recorded, and its
// handler still runs in the record's trace: outbox.Add stores that trace
// context, so the events it adds carry the trace id downstream. (No child
// span is started for an unsampled record: the handler gets the record's
// context.)
func TestUnsampledRecordKeepsItsTraceInTheHandler(t *testing.T) {
	var got trace.SpanContext
	h := handler.New("entry", handler.FromPayload(entryKey), func(ctx context.Context, tx pgx.Tx, m handler.Message[entry]) error {
		got = trace.SpanContextFromContext(ctx)
		_, err := tx.Exec(ctx, `insert into entries (id, amount) values ($1, $2)`, m.Value.ID, m.Value.Amount)
		return err
	})
	e, _ := newFormExecutor(t, h)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
	tel, err := apply.NewTelemetry(tp, noopmetric.NewMeterProvider(), "group-1", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Telemetry = tel
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	item := apply.Item{Record: handler.Record{Topic: "entries", Offset: 0, Value: []byte(`{"id":"e1","amount":1}`),
		Headers: []handler.Header{{Key: "traceparent", Value: []byte("00-" + traceID + "-00f067aa0ba902b7-00")}}}, Attempt: 1}
	if res, herr, err := e.Run(context.Background(), []apply.Item{item}); err != nil || herr != nil || len(res) != 1 || res[0].Outcome != dedupe.Applied {
		t.Fatalf("run: %v %v %v", res, herr, err)
	}
	if got.TraceID().String() != traceID || got.IsSampled() {
		t.Errorf("the handler ran in trace %s (sampled %v), want the record's unsampled %s", got.TraceID(), got.IsSampled(), traceID)
	}
	if n := len(spans.Ended()); n != 0 {
		t.Errorf("%d spans recorded for an unsampled record, want 0", n)
	}
}

// With a tracer that starts no spans of its own (the global provider
// before an SDK is installed), only a batch's first record starts a
// process span and the others run in their extracted trace context as it
// is: every record's outbox row must still carry its own record's trace
// (trace id and parent span id), not the first record's, and a record
// without a trace context gets none.
func TestNoSDKBatchKeepsEachRecordsTraceInItsOutboxRows(t *testing.T) {
	h := handler.New("entry", handler.FromPayload(entryKey), func(ctx context.Context, tx pgx.Tx, m handler.Message[entry]) error {
		return outbox.Add(ctx, tx, outbox.Message{Topic: "entered", Key: []byte(m.Value.ID), Value: m.Record.Value})
	})
	e, pool := newFormExecutor(t, h)
	tel, err := apply.NewTelemetry(otel.GetTracerProvider(), noopmetric.NewMeterProvider(), "group-1", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Telemetry = tel
	parents := map[string]string{ // entry id → its record's traceparent ("" for none)
		"e0": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"e1": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"e2": "",
		"e3": "00-11111111111111111111111111111111-2222222222222222-00",
	}
	var items []apply.Item
	for i := range 4 {
		id := fmt.Sprintf("e%d", i)
		rec := handler.Record{Topic: "entries", Offset: int64(i), Value: []byte(`{"id":"` + id + `","amount":1}`)}
		if tp := parents[id]; tp != "" {
			rec.Headers = []handler.Header{{Key: "traceparent", Value: []byte(tp)}}
		}
		items = append(items, apply.Item{Record: rec, Attempt: 1})
	}
	if res, herr, err := e.Run(context.Background(), items); err != nil || herr != nil || len(res) != 4 {
		t.Fatalf("run: %v %v %v", res, herr, err)
	}
	rows, err := pool.Query(context.Background(), `select convert_from(key, 'UTF8'), coalesce(headers::text, '') from exactly_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var id, hdrs string
		if err := rows.Scan(&id, &hdrs); err != nil {
			t.Fatal(err)
		}
		got[id] = hdrs
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id, tp := range parents {
		hdrs, ok := got[id]
		switch {
		case !ok:
			t.Errorf("no outbox row for %s", id)
		case tp == "" && strings.Contains(hdrs, "traceparent"):
			t.Errorf("%s has no trace context, its row's headers %s", id, hdrs)
		case tp != "" && !strings.Contains(hdrs, base64.StdEncoding.EncodeToString([]byte(tp))):
			t.Errorf("%s's row headers %s, want its record's traceparent %s", id, hdrs, tp)
		}
	}
}
