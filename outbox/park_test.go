package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// TestAddRejectsIllegalTopicsAndOversizedRecords: Add, AddValue and AddJSON
// refuse what Kafka would refuse, with a *MessageError naming the problem,
// and leave the transaction usable.
func TestAddRejectsIllegalTopicsAndOversizedRecords(t *testing.T) {
	e := setup(t, 1)
	ctx := context.Background()
	tx := e.begin(t)
	for _, c := range []struct {
		name  string
		msg   outbox.Message
		about string
	}{
		{"dot", outbox.Message{Topic: "."}, `"." and ".."`},
		{"dotdot", outbox.Message{Topic: ".."}, `"." and ".."`},
		{"too long", outbox.Message{Topic: strings.Repeat("a", 250)}, "250 characters, over Kafka's 249"},
		{"space", outbox.Message{Topic: "a b"}, `' ' at byte 1`},
		{"non-ASCII", outbox.Message{Topic: "zahlungsaufträge"}, "[a-zA-Z0-9._-]"},
		{"slash", outbox.Message{Topic: "a/b"}, `'/' at byte 1`},
		{"oversized", outbox.Message{Topic: "t", Value: make([]byte, outbox.DefaultMaxRecordBytes)}, "over the 1048527-byte limit"},
		{"oversized headers", outbox.Message{Topic: "t", Headers: []handler.Header{{Key: "h", Value: make([]byte, 1<<20)}}}, "1048527-byte limit"},
	} {
		err := e.ob.Add(ctx, tx, c.msg)
		var me *outbox.MessageError
		if !errors.As(err, &me) || !errors.Is(err, outbox.ErrInvalidMessage) || !strings.Contains(err.Error(), c.about) {
			t.Errorf("%s: err = %v, want a *MessageError about %q", c.name, err, c.about)
		}
	}
	small := outbox.New(outbox.WithMaxRecordBytes(1000))
	err := small.AddValue(ctx, tx, "t", []byte("k"), string(make([]byte, 2000)), handler.JSON{})
	var me *outbox.MessageError
	if !errors.As(err, &me) || me.Limit != 1000 || me.Size <= 2000 {
		t.Fatalf("AddValue over WithMaxRecordBytes(1000): err = %v (%+v)", err, me)
	}
	if err := outbox.AddJSON(ctx, tx, strings.Repeat("x", 250), []byte("k"), 1); !errors.As(err, &me) {
		t.Fatalf("AddJSON to a 250-character topic: err = %v", err)
	}
	// Legal limits are accepted, and the refusals left tx usable.
	if err := e.ob.Add(ctx, tx, outbox.Message{Topic: "Ok_topic-1.v2", Key: []byte("k"), Value: make([]byte, outbox.DefaultMaxRecordBytes-200)}); err != nil {
		t.Fatalf("a legal record near the limit: %v", err)
	}
	if err := e.ob.Add(ctx, tx, outbox.Message{Topic: strings.Repeat("a", 249)}); err != nil {
		t.Fatalf("a 249-character topic: %v", err)
	}
	var n int
	if err := tx.QueryRow(ctx, "select count(*) from exactly_outbox").Scan(&n); err != nil || n != 2 {
		t.Fatalf("rows in the outbox = %d, %v; want the 2 legal ones", n, err)
	}
}

// parkRecorder collects OnParked calls.
type parkRecorder struct {
	mu     sync.Mutex
	parked []string // topic/key: reason
}

func (p *parkRecorder) hook(_ int64, topic string, key []byte, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.parked = append(p.parked, topic+"/"+string(key)+": "+reason)
}

func (p *parkRecorder) list() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.parked...)
}

// insertRaw writes a row straight into the table, as an older writer or a
// hand-made fix could, bypassing Add's checks.
func (e *env) insertRaw(t *testing.T, topic string, key, value []byte) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), "insert into exactly_outbox (topic, key, value) values ($1, $2, $3)", topic, key, value); err != nil {
		t.Fatal(err)
	}
}

