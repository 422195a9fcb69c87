package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// serviceCodec is a codec that reads from a service which can be down (as
// a schema registry codec does): JSON, except that while down a value
// whose order id does not start with "cached-" fails with an
// *handler.UnavailableError.
type serviceCodec struct {
	handler.JSON
	down *atomic.Bool
}

func (c serviceCodec) Unmarshal(data []byte, v any) error {
	if c.down.Load() && !strings.Contains(string(data), `"order_id":"cached-`) {
		return &handler.UnavailableError{Service: "test service", Err: errors.New("connection refused")}
	}
	return c.JSON.Unmarshal(data, v)
}

// A codec's service down is an outage, with key concurrency off and on:
// the records before the first one it cannot decode commit, that record
// and every record after it on its partition wait (a later record its
// codec could decode included: nothing passes a record whose key is
// unknown), nothing is dead-lettered, the retries reach OnRetry; once the
// service is back every record ends once, an undecodable one dead-lettered.
func TestCodecServiceDownHoldsThePartition(t *testing.T) {
	for _, kc := range []int{1, 8} {
		t.Run(fmt.Sprintf("key concurrency %d", kc), func(t *testing.T) {
			ctx := context.Background()
			pool, ob, brokers := outboxSetup(t, 1, "cmds")
			var down atomic.Bool
			h := handler.New("credit", creditKey(),
				func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
					return insertCredit(ctx, tx, msg.Value)
				},
				handler.WithCodec(serviceCodec{down: &down}))
			o := newOutcomes()
			var unavailable atomic.Int64
			hooks := o.hooks()
			hooks.OnRetry = func(_ context.Context, d consumer.RetryData) {
				if handler.IsUnavailable(d.Err) {
					unavailable.Add(1)
					select {
					case o.changed <- struct{}{}:
					default:
					}
				}
			}
			cfg := testConfig(brokers, fmt.Sprintf("codec-outage-%d", kc), "cmds")
			cfg.KeyConcurrency = kc
			startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(hooks),
				consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)))
			produce := func(id string) {
				v := fmt.Sprintf(`{"order_id":%q,"account":1,"amount":1}`, id)
				if id == "garbage" {
					v = `{"order_id": 42}`
				}
				testenv.Produce(t, brokers, &kgo.Record{Topic: "cmds", Key: []byte(id), Value: []byte(v)})
			}
			produce("cached-1")
			o.await(t, 30*time.Second, "the first record", func() bool { return o.get("applied") == 1 })

			down.Store(true)
			for _, id := range []string{"cached-2", "fresh-3", "cached-4", "garbage"} {
				produce(id)
			}
			o.await(t, 30*time.Second, "cached-2 applied and fresh-3 retried while the service is down", func() bool {
				return o.get("applied") == 2 && unavailable.Load() >= 3
			})
			if got := o.snapshot(); got["dead_lettered"] != 0 || got["duplicate"] != 0 || got["applied"] != 2 {
				t.Fatalf("while the service was down: %v; want cached-1 and cached-2 applied, nothing else ended", got)
			}
			down.Store(false)
			o.await(t, 30*time.Second, "every record", func() bool { return o.total() == 5 })
			if got := o.snapshot(); got["applied"] != 4 || got["dead_lettered"] != 1 {
				t.Errorf("outcomes %v; want 4 applied, the garbage dead-lettered", got)
			}
			var ids []string
			rows, err := pool.Query(ctx, `select order_id from ledger order by id`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if want := "cached-1 cached-2 fresh-3 cached-4"; strings.Join(ids, " ") != want {
				t.Errorf("ledger in commit order: %v; want %s (nothing passed fresh-3)", ids, want)
			}
		})
	}
}
