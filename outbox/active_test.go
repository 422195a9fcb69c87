package outbox_test

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/exactly-go/exactly/internal/runtime/telemetry"
)

// relayActive reads exactly.relay.active from r: its value and whether it
// was observed at all.
func relayActive(t *testing.T, r *sdkmetric.ManualReader) (int64, bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != telemetry.MetricRelayActive {
				continue
			}
			for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
				if v, _ := dp.Attributes.Value(telemetry.OutboxTable); v.AsString() != `"exactly_outbox"` {
					t.Errorf("exactly.relay.active with table %q", v.AsString())
				}
				return dp.Value, true
			}
		}
	}
	return 0, false
}

// Two relays on one table: exactly.relay.active reads 1 on the one that
// holds the relay lease and 0 on the standby; when the active one stops,
// the standby takes the lock and its gauge turns 1.
func TestRelayActiveGauge(t *testing.T) {
	e := setup(t, 1, "t")
	var readers [2]*sdkmetric.ManualReader
	var relays [2]*runningRelay
	for i := range relays {
		readers[i] = sdkmetric.NewManualReader()
		cfg := e.fastConfig(t)
		cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(readers[i]))
		relays[i] = e.startRelay(t, cfg)
	}
	read := func() (a, b int64) {
		a, okA := relayActive(t, readers[0])
		b, okB := relayActive(t, readers[1])
		if !okA || !okB {
			t.Fatalf("exactly.relay.active not observed on both relays (%v, %v)", okA, okB)
		}
		return a, b
	}
	eventually(t, 10*time.Second, "one relay reporting active", func() bool { a, b := read(); return a+b == 1 })
	a, _ := read()
	active := 0
	if a == 0 {
		active = 1
	}
	relays[active].stop()
	standby := readers[1-active]
	eventually(t, 10*time.Second, "the standby reporting active after the active relay stopped", func() bool {
		v, ok := relayActive(t, standby)
		return ok && v == 1
	})
}