// TestOversizedRowParksOnlyItsKey: a row over the relay's limit is parked,
// the later row of its key waits behind it, every other key flows; the
// parking survives a relay restart; after the fix, Retry publishes the
// parked row and then the held one, in order.
func TestOversizedRowParksOnlyItsKey(t *testing.T) {
	e := setup(t, 1, "t")
	ctx := context.Background()
	cfg := e.fastConfig(t)
	cfg.MaxRecordBytes = 1000
	reader := sdkmetric.NewManualReader()
	cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	var rec parkRecorder
	cfg.Hooks.OnParked = rec.hook
	e.insertRaw(t, "t", []byte("k"), make([]byte, 2000))
	e.add(t, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("after")})
	e.add(t, outbox.Message{Topic: "t", Key: []byte("other"), Value: []byte("1")})
	r1 := e.startRelay(t, cfg)
	c := e.consume(t, "t")
	if recs := c.waitFor(1, 10*time.Second); string(recs[0].Key) != "other" {
		t.Fatalf("first record published has key %q, want other", recs[0].Key)
	}
	parked, err := e.ob.Parked(ctx, e.pool, outbox.ParkFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 1 || string(parked[0].Key) != "k" || parked[0].Held != 1 || !strings.Contains(parked[0].Reason, "over the 1000-byte limit") {
		t.Fatalf("parked = %+v, want key k holding 1 row, reason naming the limit", parked)
	}
	if got := rec.list(); len(got) != 1 {
		t.Fatalf("OnParked ran %d times (%q), want once", len(got), got)
	}
	if n := parkedGauge(t, reader); n != 1 {
		t.Fatalf("exactly.outbox.parked = %d, want 1", n)
	}

	// Restart: the row stays parked; other keys still flow.
	r1.stop()
	e.startRelay(t, cfg)
	e.add(t, outbox.Message{Topic: "t", Key: []byte("other"), Value: []byte("2")})
	recs := c.waitFor(2, 10*time.Second)
	if string(recs[1].Value) != "2" {
		t.Fatalf("after restart published %q=%q, want other=2", recs[1].Key, recs[1].Value)
	}
	if n := e.produced(t, "t"); n != 2 {
		t.Fatalf("%d records produced, want 2: a parked key leaked after restart", n)
	}
	if got := rec.list(); len(got) != 1 {
		t.Fatalf("OnParked ran %d times after restart (%q), want still once", len(got), got)
	}

	// Fix by hand, then retry: the parked row, then the held one.
	if _, err := e.pool.Exec(ctx, "update exactly_outbox set value = 'fixed' where length(value) = 2000"); err != nil {
		t.Fatal(err)
	}
	released, err := e.ob.Retry(ctx, e.pool, outbox.ParkFilter{Topic: "t", Key: []byte("k")})
	if err != nil || len(released) != 1 {
		t.Fatalf("Retry = %+v, %v; want one row", released, err)
	}
	recs = c.waitFor(4, 10*time.Second)
	if string(recs[2].Value) != "fixed" || string(recs[3].Value) != "after" {
		t.Fatalf("after retry published %q, %q; want fixed, after", recs[2].Value, recs[3].Value)
	}
	eventually(t, 5*time.Second, "empty backlog", func() bool { return e.backlog(t) == 0 })
}

// parkedGauge collects the exactly.outbox.parked gauge; -1 when absent.
func parkedGauge(t *testing.T, r *sdkmetric.ManualReader) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == outbox.MetricOutboxParked {
				for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
					return dp.Value
				}
			}
		}
	}
	return -1
}

// denyProduce makes the kfake cluster answer every produce request for
// topic with TOPIC_AUTHORIZATION_FAILED while deny holds (records of other
// topics in the same request get NOT_LEADER_FOR_PARTITION, a retriable
// error, and are resent), as a broker whose ACLs forbid the relay's
// principal to write that topic does.
func (e *env) denyProduce(t *testing.T, topic string, deny *atomic.Bool) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	td, err := kadm.NewClient(cl).ListTopics(context.Background(), topic)
	if err != nil || td.Error() != nil {
		t.Fatalf("describing %s: %v %v", topic, err, td.Error())
	}
	id := td[topic].ID
	e.kafka.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.KeepControl()
		preq := req.(*kmsg.ProduceRequest)
		hit := false
		for _, rt := range preq.Topics {
			hit = hit || rt.Topic == topic || rt.TopicID == id
		}
		if !hit || !deny.Load() {
			return nil, nil, false
		}
		return testenv.RefuseProduce(preq, func(rt kmsg.ProduceRequestTopic) int16 {
			if rt.Topic == topic || rt.TopicID == id {
				return kerr.TopicAuthorizationFailed.Code
			}
			return kerr.NotLeaderForPartition.Code
		}), nil, true
	})
}

