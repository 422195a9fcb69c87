package consumer_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/runtime/telemetry"
	"github.com/exactly-go/exactly/internal/testenv"
)

// A topic deleted while a consumer runs makes every fetch of it fail
// (UNKNOWN_TOPIC_ID), and franz-go answers each poll at once with that
// error: the poll loop used to log one line per poll (~15,000 a second) and
// every periodic commit of the deleted topic's offsets (ten a second), and
// never consumed the topic once it was re-created. Now the errors are
// logged when they appear and then rarely, counted in exactly.fetch_errors,
// polls that return only errors are spaced out, and the consumer subscribes
// to the topic again, so that a record produced to the re-created topic is
// applied.
func TestDeletedTopicIsLoggedRarelyAndConsumedWhenRecreated(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "credits")
	brokers := testenv.Brokers(kc)
	adm, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	admin := kadm.NewClient(adm)
	ctx := context.Background()

	produce := func(order string) {
		v, _ := json.Marshal(credit{OrderID: order, Account: 1, Amount: 1})
		testenv.Produce(t, brokers, &kgo.Record{Topic: "credits", Value: v})
	}
	o := newOutcomes()
	logs := newLogCapture()
	reader := sdkmetric.NewManualReader()
	startConsumer(t, testConfig(brokers, "g", "credits"), pool, consumer.Handle(creditHandler(0)),
		consumer.WithHooks(o.hooks()), consumer.WithLogger(slog.New(logs)),
		consumer.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	produce("before")
	o.await(t, 30*time.Second, "the first record", func() bool { return o.get("applied") == 1 })

	before := len(logs.matching(""))
	if _, err := admin.DeleteTopic(ctx, "credits"); err != nil {
		t.Fatal(err)
	}
	logs.await(t, 60*time.Second, 1, "fetch error")
	// The deleted state goes on for 3s more: its log lines are counted.
	time.Sleep(3 * time.Second)
	deleted := logs.matching("")[before:]
	if len(deleted) >= 20 {
		t.Errorf("%d log lines while the topic was deleted, want fewer than 20:", len(deleted))
		dumpLogs(t, deleted[:20])
	}
	if n := len(logs.matching("fetch error;")); n != 1 {
		t.Errorf("the fetch error was logged %d times, want once", n)
	}
	if n := len(logs.matching("fetch error persists")); n != 0 {
		t.Errorf("the lasting fetch error was logged again %d times within seconds, want none (once every 30s)", n)
	}
	if n := fetchErrorCount(t, reader, "credits", "UNKNOWN_TOPIC_ID"); n == 0 {
		t.Errorf("exactly.fetch_errors{topic=credits, error.type=UNKNOWN_TOPIC_ID} = 0, want the errors counted")
	}

	if _, err := admin.CreateTopic(ctx, 1, 1, nil, "credits"); err != nil {
		t.Fatal(err)
	}
	produce("after")
	o.await(t, 60*time.Second, "the record produced to the re-created topic", func() bool { return o.get("applied") == 2 })
	logs.await(t, 10*time.Second, 1, "fetch error cleared")
	if got := count(t, pool, `select count(*) from ledger where order_id = 'after'`); got != 1 {
		t.Errorf("ledger rows of the re-created topic's record = %d, want 1", got)
	}
}

// A partition whose fetches keep failing with an error the Kafka client
// hands to the poll (here UNKNOWN_SERVER_ERROR, injected by the broker)
// is polled with backoff: franz-go answers each poll at once with the
// error, and the poll loop used to poll (and log) again at once, ~15,000
// times a second. The error is logged once, and once more when records
// flow again.
func TestFailingFetchIsBackedOff(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "credits")
	brokers := testenv.Brokers(kc)
	produce := func(order string) {
		v, _ := json.Marshal(credit{OrderID: order, Account: 1, Amount: 1})
		testenv.Produce(t, brokers, &kgo.Record{Topic: "credits", Value: v})
	}
	o := newOutcomes()
	logs := newLogCapture()
	startConsumer(t, testConfig(brokers, "g", "credits"), pool, consumer.Handle(creditHandler(0)),
		consumer.WithHooks(o.hooks()), consumer.WithLogger(slog.New(logs)))
	produce("before")
	o.await(t, 30*time.Second, "the first record", func() bool { return o.get("applied") == 1 })

	var failing atomic.Bool
	var failed atomic.Int64
	failing.Store(true)
	kc.ControlKey(kmsg.Fetch.Int16(), func(r kmsg.Request) (kmsg.Response, error, bool) {
		if !failing.Load() {
			kc.DropControl()
			return nil, nil, false
		}
		kc.KeepControl()
		req := r.(*kmsg.FetchRequest)
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		resp.SetVersion(req.GetVersion())
		for _, rt := range req.Topics {
			st := kmsg.NewFetchResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.UnknownServerError.Code
				st.Partitions = append(st.Partitions, sp)
				failed.Add(1)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	before := len(logs.matching(""))
	logs.await(t, 30*time.Second, 1, "fetch error")
	start := failed.Load()
	// The failure goes on for 3s more: its fetches and log lines are counted.
	time.Sleep(3 * time.Second)
	// 50ms doubling to 1s: about 8 polls in 3s; without backoff, thousands.
	if n := failed.Load() - start; n > 30 {
		t.Errorf("%d failing fetches in 3s, want at most 30 (backoff)", n)
	}
	if lines := logs.matching("")[before:]; len(lines) >= 20 {
		t.Errorf("%d log lines in 3s of failing fetches, want fewer than 20:", len(lines))
		dumpLogs(t, lines[:20])
	}
	if n := len(logs.matching("fetch error persists")); n != 0 {
		t.Errorf("the lasting fetch error was logged again %d times in 3s, want none (once every 30s)", n)
	}
	failing.Store(false)
	produce("after")
	o.await(t, 30*time.Second, "the record produced after the failure", func() bool { return o.get("applied") == 2 })
	logs.await(t, 10*time.Second, 1, "fetch error cleared")
}

// fetchErrorCount sums the exactly.fetch_errors data points of topic and
// errorType.
func fetchErrorCount(t *testing.T, r *sdkmetric.ManualReader, topic, errorType string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != telemetry.MetricFetchErrors {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				tp, _ := dp.Attributes.Value(telemetry.MessagingDestinationName)
				et, _ := dp.Attributes.Value(telemetry.ErrorType)
				if tp.AsString() == topic && et.AsString() == errorType {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// dumpLogs logs records, with their attributes, to t.
func dumpLogs(t *testing.T, records []slog.Record) {
	t.Helper()
	for _, r := range records {
		var attrs []string
		r.Attrs(func(a slog.Attr) bool { attrs = append(attrs, a.String()); return true })
		t.Logf("%s %s %v", r.Time.Format("15:04:05.000"), r.Message, attrs)
	}
}
