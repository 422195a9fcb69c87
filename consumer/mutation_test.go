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
	"github.com/exactly-go/exactly/dedupe"
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

// Handlers that keep their messages after returning (to log them later,
// say) keep what they were given: the runtime reuses its own state of a
// finished record for later ones, never the bytes or values a handler saw.
// A pipelined and a set-based handler each keep every message of 600
// records through small batches and windows (and a pipelined one with key
// concurrency off, where the executor prepares and releases the records
// of each run); at the end each kept record and value is still its own.
func TestHandlersKeepingTheirMessagesKeepThemIntact(t *testing.T) {
	type kept struct {
		value []byte
		msg   credit
		key   string
	}
	check := func(t *testing.T, got []kept) {
		t.Helper()
		if len(got) != 600 {
			t.Fatalf("the handler kept %d messages, want 600", len(got))
		}
		for _, k := range got {
			var produced credit
			if err := json.Unmarshal(k.value, &produced); err != nil {
				t.Fatalf("a kept record's value %q no longer decodes: %v", k.value, err)
			}
			if produced != k.msg || k.key != dedupe.Key("credit", k.msg.OrderID) {
				t.Fatalf("kept record %q, value %+v, key %q: they no longer agree", k.value, k.msg, k.key)
			}
		}
	}
	for _, form := range []string{"pipelined", "set", "pipelined, key concurrency 1"} {
		t.Run(form, func(t *testing.T) {
			pool, _, brokers := outboxSetup(t, 2, "cmds")
			produceCopies(t, brokers, "cmds", 600, 1, 2)
			var mu sync.Mutex
			var got []kept
			keep := func(msg handler.Message[credit]) {
				mu.Lock()
				got = append(got, kept{value: msg.Record.Value, msg: msg.Value, key: msg.Key})
				mu.Unlock()
			}
			var h handler.Any
			if form != "set" {
				h = handler.NewPipelined("credit", creditKey(), func(_ context.Context, _ handler.Queue, msg handler.Message[credit]) error {
					keep(msg)
					return nil
				})
			} else {
				h = handler.NewSet("credit", creditKey(), func(_ context.Context, _ pgx.Tx, msgs []handler.Message[credit]) error {
					for _, m := range msgs {
						keep(m)
					}
					return nil
				})
			}
			o := newOutcomes()
			cfg := testConfig(brokers, "keeping-"+strings.ReplaceAll(strings.ReplaceAll(form, " ", "-"), ",", ""), "cmds")
			cfg.BatchMaxRecords, cfg.KeyConcurrency = 5, 4
			if strings.HasSuffix(form, "key concurrency 1") {
				// The executor prepares the records and releases them
				// at the end of each run.
				cfg.KeyConcurrency = 1
			}
			startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
			o.await(t, 60*time.Second, "600 outcomes", func() bool { return o.total() == 600 })
			mu.Lock()
			defer mu.Unlock()
			check(t, got)
		})
	}
}
