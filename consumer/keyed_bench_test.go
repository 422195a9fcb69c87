package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
)

// BenchmarkRetryDelaysOtherKeys measures how long a record that fails its
// first 3 attempts (default backoff: 100, 200 and 400 ms) delays the 200
// records of other keys behind it in its partition: the time until the
// last of them commits, with the failing record first, minus the same time
// without a failure. It reports delay-ms, with key concurrency on (the
// default) and off; the target is at most 100 ms with it on.
//
//	go test -run '^$' -bench BenchmarkRetryDelaysOtherKeys -benchtime 1x ./consumer/
func BenchmarkRetryDelaysOtherKeys(b *testing.B) {
	for _, kc := range []int{64, 1} {
		b.Run(fmt.Sprintf("key_concurrency=%d", kc), func(b *testing.B) {
			var delay time.Duration
			for i := 0; b.Loop(); i++ {
				failing := othersDone(b, kc, true, i)
				clean := othersDone(b, kc, false, i)
				delay += failing - clean
			}
			b.ReportMetric(float64(delay.Milliseconds())/float64(b.N), "delay-ms")
		})
	}
}

// othersDone runs one consumer over a partition whose first record (key A)
// fails its first 3 attempts when fail is set, followed by 200 records of
// other keys, and returns the time from the first handler run until the
// last of the others committed.
func othersDone(b *testing.B, kc int, fail bool, round int) time.Duration {
	b.Helper()
	pool := testenv.DB(b)
	if _, err := pool.Exec(context.Background(), `create table applied(seq bigserial primary key, id text not null, k text, off bigint not null, result text)`); err != nil {
		b.Fatal(err)
	}
	setupLedger(b, pool)
	brokers := testenv.Brokers(testenv.Kafka(b, 1, "jobs"))
	const others = 200
	recs := []*kgo.Record{jobRecord("A", job{ID: "a"})}
	for i := range others {
		recs = append(recs, jobRecord(fmt.Sprintf("k%d", i), job{ID: fmt.Sprint(i)}))
	}
	testenv.Produce(b, brokers, recs...)
	var (
		mu       sync.Mutex
		attempts int
		first    time.Time
		last     time.Time
		n        int
		done     = make(chan struct{})
	)
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		mu.Lock()
		if first.IsZero() {
			first = time.Now()
		}
		mu.Unlock()
		if fail && msg.Value.ID == "a" {
			mu.Lock()
			attempts++
			a := attempts
			mu.Unlock()
			if a <= 3 {
				return errors.New("try again later")
			}
		}
		return insertJob(ctx, tx, msg, "")
	})
	cfg := testConfig(brokers, fmt.Sprintf("delay-%d-%v-%d", kc, fail, round), "jobs")
	cfg.KeyConcurrency = kc
	cfg.RetryBackoff, cfg.RetryBackoffMax = consumer.DefaultConfig().RetryBackoff, consumer.DefaultConfig().RetryBackoffMax
	stop := startConsumer(b, cfg, pool, consumer.Handle(h), consumer.WithHooks(consumer.Hooks{
		OnOutcome: func(_ context.Context, d consumer.OutcomeData) {
			mu.Lock()
			defer mu.Unlock()
			now := time.Now()
			if string(d.Record.Key) != "A" {
				if n++; n == others {
					last = now
					close(done)
				}
			}
		}}))
	defer stop()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		b.Fatal("the other keys' records did not all commit within 60s")
	}
	mu.Lock()
	defer mu.Unlock()
	return last.Sub(first)
}
