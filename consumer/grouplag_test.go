package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/telemetry"
	"github.com/exactly-go/exactly/internal/testenv"
)

// gauges returns the values of the int64 gauge name by partition id
// ("" for a gauge without one).
func gauges(t *testing.T, r *sdkmetric.ManualReader, name string) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
				v, _ := dp.Attributes.Value(telemetry.MessagingPartitionID)
				out[v.AsString()] = dp.Value
			}
		}
	}
	return out
}

// frozenCredit is a credit handler that never returns until ctx ends or
// release is closed: a member that froze.
func frozenCredit(release <-chan struct{}) *handler.Handler[credit] {
	return handler.New("credit", creditKey(),
		func(ctx context.Context, _ pgx.Tx, _ handler.Message[credit]) error {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-release:
				return fmt.Errorf("released")
			}
		})
}

// A member whose partition does not progress (its handler froze) keeps
// that partition's lag visible on the other member's series: the healthy
// member exports exactly.consumer.group_lag for the frozen member's
// partition, read from the broker, rising with every record produced to
// it, with the group's committed offset standing still, while its own
// exactly.consumer.lag has no series for a partition it does not own. It
// also exports the group's two members.
func TestGroupLagSurvivesItsConsumer(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 2, "credits"))
	cfg := testConfig(brokers, "lagged", "credits")
	cfg.GroupLagInterval = 100 * time.Millisecond

	frozenReader, healthyReader := sdkmetric.NewManualReader(), sdkmetric.NewManualReader()
	release := make(chan struct{})
	startConsumer(t, cfg, pool, consumer.Handle(frozenCredit(release)),
		consumer.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(frozenReader))))
	startConsumer(t, cfg, pool, consumer.Handle(creditHandler(0)),
		consumer.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(healthyReader))))
	t.Cleanup(func() { close(release) }) // runs before the consumers stop

	// Both members own one partition each before any record arrives (the
	// in-flight gauge has a series per owned partition).
	var frozenPart, healthyPart string
	awaitCond(t, "each member owning one partition", func() bool {
		f, h := gauges(t, frozenReader, telemetry.MetricPartitionInFlight), gauges(t, healthyReader, telemetry.MetricPartitionInFlight)
		if len(f) != 1 || len(h) != 1 {
			return false
		}
		for p := range f {
			frozenPart = p
		}
		for p := range h {
			healthyPart = p
		}
		return frozenPart != healthyPart && gauges(t, healthyReader, telemetry.MetricConsumerGroupMembers)[""] == 2
	})

	var recs []*kgo.Record
	for i := range 20 {
		v, _ := json.Marshal(credit{OrderID: fmt.Sprintf("order-%d", i), Account: 1, Amount: 1})
		recs = append(recs, &kgo.Record{Topic: "credits", Partition: int32(i % 2), Value: v})
	}
	produceManual(t, brokers, recs...)

	awaitCond(t, "the healthy member exporting lag 10 for the frozen member's partition and 0 for its own", func() bool {
		lag := gauges(t, healthyReader, telemetry.MetricConsumerGroupLag)
		return lag[frozenPart] == 10 && lag[healthyPart] == 0
	})
	if own := gauges(t, healthyReader, telemetry.MetricConsumerLag); len(own) > 0 {
		if _, ok := own[frozenPart]; ok {
			t.Errorf("the healthy member's own exactly.consumer.lag reports the partition it does not own: %v", own)
		}
	}
	committed := gauges(t, healthyReader, telemetry.MetricConsumerGroupCommitted)
	if committed[healthyPart] != 10 {
		t.Errorf("group committed offset of the healthy partition = %d, want 10 (%v)", committed[healthyPart], committed)
	}
	if c, ok := committed[frozenPart]; ok && c != 0 {
		t.Errorf("group committed offset of the frozen partition = %d, want none or 0", c)
	}

	// The frozen partition's lag keeps rising on the healthy member's
	// series.
	produceManual(t, brokers, &kgo.Record{Topic: "credits", Partition: int32(mustAtoi(t, frozenPart)), Value: recs[0].Value})
	awaitCond(t, "the frozen partition's lag rising to 11", func() bool {
		return gauges(t, healthyReader, telemetry.MetricConsumerGroupLag)[frozenPart] == 11
	})
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("partition id %q: %v", s, err)
	}
	return n
}

// awaitCond polls cond (a metrics read: there is no event to await)
// until it holds, for up to 60s.
func awaitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out awaiting %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