// TestForbiddenTopicParksItsKeyOthersFlow: a topic the relay may not write
// parks the rows of that (topic, key), once each, while other topics and
// the denied topic's rows published before keep flowing; after the ACL is
// fixed, Retry publishes the parked rows in order. A row whose topic Kafka
// would refuse outright (over 249 characters, written past Add) is parked
// without being produced.
func TestForbiddenTopicParksItsKeyOthersFlow(t *testing.T) {
	e := setup(t, 1, "allowed", "denied")
	ctx := context.Background()
	var deny atomic.Bool
	deny.Store(true)
	e.denyProduce(t, "denied", &deny)
	cfg := e.fastConfig(t)
	var rec parkRecorder
	cfg.Hooks.OnParked = rec.hook
	long := strings.Repeat("x", 250)
	e.insertRaw(t, long, []byte("k"), []byte("never"))
	e.add(t,
		outbox.Message{Topic: "allowed", Key: []byte("a"), Value: []byte("1")},
		outbox.Message{Topic: "denied", Key: []byte("d"), Value: []byte("1")},
		outbox.Message{Topic: "allowed", Key: []byte("a"), Value: []byte("2")},
		outbox.Message{Topic: "denied", Key: []byte("d"), Value: []byte("2")},
		outbox.Message{Topic: "allowed", Key: []byte("b"), Value: []byte("1")})
	e.startRelay(t, cfg)
	c := e.consume(t, "allowed")
	c.waitFor(3, 15*time.Second)
	e.add(t, outbox.Message{Topic: "allowed", Key: []byte("a"), Value: []byte("3")})
	c.waitFor(4, 15*time.Second)

	parked, err := e.ob.Parked(ctx, e.pool, outbox.ParkFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 2 || parked[0].Topic != long || parked[1].Topic != "denied" || parked[1].Held != 1 ||
		!strings.Contains(parked[1].Reason, "TOPIC_AUTHORIZATION_FAILED") || !strings.Contains(parked[0].Reason, "over Kafka's 249") {
		rows, _ := e.pool.Query(ctx, "select id, topic, value, parked_at is not null from exactly_outbox order by id")
		for rows.Next() {
			var id int64
			var tp string
			var v []byte
			var p bool
			_ = rows.Scan(&id, &tp, &v, &p)
			t.Logf("row %d %.10s %q parked=%v", id, tp, v, p)
		}
		t.Logf("produced to denied: %d", e.produced(t, "denied"))
		t.Fatalf("parked = %+v, want the long topic's row and denied/d (holding 1) with their reasons", parked)
	}
	if got := rec.list(); len(got) != 2 {
		t.Fatalf("OnParked calls %q, want 2 (one per parked key)", got)
	}
	if n := e.produced(t, "denied"); n != 0 {
		t.Fatalf("%d records on the denied topic", n)
	}
	// Parked rows and the row held behind denied/d wait for an operator,
	// not for the relay: the backlog drains to 0 without them.
	for deadline := time.Now().Add(10 * time.Second); ; {
		n, _, err := e.ob.Backlog(ctx, e.pool)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("backlog %d with only parked and held rows left, want 0", n)
		}
		time.Sleep(20 * time.Millisecond) // polling the relay's asynchronous deletes
	}

	deny.Store(false)
	released, err := e.ob.Retry(ctx, e.pool, outbox.ParkFilter{Topic: "denied"})
	if err != nil || len(released) != 1 || string(released[0].Key) != "d" {
		t.Fatalf("Retry = %+v, %v", released, err)
	}
	got := testenvRead(t, e, "denied", 2)
	if string(got[0].Value) != "1" || string(got[1].Value) != "2" {
		t.Fatalf("denied topic after retry: %q, %q", got[0].Value, got[1].Value)
	}
	dropped, err := e.ob.Drop(ctx, e.pool, outbox.ParkFilter{})
	if err != nil || len(dropped) != 1 || dropped[0].Topic != long {
		t.Fatalf("Drop = %+v, %v; want the long topic's row", dropped, err)
	}
	eventually(t, 5*time.Second, "empty backlog", func() bool { return e.backlog(t) == 0 })
}

