package schemaregistry_test

import (
	"context"
	"encoding/binary"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/schemaregistry"
	"github.com/exactly-go/exactly/handler/schemaregistry/avro"
	"github.com/exactly-go/exactly/handler/schemaregistry/internal/interop"
	shopv1 "github.com/exactly-go/exactly/handler/schemaregistry/internal/shoppb/v1"
	"github.com/exactly-go/exactly/handler/schemaregistry/protobuf"
	"github.com/exactly-go/exactly/handler/schemaregistry/srtest"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// scenario is one format's end-to-end run: records framed by Confluent's
// serializer (fixtures: a first record, a second of the same schema id,
// a third of an id the consumer has not seen), through a consumer whose
// handler emits an event per record through the outbox in the same
// format.
type scenario struct {
	topic, events  string
	fixtures       [3]string
	ids            [3]string // the business ids the fixtures carry
	keyConcurrency int
	// handler builds the handler, which records each id in table
	// applied(id) and emits an event keyed by it to events.
	handler func(t *testing.T, r *schemaregistry.Registry) handler.Any
	// event decodes an emitted event's value to its business id.
	event func(t *testing.T, r *schemaregistry.Registry, value []byte) string
}

// record counts what the consumer reports: outcomes, and retries for an
// unavailable registry.
type record struct {
	mu          sync.Mutex
	outcomes    map[dedupe.Outcome]int
	unavailable int
	changed     chan struct{}
}

func (r *record) hooks() consumer.Hooks {
	poke := func() {
		select {
		case r.changed <- struct{}{}:
		default:
		}
	}
	return consumer.Hooks{
		OnOutcome: func(_ context.Context, d consumer.OutcomeData) {
			r.mu.Lock()
			r.outcomes[d.Outcome]++
			r.mu.Unlock()
			poke()
		},
		OnRetry: func(_ context.Context, d consumer.RetryData) {
			if handler.IsUnavailable(d.Err) {
				r.mu.Lock()
				r.unavailable++
				r.mu.Unlock()
				poke()
			}
		},
	}
}

func (r *record) snapshot() (map[dedupe.Outcome]int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps(r.outcomes), r.unavailable
}

func maps(m map[dedupe.Outcome]int) map[dedupe.Outcome]int {
	out := map[dedupe.Outcome]int{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// await blocks until cond holds of the counts, failing t after a minute.
func (r *record) await(t *testing.T, what string, cond func(outcomes map[dedupe.Outcome]int, unavailable int) bool) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		o, u := r.snapshot()
		if cond(o, u) {
			return
		}
		select {
		case <-r.changed:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("timed out waiting for %s (outcomes %v, retries for the registry %d)", what, o, u)
		}
	}
}

// run runs s: the first record with the registry up; then, with the
// registry down, the second (its schema id is cached: it applies), the
// third (an unseen id: it waits, and holds the records after it), the
// first again (a duplicate), one with an unknown schema id and one with a
// wrong magic byte; then the registry comes back. Nothing is
// dead-lettered while it is down; afterwards every record ends once: the
// three applied, the repeat a duplicate, the two bad ones dead-lettered
// with reasons naming what was wrong, and one event per applied record
// published.
func (s scenario) run(t *testing.T) {
	ctx := context.Background()
	reg := srtest.New()
	defer reg.Close()
	interop.Seed(t, reg)
	r, err := schemaregistry.Dial(reg.URL(), schemaregistry.WithTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	brokers := testenv.Brokers(testenv.Kafka(t, 1, s.topic))
	pool := testenv.DB(t)
	if _, err := pool.Exec(ctx, `create table applied(id text primary key)`); err != nil {
		t.Fatal(err)
	}
	cfg := consumer.DefaultConfig()
	cfg.Brokers, cfg.Group, cfg.Topics = brokers, "sr-"+s.topic, []string{s.topic}
	cfg.CommitInterval, cfg.SessionTimeout, cfg.RebalanceTimeout = 100*time.Millisecond, 6*time.Second, 10*time.Second
	cfg.RetryBackoff, cfg.RetryBackoffMax = 20*time.Millisecond, 200*time.Millisecond
	cfg.KeyConcurrency = s.keyConcurrency
	rec := &record{outcomes: map[dedupe.Outcome]int{}, changed: make(chan struct{}, 1)}
	svc, err := consumer.NewService(cfg, pool, consumer.Handle(s.handler(t, r), s.topic), consumer.WithHooks(rec.hooks()))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("service: %v", err)
		}
	}()

	produce := func(key string, value []byte) {
		testenv.Produce(t, brokers, &kgo.Record{Topic: s.topic, Key: []byte(key), Value: value})
	}
	first := interop.Fixture(t, s.fixtures[0])
	produce(s.ids[0], first)
	rec.await(t, "the first record", func(o map[dedupe.Outcome]int, _ int) bool { return o[dedupe.Applied] == 1 })

	reg.SetDown(true)
	unknown := slices.Clone(first)
	binary.BigEndian.PutUint32(unknown[1:5], 999)
	produce(s.ids[1], interop.Fixture(t, s.fixtures[1]))
	produce(s.ids[2], interop.Fixture(t, s.fixtures[2]))
	produce(s.ids[0], first)
	produce("unknown-id", unknown)
	produce("wrong-magic", append([]byte{7}, first[1:]...))
	rec.await(t, "the cached id's record, and the unseen id's retried while the registry is down", func(o map[dedupe.Outcome]int, u int) bool {
		return o[dedupe.Applied] == 2 && u >= 3
	})
	if o, _ := rec.snapshot(); o[dedupe.DeadLettered] != 0 || o[dedupe.Duplicate] != 0 || reg.Refused() == 0 {
		t.Fatalf("while the registry was down: outcomes %v, %d requests refused; want 2 applied, nothing else ended", o, reg.Refused())
	}
	reg.SetDown(false)
	rec.await(t, "every record", func(o map[dedupe.Outcome]int, _ int) bool {
		return o[dedupe.Applied]+o[dedupe.Duplicate]+o[dedupe.DeadLettered] >= 6
	})
	o, _ := rec.snapshot()
	if o[dedupe.Applied] != 3 || o[dedupe.Duplicate] != 1 || o[dedupe.DeadLettered] != 2 {
		t.Errorf("outcomes %v; want 3 applied, 1 duplicate, 2 dead-lettered", o)
	}
	var n int
	if err := pool.QueryRow(ctx, `select count(*) from applied`).Scan(&n); err != nil || n != 3 {
		t.Errorf("applied holds %d rows (%v); want 3", n, err)
	}
	reasons := map[string]string{}
	for _, d := range testenv.ReadTopic(t, brokers, s.topic+cfg.DeadLetterSuffix, 2) {
		for _, h := range d.Headers {
			if h.Key == outbox.HeaderError {
				reasons[string(d.Key)] = string(h.Value)
			}
		}
	}
	if !strings.Contains(reasons["unknown-id"], "schema id 999") {
		t.Errorf("the unknown id's dead letter says %q; want it to name schema id 999", reasons["unknown-id"])
	}
	if !strings.Contains(reasons["wrong-magic"], "magic byte") {
		t.Errorf("the wrong magic byte's dead letter says %q", reasons["wrong-magic"])
	}
	var got []string
	for _, e := range testenv.ReadTopic(t, brokers, s.events, 3) {
		got = append(got, s.event(t, r, e.Value))
	}
	slices.Sort(got)
	if want := slices.Sorted(slices.Values(s.ids[:])); !slices.Equal(got, want) {
		t.Errorf("events for %v; want one for each of %v", got, want)
	}
}

