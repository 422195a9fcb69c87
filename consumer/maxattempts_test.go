package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sethvargo/go-envconfig"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// MaxAttempts has one rule in a Config literal and in the environment: 0
// never means "retry for ever" (a literal's 0 is the default, a variable
// set to 0 is refused), RetryForever (-1) does, and any other negative
// value is a *ConfigError naming the field or the variable.
func TestMaxAttemptsOneRule(t *testing.T) {
	if got := consumer.DefaultConfig().MaxAttempts; got != 5 {
		t.Errorf("default MaxAttempts = %d, want 5", got)
	}
	for _, n := range []int{0, 1, 7, consumer.RetryForever} {
		cfg := consumer.Config{MaxAttempts: n}
		if err := cfg.Validate(); err != nil {
			t.Errorf("Config{MaxAttempts: %d}.Validate() = %v, want nil", n, err)
		}
	}
	for _, n := range []int{-2, -5, -1 << 31} {
		cfg := consumer.Config{MaxAttempts: n}
		var ce *consumer.ConfigError
		if err := cfg.Validate(); !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Field != "Config.MaxAttempts" ||
			!strings.Contains(ce.Problems[0].Reason, "RetryForever") {
			t.Errorf("Config{MaxAttempts: %d}.Validate() = %v, want a *ConfigError naming Config.MaxAttempts and RetryForever", n, err)
		}
	}

	read := func(v string) (consumer.Config, error) {
		return consumer.ConfigFromLookuper(context.Background(), envconfig.MapLookuper(map[string]string{"EXACTLY_MAX_ATTEMPTS": v}))
	}
	for v, want := range map[string]int{"3": 3, "-1": consumer.RetryForever} {
		if c, err := read(v); err != nil || c.MaxAttempts != want {
			t.Errorf("EXACTLY_MAX_ATTEMPTS=%s: MaxAttempts %d, %v; want %d", v, c.MaxAttempts, err, want)
		}
	}
	if c, err := consumer.ConfigFromLookuper(context.Background(), envconfig.MapLookuper(nil)); err != nil || c.MaxAttempts != 5 {
		t.Errorf("EXACTLY_MAX_ATTEMPTS unset: MaxAttempts %d, %v; want the default 5", c.MaxAttempts, err)
	}
	for _, v := range []string{"0", "-2", "-100"} {
		_, err := read(v)
		var ce *consumer.ConfigError
		if !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Field != "EXACTLY_MAX_ATTEMPTS" ||
			!strings.Contains(ce.Problems[0].Reason, "-1") || strings.Contains(err.Error(), "Config.") {
			t.Errorf("EXACTLY_MAX_ATTEMPTS=%s: %v, want a *ConfigError naming EXACTLY_MAX_ATTEMPTS and -1", v, err)
		}
	}
}

// End to end: a literal's MaxAttempts 0 dead-letters an always-failing
// record after the default 5 attempts and moves on; RetryForever keeps
// retrying it past that, holding its key (the record of another key after
// it is applied) or, with key concurrency off, its partition (nothing is),
// and dead-letters nothing.
func TestMaxAttemptsZeroIsDefaultAndRetryForeverHolds(t *testing.T) {
	for _, tc := range []struct {
		name           string
		maxAttempts    int
		keyConcurrency int
	}{{"zero", 0, 0}, {"forever", consumer.RetryForever, 0}, {"forever-ordered", consumer.RetryForever, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			pool, ob, brokers := outboxSetup(t, 1, "cmds")
			val := func(id string) []byte {
				b, _ := json.Marshal(credit{OrderID: id, Account: 1, Amount: 10})
				return b
			}
			testenv.Produce(t, brokers,
				&kgo.Record{Topic: "cmds", Key: []byte("order-fail"), Value: val("order-fail")},
				&kgo.Record{Topic: "cmds", Key: []byte("order-ok"), Value: val("order-ok")})
			var attempts atomic.Int32
			pastDefault := make(chan struct{})
			h := handler.New("credit",
				creditKey(),
				func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
					if msg.Value.OrderID == "order-fail" {
						if attempts.Add(1) == 8 {
							close(pastDefault)
						}
						return errors.New("always fails")
					}
					return insertCredit(ctx, tx, msg.Value)
				})
			o := newOutcomes()
			cfg := testConfig(brokers, "attempts-"+tc.name, "cmds")
			cfg.MaxAttempts = tc.maxAttempts
			cfg.KeyConcurrency = tc.keyConcurrency
			stop := startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()),
				consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)))
			if tc.maxAttempts == 0 {
				o.await(t, 60*time.Second, "both records", func() bool { return o.total() >= 2 })
				stop()
				if n := attempts.Load(); n != 5 || o.get("dead_lettered") != 1 || o.get("applied") != 1 {
					t.Errorf("MaxAttempts 0: %d attempts, outcomes %v; want 5 attempts (the default), 1 dead-lettered, 1 applied", n, o.snapshot())
				}
				return
			}
			select {
			case <-pastDefault:
			case <-time.After(60 * time.Second):
				t.Fatalf("RetryForever: %d attempts after 60s, want retries past the default 5", attempts.Load())
			}
			if tc.keyConcurrency != 1 {
				o.await(t, 60*time.Second, "the other key's record", func() bool { return o.get("applied") == 1 })
			}
			stop()
			got := o.snapshot()
			if tc.keyConcurrency == 1 && len(got) != 0 {
				t.Errorf("RetryForever, key concurrency off: outcomes %v after %d attempts; want none (the record holds its partition)", got, attempts.Load())
			}
			if tc.keyConcurrency != 1 && (len(got) != 1 || got["applied"] != 1) {
				t.Errorf("RetryForever: outcomes %v after %d attempts; want only the other key's record applied (the record holds its key)", got, attempts.Load())
			}
			if n := count(t, pool, `select count(*) from exactly_outbox`); n != 0 {
				t.Errorf("RetryForever: %d outbox rows, want no dead letter", n)
			}
		})
	}
}