// testenvRead reads n records of topic from its start.
func testenvRead(t *testing.T, e *env, topic string, n int) []*kgo.Record {
	t.Helper()
	return e.consume(t, topic).waitFor(n, 15*time.Second)
}

// TestTopicMaxMessageBytesLowersTheLimit: a topic whose max.message.bytes is
// below the relay's limit parks a row that fits the relay's limit but not
// the topic's, before producing it, while a smaller row of another key on
// the same topic is published.
func TestTopicMaxMessageBytesLowersTheLimit(t *testing.T) {
	e := setup(t, 1, "small")
	e.setMaxMessageBytes(t, "small", 2000)
	cfg := e.fastConfig(t)
	var rec parkRecorder
	cfg.Hooks.OnParked = rec.hook
	e.add(t, outbox.Message{Topic: "small", Key: []byte("big"), Value: bytes.Repeat([]byte("x"), 5000)},
		outbox.Message{Topic: "small", Key: []byte("tiny"), Value: []byte("ok")})
	e.startRelay(t, cfg)
	recs := e.consume(t, "small").waitFor(1, 10*time.Second)
	if string(recs[0].Key) != "tiny" {
		t.Fatalf("published key %q, want tiny", recs[0].Key)
	}
	got := rec.list()
	if len(got) != 1 || !strings.Contains(got[0], "small/big") || !strings.Contains(got[0], "1939-byte limit") {
		t.Fatalf("parked %q, want small/big over the topic's 2000-61 byte limit", got)
	}
}

// setMaxMessageBytes sets topic's max.message.bytes on the kfake cluster.
func (e *env) setMaxMessageBytes(t *testing.T, topic string, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	v := strconv.Itoa(n)
	res, err := kadm.NewClient(cl).AlterTopicConfigs(context.Background(), []kadm.AlterConfig{{Name: "max.message.bytes", Value: &v}}, topic)
	if err != nil || res[0].Err != nil {
		t.Fatalf("setting max.message.bytes of %s to %d: %v %v", topic, n, err, res)
	}
}

// TestRetryAfterRaisingTopicLimitPublishes: a row over its topic's
// max.message.bytes is parked; the operator raises the topic's limit and
// retries it. The relay still holds the old limit in its cache (minutes
// long), but must read the topic's limit again before parking the row a
// second time: the row is published, not parked again.
func TestRetryAfterRaisingTopicLimitPublishes(t *testing.T) {
	e := setup(t, 1, "small")
	ctx := context.Background()
	e.setMaxMessageBytes(t, "small", 2000)
	cfg := e.fastConfig(t)
	parked := make(chan string, 8)
	cfg.Hooks.OnParked = func(_ int64, topic string, key []byte, reason string) {
		parked <- topic + "/" + string(key) + ": " + reason
	}
	e.add(t, outbox.Message{Topic: "small", Key: []byte("big"), Value: bytes.Repeat([]byte("x"), 5000)})
	e.startRelay(t, cfg)
	if got := <-parked; !strings.Contains(got, "small/big") || !strings.Contains(got, "1939-byte limit") {
		t.Fatalf("parked %q, want small/big over the topic's 2000-61 byte limit", got)
	}

	e.setMaxMessageBytes(t, "small", 10000)
	released, err := outbox.New().Retry(ctx, e.pool, outbox.ParkFilter{Topic: "small", Key: []byte("big")})
	if err != nil || len(released) != 1 {
		t.Fatalf("Retry = %+v, %v; want one row", released, err)
	}
	// Whichever comes first: the record, or the row parked again.
	c := e.consume(t, "small")
	deadline := time.Now().Add(15 * time.Second)
	for len(c.recs) == 0 {
		select {
		case got := <-parked:
			t.Fatalf("after raising the limit and Retry, parked again: %q", got)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the retried row was neither published nor parked within 15s")
		}
		pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		c.cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) { c.recs = append(c.recs, r) })
		cancel()
	}
	if string(c.recs[0].Key) != "big" || len(c.recs[0].Value) != 5000 {
		t.Fatalf("published %q with %d bytes, want big with 5000", c.recs[0].Key, len(c.recs[0].Value))
	}
	eventually(t, 5*time.Second, "empty outbox", func() bool {
		n, err := e.ob.ParkedCount(ctx, e.pool)
		return err == nil && n == 0 && e.backlog(t) == 0
	})
}

