package consumer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testenv"
)

// A pool smaller than the sizing rule gives the partitions a member works
// on makes partition workers queue for connections: the consumer says so,
// naming both numbers and the size to raise it to, and still applies every
// record.
func TestSmallPoolIsReported(t *testing.T) {
	ctx := context.Background()
	url := testenv.DBURL(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	pool, err := pgxpool.New(ctx, url+sep+"pool_max_conns=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 3, "credits")
	brokers := testenv.Brokers(kc)
	var recs []*kgo.Record
	for p := int32(0); p < 3; p++ {
		v, _ := json.Marshal(credit{OrderID: fmt.Sprintf("o-%d", p), Account: 1, Amount: 1})
		recs = append(recs, &kgo.Record{Topic: "credits", Partition: p, Value: v})
	}
	testenv.Produce(t, brokers, recs...)
	var logs bytes.Buffer
	w := &syncWriter{w: &logs}
	o := newOutcomes()
	startConsumer(t, testConfig(brokers, "small-pool", "credits"), pool, consumer.Handle(creditHandler(0)), consumer.WithHooks(o.hooks()),
		consumer.WithLogger(slog.New(slog.NewTextHandler(w, nil))))
	o.await(t, 60*time.Second, "every record", func() bool { return o.get("applied") == 3 })
	w.mu.Lock()
	out := logs.String()
	w.mu.Unlock()
	if !strings.Contains(out, "fewer pool connections than the sizing rule gives the partition workers") || !strings.Contains(out, "workers=3 max_conns=1 suggested_max_conns=5") {
		t.Errorf("no warning naming 3 workers and 1 connection in the logs:\n%s", out)
	}
}
