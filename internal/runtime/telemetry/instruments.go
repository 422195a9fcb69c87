package telemetry

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Every metric instrument exactly creates is created in this file, from the
// names in names.go: a new metric gets its name there and its instrument
// here, next to the others.

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
// exactly.relay.commit_to_ack (seconds).
func RelayPublished(mp metric.MeterProvider, table string) (func(n int, commitToAck []time.Duration), error) {
	h, err := mp.Meter(InstrumentationName).Float64Histogram(MetricRelayCommitToAck, metric.WithUnit("s"),
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

// ExecutorInstruments are the instruments of one handler's executors
// (internal/runtime/apply records into them; their attributes are its
// choice).
type ExecutorInstruments struct {
	// Records counts committed records: exactly.records.
	Records metric.Int64Counter
	// Retries counts records that will be processed again: exactly.retries.
	Retries metric.Int64Counter
	// DeadLetters counts dead-lettered records: exactly.dead_letters.
	DeadLetters metric.Int64Counter
	// DuplicateSpikes counts duplicate spikes: exactly.duplicate_spikes.
	DuplicateSpikes metric.Int64Counter
	// HandlerDuration is exactly.handler.duration (seconds).
	HandlerDuration metric.Float64Histogram
	// TxDuration is exactly.transaction.duration (seconds).
	TxDuration metric.Float64Histogram
}

// NewExecutorInstruments creates the executor's instruments from mp. It
// fails only when an instrument cannot be created.
func NewExecutorInstruments(mp metric.MeterProvider) (ExecutorInstruments, error) {
	m := mp.Meter(InstrumentationName)
	var t ExecutorInstruments
	var err error
	if t.Records, err = m.Int64Counter(MetricRecords, metric.WithUnit("{record}"),
		metric.WithDescription("Records committed, by handler and outcome (applied, duplicate, dead_lettered).")); err != nil {
		return t, err
	}
	if t.Retries, err = m.Int64Counter(MetricRetries, metric.WithUnit("{record}"),
		metric.WithDescription("Records that will be processed again, by reason: handler_error (counts towards the attempts) or transient (an outage; every record of the batch).")); err != nil {
		return t, err
	}
	if t.DeadLetters, err = m.Int64Counter(MetricDeadLetters, metric.WithUnit("{record}"),
		metric.WithDescription("Records sent to the dead-letter topic.")); err != nil {
		return t, err
	}
	if t.DuplicateSpikes, err = m.Int64Counter(MetricDuplicateSpikes, metric.WithUnit("{spike}"),
		metric.WithDescription("Times a handler's duplicate ratio over the sliding window rose above the threshold (mass redelivery).")); err != nil {
		return t, err
	}
	buckets := metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
	if t.HandlerDuration, err = m.Float64Histogram(MetricHandlerDuration, metric.WithUnit("s"), buckets,
		metric.WithDescription("Time one handler call took, inside its transaction.")); err != nil {
		return t, err
	}
	if t.TxDuration, err = m.Float64Histogram(MetricTxDuration, metric.WithUnit("s"), buckets,
		metric.WithDescription("Time from BEGIN to the end of COMMIT (or rollback) of one batch's transaction.")); err != nil {
		return t, err
	}
	return t, nil
}

// ConsumerObserver reports a consumer's gauges during one collection (see
// [ObserveConsumer]).
type ConsumerObserver struct {
	o     metric.Observer
	lag   metric.Int64ObservableGauge
	ratio metric.Float64ObservableGauge
	group attribute.KeyValue
}

// Lag reports n records of partition of topic not yet processed.
func (c ConsumerObserver) Lag(topic string, partition int32, n int64) {
	c.o.ObserveInt64(c.lag, n, metric.WithAttributes(
		MessagingDestinationName.String(topic),
		MessagingPartitionID.String(fmt.Sprint(partition)),
		c.group,
	))
}

// DuplicateRatio reports handler's share of duplicates over its window.
func (c ConsumerObserver) DuplicateRatio(handler string, ratio float64) {
	c.o.ObserveFloat64(c.ratio, ratio, metric.WithAttributes(Handler.String(handler)))
}

// ObserveConsumer registers the observable gauges exactly.consumer.lag
// ({message}, per owned partition, with the consumer group) and
// exactly.duplicate.ratio (per handler) of the consumer of group; observe
// reports them at every collection. Unregister the returned registration
// to stop. It fails only when an instrument cannot be created.
func ObserveConsumer(mp metric.MeterProvider, group string, observe func(ConsumerObserver)) (metric.Registration, error) {
	m := mp.Meter(InstrumentationName)
	lag, err := m.Int64ObservableGauge(MetricConsumerLag, metric.WithUnit("{message}"),
		metric.WithDescription("Records of an owned partition not yet processed: high watermark minus the next offset to process."))
	if err != nil {
		return nil, err
	}
	ratio, err := m.Float64ObservableGauge(MetricDuplicateRatio, metric.WithUnit("1"),
		metric.WithDescription("Share of duplicates among a handler's records over the duplicate window (Config.DuplicateWindow)."))
	if err != nil {
		return nil, err
	}
	g := MessagingConsumerGroup.String(group)
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		observe(ConsumerObserver{o: o, lag: lag, ratio: ratio, group: g})
		return nil
	}, lag, ratio)
}

// ObserveParked registers the observable gauge exactly.outbox.parked
// (rows) for the outbox named table, read through count at every
// collection. Unregister the returned registration to stop. It fails only
// when the instrument cannot be created.
func ObserveParked(mp metric.MeterProvider, table string, count func(ctx context.Context) (int64, error)) (metric.Registration, error) {
	m := mp.Meter(InstrumentationName)
	g, err := m.Int64ObservableGauge(MetricOutboxParked, metric.WithUnit("{row}"),
		metric.WithDescription("Outbox rows the relay parked because they can never be published as they are; each holds the later rows of its (topic, key)."))
	if err != nil {
		return nil, err
	}
	set := metric.WithAttributes(OutboxTable.String(table))
	return m.RegisterCallback(func(ctx context.Context, obs metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		n, err := count(ctx)
		if err != nil {
			return err
		}
		obs.ObserveInt64(g, n, set)
		return nil
	}, g)
}