// TestCopiedMessageIDHeadersGetDistinctIDs: a handler that copies the
// headers of the record it consumed (its message-id included) onto each of
// N messages it emits must not give them one id: the relay publishes each
// row's own id, unless Message.ID sets one.
func TestCopiedMessageIDHeadersGetDistinctIDs(t *testing.T) {
	e := setup(t, 1, "out")
	incoming := []handler.Header{{Key: outbox.HeaderMessageID, Value: []byte("incoming-id")}, {Key: "tenant", Value: []byte("t1")}}
	var msgs []outbox.Message
	for _, v := range []string{"1", "2", "3"} {
		msgs = append(msgs, outbox.Message{Topic: "out", Key: []byte("k"), Value: []byte(v), Headers: incoming})
	}
	msgs = append(msgs, outbox.Message{Topic: "out", Key: []byte("k"), Value: []byte("explicit"), Headers: incoming, ID: "chosen-id"})
	e.add(t, msgs...)
	e.startRelay(t, e.fastConfig(t))
	recs := e.consume(t, "out").waitFor(4, 10*time.Second)
	ids := map[string]bool{}
	for _, r := range recs[:3] {
		n := 0
		for _, h := range r.Headers {
			if h.Key == outbox.HeaderMessageID {
				n++
				ids[string(h.Value)] = true
			}
		}
		if n != 1 {
			t.Fatalf("record %q has %d message-id headers, want 1", r.Value, n)
		}
		if tenant, _ := header(r, "tenant"); tenant != "t1" {
			t.Fatalf("record %q lost its other headers", r.Value)
		}
	}
	if len(ids) != 3 || ids["incoming-id"] {
		t.Fatalf("message ids %v, want 3 distinct row ids, not the copied one", ids)
	}
	if id, _ := header(recs[3], outbox.HeaderMessageID); id != "chosen-id" {
		t.Fatalf("Message.ID published as %q, want chosen-id", id)
	}
}

// TestRowsRejectedTogetherAreIsolated: rows that each fit the broker's
// message.max.bytes but not together fail as one batch with
// MESSAGE_TOO_LARGE (the broker is emulated through kfake's request
// control: any partition batch over 2000 bytes is refused); the relay
// produces them one by one and parks none, and publishes each row exactly
// once (a row produced alone is acknowledged, not published again).
func TestRowsRejectedTogetherAreIsolated(t *testing.T) {
	e := setup(t, 1, "small")
	var refused atomic.Int64
	e.kafka.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.KeepControl()
		preq := req.(*kmsg.ProduceRequest)
		over := false
		for _, rt := range preq.Topics {
			for _, rp := range rt.Partitions {
				over = over || len(rp.Records) > 2000
			}
		}
		if !over {
			return nil, nil, false
		}
		refused.Add(1)
		return testenv.RefuseProduce(preq, func(kmsg.ProduceRequestTopic) int16 { return kerr.MessageTooLarge.Code }), nil, true
	})
	var msgs []outbox.Message
	for i := range 6 {
		v := make([]byte, 1500) // incompressible: the batch really is over 2000 bytes
		rand.NewChaCha8([32]byte{byte(i)}).Read(v)
		msgs = append(msgs, outbox.Message{Topic: "small", Key: []byte{'k', byte('0' + i)}, Value: v})
	}
	e.add(t, msgs...)
	cfg := e.fastConfig(t)
	var rec parkRecorder
	cfg.Hooks.OnParked = rec.hook
	relay := e.startRelay(t, cfg)
	reader := e.consume(t, "small")
	reader.waitFor(6, 15*time.Second)
	// The relay is done once the backlog is empty; the counts below are
	// checked either way.
	for end := time.Now().Add(15 * time.Second); e.backlog(t) != 0 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond) // polling the outbox for the awaited state
	}
	relay.stop()
	if b := e.backlog(t); b != 0 {
		t.Errorf("%d rows still unacknowledged 15 s after all 6 were read", b)
	}
	if got := rec.list(); len(got) != 0 {
		t.Fatalf("parked %q: rows that fit alone were parked", got)
	}
	if refused.Load() == 0 {
		t.Fatal("no batch was refused: the test did not exercise isolation")
	}
	// Every row is published once: the one produced alone is acknowledged
	// then, not published again by the next poll.
	n := e.produced(t, "small")
	perKey := map[string]int{}
	for _, r := range reader.waitFor(int(n), 15*time.Second) {
		perKey[string(r.Key)]++
	}
	for _, m := range msgs {
		if c := perKey[string(m.Key)]; c != 1 {
			t.Errorf("row of key %q published %d times, want once (%d records on the topic for %d rows)", m.Key, c, n, len(msgs))
		}
	}
}

