package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// refuseTopic makes the brokers refuse, while on is set, every write to
// topic with code, as a broker does per partition: a request that also
// writes other topics goes on without topic (no answer for it, which the
// client retries), and one that writes only topic is answered with code.
func (e *env) refuseTopic(t *testing.T, topic string, code int16, on *atomic.Bool) {
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
		if !on.Load() {
			return nil, nil, false
		}
		preq := req.(*kmsg.ProduceRequest)
		var rest []kmsg.ProduceRequestTopic
		for _, rt := range preq.Topics {
			if rt.Topic != topic && rt.TopicID != id {
				rest = append(rest, rt)
			}
		}
		switch {
		case len(rest) == len(preq.Topics):
			return nil, nil, false
		case len(rest) > 0:
			preq.Topics = rest
			return nil, nil, false
		}
		return testenv.RefuseProduce(preq, func(kmsg.ProduceRequestTopic) int16 { return code }), nil, true
	})
}

// A topic whose partition cannot take writes (NOT_ENOUGH_REPLICAS, retried)
// holds only its own rows: the transaction it fails is aborted, and the
// rows of other topics in it are published in a second transaction of the
// same round, each once; the held rows follow, in order, once the topic
// takes writes again.
func TestRetriableFailureHoldsOnlyItsRows(t *testing.T) {
	e := setup(t, 1, "up", "down")
	var refuse atomic.Bool
	refuse.Store(true)
	e.refuseTopic(t, "down", kerr.NotEnoughReplicas.Code, &refuse)
	var msgs []outbox.Message
	for i := range 5 {
		msgs = append(msgs,
			outbox.Message{Topic: "down", Key: []byte("k"), Value: []byte{byte('0' + i)}},
			outbox.Message{Topic: "up", Key: []byte{byte('a' + i)}, Value: []byte{byte('0' + i)}})
	}
	e.add(t, msgs...)
	cfg := e.fastConfig(t)
	cfg.ProduceTimeout = 2 * time.Second
	var failures atomic.Int64
	cfg.Hooks.OnPublishError = func(int, error) { failures.Add(1) }
	e.startRelay(t, cfg)
	up := e.consume(t, "up")
	recs := up.waitFor(5, 15*time.Second)
	// The down rows' failure is reported after the round that published
	// the up rows.
	eventually(t, 10*time.Second, "a publish error for the down rows", func() bool { return failures.Load() > 0 })
	if n := e.produced(t, "down"); n != 0 {
		t.Fatalf("%d records written to the refused topic", n)
	}
	refuse.Store(false)
	down := e.consume(t, "down").waitFor(5, 15*time.Second)
	for i, r := range down {
		if want := string([]byte{byte('0' + i)}); string(r.Value) != want {
			t.Fatalf("down record %d is %q, want %q (order of key k)", i, r.Value, want)
		}
	}
	eventually(t, 10*time.Second, "empty backlog", func() bool { return e.backlog(t) == 0 })
	recs = up.recs
	if records, distinct := distinctIDs(recs); records != 5 || distinct != 5 {
		t.Fatalf("up: a committed reader saw %d records with %d distinct message ids, want 5 of each", records, distinct)
	}
}
