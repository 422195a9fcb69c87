package outbox_test

import (
	"bytes"
	"context"
	"math/rand/v2"
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

// Rows of one key keep their order across an aborted transaction: r1 (key
// K) is acknowledged in a transaction that aborts because r2 (K, next) and
// r3 (J) are refused together with a permanent error (emulated: the first
// two batches over 1000 bytes get MESSAGE_TOO_LARGE, and each of r2 and r3
// fits in a batch of its own). r1 is produced again before r2 is tried
// alone, so a reader sees r1 before r2, and nothing is parked.
func TestAbortedTransactionKeepsKeyOrder(t *testing.T) {
	e := setup(t, 1, "t")
	var refused atomic.Int64
	e.kafka.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.KeepControl()
		preq := req.(*kmsg.ProduceRequest)
		over := false
		for _, rt := range preq.Topics {
			for _, rp := range rt.Partitions {
				over = over || len(rp.Records) > 1000
			}
		}
		if !over || refused.Load() >= 2 {
			return nil, nil, false
		}
		refused.Add(1)
		return testenv.RefuseProduce(preq, func(kmsg.ProduceRequestTopic) int16 { return kerr.MessageTooLarge.Code }), nil, true
	})
	value := func(seed byte, n int) []byte {
		v := make([]byte, n) // incompressible: the batch really is that large
		rand.NewChaCha8([32]byte{seed}).Read(v)
		return v
	}
	r1 := value(1, 600)
	e.add(t, outbox.Message{Topic: "t", Key: []byte("K"), Value: r1},
		outbox.Message{Topic: "t", Key: []byte("K"), Value: value(2, 1000)},
		outbox.Message{Topic: "t", Key: []byte("J"), Value: value(3, 1000)})
	cfg := e.fastConfig(t)
	cfg.MaxRecordBytes = 1200 // one record per batch
	var parked atomic.Int64
	cfg.Hooks.OnParked = func(int64, string, []byte, string) { parked.Add(1) }
	e.startRelay(t, cfg)
	recs := e.consume(t, "t").waitFor(3, 15*time.Second)
	eventually(t, 10*time.Second, "empty backlog", func() bool { return e.backlog(t) == 0 })
	if refused.Load() < 2 {
		t.Fatalf("%d batches refused, want 2: the emulation did not apply", refused.Load())
	}
	var k []*kgo.Record
	for _, r := range recs {
		if string(r.Key) == "K" {
			k = append(k, r)
		}
	}
	if len(recs) != 3 || len(k) != 2 || !bytes.Equal(k[0].Value, r1) {
		t.Fatalf("read %d records, %d of key K, the first of K r1: %v; want 3, 2, r1 first", len(recs), len(k), len(k) > 0 && bytes.Equal(k[0].Value, r1))
	}
	if n := parked.Load(); n != 0 {
		t.Fatalf("%d rows parked, want none", n)
	}
}
