package telemetry_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/exactly-go/exactly/internal/runtime/telemetry"
)

// The consumer's and the outbox's gauges keep their names, units and
// attributes: lag per (topic, partition, group), duplicate ratio per
// handler, parked rows per outbox table.
func TestGaugesKeepNamesUnitsAndAttributes(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	reg, err := telemetry.ObserveConsumer(mp, "billing", func(o telemetry.ConsumerObserver) {
		o.Lag("credits", 3, 42)
		o.DuplicateRatio("credit", 0.25)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Unregister()
	parked, err := telemetry.ObserveParked(mp, `"outbox"`, func(context.Context) (int64, error) { return 7, nil })
	if err != nil {
		t.Fatal(err)
	}
	defer parked.Unregister()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	type point struct {
		unit  string
		attrs attribute.Set
		value float64
	}
	got := map[string]point{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				got[m.Name] = point{m.Unit, d.DataPoints[0].Attributes, float64(d.DataPoints[0].Value)}
			case metricdata.Gauge[float64]:
				got[m.Name] = point{m.Unit, d.DataPoints[0].Attributes, d.DataPoints[0].Value}
			}
		}
	}
	want := map[string]point{
		"exactly.consumer.lag": {"{message}", attribute.NewSet(
			attribute.String("messaging.destination.name", "credits"),
			attribute.String("messaging.destination.partition.id", "3"),
			attribute.String("messaging.consumer.group.name", "billing")), 42},
		"exactly.duplicate.ratio": {"1", attribute.NewSet(attribute.String("exactly.handler", "credit")), 0.25},
		"exactly.outbox.parked":   {"{row}", attribute.NewSet(attribute.String("exactly.outbox.table", `"outbox"`)), 7},
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("no gauge %s collected (got %v)", name, got)
			continue
		}
		if g.unit != w.unit || !g.attrs.Equals(&w.attrs) || g.value != w.value {
			t.Errorf("%s = %s %v %v, want %s %v %v", name, g.unit, g.attrs.Encoded(attribute.DefaultEncoder()), g.value,
				w.unit, w.attrs.Encoded(attribute.DefaultEncoder()), w.value)
		}
	}
}