// TestProducerBatchFitsBrokerDefault: two records that fit alone but not
// together under Kafka's default message.max.bytes are never sent in one
// batch over it: the producer's batch limit is at or below the broker's.
func TestProducerBatchFitsBrokerDefault(t *testing.T) {
	e := setup(t, 1, "big")
	var over atomic.Int64
	e.kafka.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.KeepControl()
		for _, rt := range req.(*kmsg.ProduceRequest).Topics {
			for _, rp := range rt.Partitions {
				if len(rp.Records) > outbox.DefaultBrokerMaxMessageBytes {
					over.Add(1)
				}
			}
		}
		return nil, nil, false
	})
	var msgs []outbox.Message
	for i := range 2 {
		v := make([]byte, 524_300)
		rand.NewChaCha8([32]byte{byte(i)}).Read(v)
		msgs = append(msgs, outbox.Message{Topic: "big", Key: []byte("k"), Value: v})
	}
	e.add(t, msgs...)
	e.startRelay(t, e.fastConfig(t))
	e.consume(t, "big").waitFor(2, 15*time.Second)
	if n := over.Load(); n > 0 {
		t.Fatalf("%d produce batches over the broker's default message.max.bytes (%d)", n, outbox.DefaultBrokerMaxMessageBytes)
	}
}

// TestUnknownTopicParksAfterBoundedWait: with auto-creation off on the
// broker, a row for a topic that does not exist is parked after franz-go's
// bounded retries, while a known topic flows; once the topic exists, Retry
// publishes it.
func TestUnknownTopicParksAfterBoundedWait(t *testing.T) {
	pool := testenv.DB(t)
	ob := outbox.New()
	if err := ob.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	k, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "known"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	e := &env{pool: pool, ob: ob, brokers: k.ListenAddrs(), kafka: k}
	ctx := context.Background()
	cfg := e.fastConfig(t)
	var rec parkRecorder
	cfg.Hooks.OnParked = rec.hook
	e.add(t, outbox.Message{Topic: "missing", Key: []byte("m"), Value: []byte("1")},
		outbox.Message{Topic: "known", Key: []byte("k"), Value: []byte("1")})
	e.startRelay(t, cfg)
	e.consume(t, "known").waitFor(1, 15*time.Second)
	eventually(t, 30*time.Second, "the unknown topic's row to be parked", func() bool { return len(rec.list()) == 1 })
	if got := rec.list()[0]; !strings.Contains(got, "missing/m: ") || !strings.Contains(got, "UNKNOWN_TOPIC_OR_PARTITION") {
		t.Fatalf("parked %q", got)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, "missing"); err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Retry(ctx, pool, outbox.ParkFilter{Topic: "missing", Key: []byte("m")}); err != nil {
		t.Fatal(err)
	}
	e.consume(t, "missing").waitFor(1, 15*time.Second)
}

// TestPermanentProduceErrorClassifies: only errors that say the record can
// never be published as it is are permanent; outages are retried.
func TestPermanentProduceErrorClassifies(t *testing.T) {
	for err, want := range map[error]bool{
		kerr.MessageTooLarge: true,
		fmt.Errorf("%w (uncompressed_bytes=9)", kerr.MessageTooLarge): true,
		kerr.RecordListTooLarge:                    true,
		kerr.InvalidTopicException:                 true,
		kerr.TopicAuthorizationFailed:              true,
		kerr.PolicyViolation:                       true,
		kerr.InvalidRecord:                         true,
		kerr.UnknownTopicOrPartition:               true,
		kerr.NotEnoughReplicas:                     false,
		kerr.NotLeaderForPartition:                 false,
		kerr.RequestTimedOut:                       false,
		kerr.ClusterAuthorizationFailed:            false,
		kgo.ErrRecordTimeout:                       false,
		context.DeadlineExceeded:                   false,
		errors.New("dial tcp: connection refused"): false,
	} {
		if got := outbox.PermanentProduceError(err); got != want {
			t.Errorf("PermanentProduceError(%v) = %v, want %v", err, got, want)
		}
	}
}
