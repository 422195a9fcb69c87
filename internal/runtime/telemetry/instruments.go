package telemetry

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// KafkaTracing returns the franz-go client option that traces produced
// records with franz-go's kotel plugin: a "<topic> publish" span per
// record, child of the record's Context (the ctx given to Produce when the
// record has none), whose W3C traceparent kotel writes into the record's
// headers. Use it for producers of commands and for the outbox relay. A
// record whose Context holds no span gets a root publish span and keeps any
// traceparent header it already had.
func KafkaTracing(tp trace.TracerProvider, mp metric.MeterProvider) kgo.Opt {
	k := kotel.NewKotel(
		kotel.WithTracer(kotel.NewTracer(kotel.TracerProvider(tp), kotel.TracerPropagator(propagation.TraceContext{}))),
		kotel.WithMeter(kotel.NewMeter(kotel.MeterProvider(mp))),
	)
	return kgo.WithHooks(k.Hooks()...)
}

// BacklogFunc reports an outbox's backlog: rows awaiting publication and
// the age of the oldest (outbox.Outbox.Backlog with a pool fits).
type BacklogFunc func(ctx context.Context) (rows int64, oldest time.Duration, err error)

// ObserveOutbox registers the observable gauges exactly.outbox.backlog
// (rows) and exactly.outbox.oldest_age (seconds) for the outbox named
// table, read through backlog at every collection. Unregister the returned
// registration to stop.
func ObserveOutbox(mp metric.MeterProvider, table string, backlog BacklogFunc) (metric.Registration, error) {
	m := mp.Meter(InstrumentationName)
	rows, err := m.Int64ObservableGauge(MetricOutboxBacklog, metric.WithUnit("{row}"),
		metric.WithDescription("Outbox rows committed and not yet published."))
	if err != nil {
		return nil, err
	}
	age, err := m.Float64ObservableGauge(MetricOutboxOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest outbox row awaiting publication (0 when none)."))
	if err != nil {
		return nil, err
	}
	set := metric.WithAttributes(OutboxTable.String(table))
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		n, oldest, err := backlog(ctx)
		if err != nil {
			return err
		}
		o.ObserveInt64(rows, n, set)
		o.ObserveFloat64(age, oldest.Seconds(), set)
		return nil
	}, rows, age)
}

// RelayPublished returns a function for outbox.RelayHooks.OnPublished that
// records every published row's commit-to-ack latency in the histogram
// exactly.relay.commit_to_ack (seconds; its buckets go from a millisecond,
// a relay woken at the commit, to five minutes, a backlog or an outage of
// the broker). It fails only when the instrument cannot be created.
func RelayPublished(mp metric.MeterProvider, table string) (func(n int, commitToAck []time.Duration), error) {
	h, err := mp.Meter(InstrumentationName).Float64Histogram(MetricRelayCommitToAck, metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
		metric.WithDescription("From the transaction that wrote an outbox row to the broker's acknowledgement of its record."))
	if err != nil {
		return nil, err
	}
	set := metric.WithAttributes(OutboxTable.String(table))
	return func(_ int, lat []time.Duration) {
		for _, d := range lat {
			h.Record(context.Background(), d.Seconds(), set)
		}
	}, nil
}

// GuardPruned returns a function that adds deleted guard rows to the
// counter exactly.guard.pruned.
func GuardPruned(mp metric.MeterProvider, table string) (func(deleted int64), error) {
	c, err := mp.Meter(InstrumentationName).Int64Counter(MetricGuardPruned, metric.WithUnit("{row}"),
		metric.WithDescription("Guard rows deleted by retention pruning."))
	if err != nil {
		return nil, err
	}
	set := metric.WithAttributes(GuardTable.String(table))
	return func(deleted int64) {
		if deleted > 0 {
			c.Add(context.Background(), deleted, set)
		}
	}, nil
}