func insertApplied(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := tx.Exec(ctx, `insert into applied(id) values ($1)`, id)
	return err
}

// A Protobuf handler consumes records framed by Confluent's serializer
// (v1 and v2 producers), dedupes, emits Protobuf through the outbox,
// dead-letters an unknown schema id naming it, and rides out a registry
// outage, with key concurrency on (the default).
func TestProtobufHandlerEndToEnd(t *testing.T) {
	scenario{
		topic: "orders.paid", events: "orders.audit",
		fixtures: [3]string{"pb-v1-o1.bin", "pb-v1-o2.bin", "pb-v2-o3.bin"}, ids: [3]string{"o-1", "o-2", "o-3"},
		keyConcurrency: 64,
		handler: func(t *testing.T, r *schemaregistry.Registry) handler.Any {
			codec := protobuf.New(r)
			events := codec.ForTopic("orders.audit")
			return handler.New("audit-orders",
				handler.FromPayload(func(m *shopv1.OrderPaid) string { return dedupe.Key("paid", m.GetOrderId()) }),
				func(ctx context.Context, tx pgx.Tx, msg handler.Message[*shopv1.OrderPaid]) error {
					if err := insertApplied(ctx, tx, msg.Value.GetOrderId()); err != nil {
						return err
					}
					return outbox.AddValue(ctx, tx, "orders.audit", []byte(msg.Value.GetOrderId()), msg.Value, events)
				}, handler.WithCodec(codec))
		},
		event: func(t *testing.T, r *schemaregistry.Registry, value []byte) string {
			var m *shopv1.OrderPaid
			if err := protobuf.New(r).Unmarshal(value, &m); err != nil {
				t.Fatalf("an emitted event: %v", err)
			}
			return m.GetOrderId()
		},
	}.run(t)
}

type payment struct {
	PaymentID string `avro:"payment_id"`
	Amount    int64  `avro:"amount"`
}

const paymentSchema = `{"type":"record","name":"Payment","namespace":"shop","fields":[{"name":"payment_id","type":"string"},{"name":"amount","type":"long"}]}`

// The same for an Avro handler (a v1 reader of v1 and v2 records), with
// key concurrency off.
func TestAvroHandlerEndToEnd(t *testing.T) {
	newCodec := func(t *testing.T, r *schemaregistry.Registry) *avro.Codec {
		c, err := avro.New(r, paymentSchema)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	scenario{
		topic: "payments", events: "payments.audit",
		fixtures: [3]string{"avro-v1-p1.bin", "avro-v1-p2.bin", "avro-v2-p3.bin"}, ids: [3]string{"p-1", "p-2", "p-3"},
		keyConcurrency: 1,
		handler: func(t *testing.T, r *schemaregistry.Registry) handler.Any {
			codec := newCodec(t, r)
			events := codec.ForTopic("payments.audit")
			return handler.New("audit-payments",
				handler.FromPayload(func(p payment) string { return dedupe.Key("payment", p.PaymentID) }),
				func(ctx context.Context, tx pgx.Tx, msg handler.Message[payment]) error {
					if err := insertApplied(ctx, tx, msg.Value.PaymentID); err != nil {
						return err
					}
					return outbox.AddValue(ctx, tx, "payments.audit", []byte(msg.Value.PaymentID), msg.Value, events)
				}, handler.WithCodec(codec))
		},
		event: func(t *testing.T, r *schemaregistry.Registry, value []byte) string {
			var p payment
			if err := newCodec(t, r).Unmarshal(value, &p); err != nil {
				t.Fatalf("an emitted event: %v", err)
			}
			return p.PaymentID
		},
	}.run(t)
}
