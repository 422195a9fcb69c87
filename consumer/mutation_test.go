package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// A handler that treats its record as scratch space (decrypts the value in
// place, overwrites a header's bytes, replaces and appends headers, and
// scribbles on the key) and then fails once, and for good at its second
// attempt: its retry decodes the record as produced, and the dead letter
// written to the outbox carries the produced key, value and headers, none
// of the scribbles. (The runtime used to hand the handler the very bytes
// it retried and dead-lettered: the retry failed to decode and the dead
// letter carried '#'s.)
func TestMutatingHandlerDeadLettersTheOriginal(t *testing.T) {
	ctx := context.Background()
	pool, ob, brokers := outboxSetup(t, 1, "cmds")
	value, err := json.Marshal(credit{OrderID: "order-m", Account: 1, Amount: 10})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Produce(t, brokers, &kgo.Record{Topic: "cmds", Key: []byte("key-m"), Value: value,
		Headers: []kgo.RecordHeader{{Key: "h1", Value: []byte("one")}, {Key: "h2", Value: []byte("two")}}})
	want := fmt.Sprintf("key=%q value=%q h1=%q h2=%q", "key-m", value, "one", "two")
	var mu sync.Mutex
	var seen []string
	h := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			r := &msg.Record
			got := fmt.Sprintf("key=%q value=%q", r.Key, r.Value)
			for _, h := range r.Headers {
				got += fmt.Sprintf(" %s=%q", h.Key, h.Value)
			}
			mu.Lock()
			seen = append(seen, got)
			mu.Unlock()
			for _, b := range [][]byte{r.Key, r.Value, r.Headers[0].Value} {
				for i := range b {
					b[i] = '#'
				}
			}
			r.Headers[1] = handler.Header{Key: "swapped", Value: []byte("by the handler")}
			r.Headers = append(r.Headers, handler.Header{Key: "added", Value: []byte("by the handler")})
			if msg.Attempt == 1 {
				return errors.New("fails once")
			}
			return handler.Permanent(errors.New("gives up"))
		})
	o := newOutcomes()
	cfg := testConfig(brokers, "mutating", "cmds")
	cfg.MaxAttempts = 3
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()),
		consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)))
	o.await(t, 30*time.Second, "the record's outcome", func() bool { return o.total() == 1 })
	if d := o.get("dead_lettered"); d != 1 {
		t.Fatalf("outcomes %v, want the record dead-lettered", o.snapshot())
	}
	mu.Lock()
	if len(seen) != 2 || seen[0] != want || seen[1] != want {
		t.Errorf("the handler's runs saw %q, want two runs each seeing %s", seen, want)
	}
	mu.Unlock()
	var key, val []byte
	var headers []struct {
		Key   string `json:"key"`
		Value []byte `json:"value"`
	}
	if err := pool.QueryRow(ctx, `select key, value, headers from exactly_outbox where topic = 'cmds.dlq'`).Scan(&key, &val, &headers); err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprintf("key=%q value=%q", key, val)
	var reason string
	for _, h := range headers {
		switch {
		case h.Key == outbox.HeaderError:
			reason = string(h.Value)
		case !strings.HasPrefix(h.Key, "exactly-"):
			got += fmt.Sprintf(" %s=%q", h.Key, h.Value)
		}
	}
	if got != want || !strings.Contains(reason, "gives up") {
		t.Errorf("dead letter %s (reason %q), want %s for the handler's permanent error", got, reason, want)
	}
}
