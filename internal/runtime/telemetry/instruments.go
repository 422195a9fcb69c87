package telemetry

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
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
// counter exactly.guard.pruned. It adds 0 at once, so that the counter is
// exported from the start and a rate over it has a series before the first
// prune.
func GuardPruned(mp metric.MeterProvider, table string) (func(deleted int64), error) {
	c, err := mp.Meter(InstrumentationName).Int64Counter(MetricGuardPruned, metric.WithUnit("{row}"),
		metric.WithDescription("Guard rows deleted by retention pruning."))
	if err != nil {
		return nil, err
	}
	set := metric.WithAttributes(GuardTable.String(table))
	c.Add(context.Background(), 0, set)
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
	o                      metric.Observer
	lag                    metric.Int64ObservableGauge
	ratio                  metric.Float64ObservableGauge
	inFlight, held, paused metric.Int64ObservableGauge
	calls, callsWaiting    metric.Int64ObservableGauge
	group                  attribute.KeyValue
}

// Calls reports an owned partition's pre-transaction calls: running, and
// records waiting for a call slot.
func (c ConsumerObserver) Calls(topic string, partition int32, running, waiting int64) {
	attrs := metric.WithAttributes(
		MessagingDestinationName.String(topic),
		MessagingPartitionID.String(fmt.Sprint(partition)),
		c.group,
	)
	c.o.ObserveInt64(c.calls, running, attrs)
	c.o.ObserveInt64(c.callsWaiting, waiting, attrs)
}

// Partition reports an owned partition of topic: inFlight records fetched
// and not finished, held records not finished after a failed attempt, and
// whether fetching is paused.
func (c ConsumerObserver) Partition(topic string, partition int32, inFlight, held int64, paused bool) {
	attrs := metric.WithAttributes(
		MessagingDestinationName.String(topic),
		MessagingPartitionID.String(fmt.Sprint(partition)),
		c.group,
	)
	c.o.ObserveInt64(c.inFlight, inFlight, attrs)
	c.o.ObserveInt64(c.held, held, attrs)
	var p int64
	if paused {
		p = 1
	}
	c.o.ObserveInt64(c.paused, p, attrs)
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
// ({message}, per owned partition, with the consumer group),
// exactly.partition.in_flight, exactly.partition.held and
// exactly.partition.paused (per owned partition) and
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
	inFlight, err := m.Int64ObservableGauge(MetricPartitionInFlight, metric.WithUnit("{message}"),
		metric.WithDescription("Records of an owned partition fetched and not finished (committed or dead-lettered)."))
	if err != nil {
		return nil, err
	}
	held, err := m.Int64ObservableGauge(MetricPartitionHeld, metric.WithUnit("{message}"),
		metric.WithDescription("Records of an owned partition not finished after a failed attempt; each holds its keys."))
	if err != nil {
		return nil, err
	}
	paused, err := m.Int64ObservableGauge(MetricPartitionPaused,
		metric.WithDescription("1 while fetching is paused for an owned partition (in-flight share, or key concurrency's offset gap or held records), else 0."))
	if err != nil {
		return nil, err
	}
	calls, err := m.Int64ObservableGauge(MetricPartitionCalls, metric.WithUnit("{call}"),
		metric.WithDescription("Pre-transaction calls (handler.WithCall, handler.NewWithCall) of an owned partition running now."))
	if err != nil {
		return nil, err
	}
	callsWaiting, err := m.Int64ObservableGauge(MetricPartitionCallsWaiting, metric.WithUnit("{message}"),
		metric.WithDescription("Records of an owned partition whose pre-transaction call waits for a call slot (MaxCallsInFlight, or the partition's share of it)."))
	if err != nil {
		return nil, err
	}
	g := MessagingConsumerGroup.String(group)
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		observe(ConsumerObserver{o: o, lag: lag, ratio: ratio, inFlight: inFlight, held: held, paused: paused,
			calls: calls, callsWaiting: callsWaiting, group: g})
		return nil
	}, lag, ratio, inFlight, held, paused, calls, callsWaiting)
}

// CallInstruments records a consumer's pre-transaction calls (see
// [NewCallInstruments]).
type CallInstruments struct {
	duration metric.Float64Histogram
	skipped  metric.Int64Counter
	group    attribute.KeyValue
}

// NewCallInstruments creates the histogram exactly.call.duration (s, per
// handler and exactly.outcome "ok" or "error") and the counter
// exactly.calls.skipped (per handler) of the consumer of group. It fails
// only when an instrument cannot be created.
func NewCallInstruments(mp metric.MeterProvider, group string) (*CallInstruments, error) {
	m := mp.Meter(InstrumentationName)
	d, err := m.Float64Histogram(MetricCallDuration, metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
		metric.WithDescription("Duration of pre-transaction calls (handler.WithCall, handler.NewWithCall), by handler and outcome (ok or error; a call past Config.CallTimeout is an error)."))
	if err != nil {
		return nil, err
	}
	s, err := m.Int64Counter(MetricCallsSkipped, metric.WithUnit("{call}"),
		metric.WithDescription("Pre-transaction calls not made because the record's guard row existed (a duplicate), by handler."))
	if err != nil {
		return nil, err
	}
	return &CallInstruments{duration: d, skipped: s, group: MessagingConsumerGroup.String(group)}, nil
}

// Took records a call of handler that took d and failed when err is set.
func (c *CallInstruments) Took(handler string, d time.Duration, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	c.duration.Record(context.Background(), d.Seconds(), metric.WithAttributes(Handler.String(handler), Outcome.String(outcome), c.group))
}

// Skipped counts a call of handler not made: its record is a duplicate.
func (c *CallInstruments) Skipped(handler string) {
	c.skipped.Add(context.Background(), 1, metric.WithAttributes(Handler.String(handler), c.group))
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

// GuardAgeFunc reports the age of a guard table's oldest row (0 when the
// table is empty).
type GuardAgeFunc func(ctx context.Context) (time.Duration, error)

// ObserveGuard registers the observable gauges exactly.guard.oldest_age
// (seconds since the oldest guard row was written; 0 when none) and
// exactly.guard.retention (seconds rows are kept) for the guard named
// table, oldest read through oldest at every collection. The two together
// say whether the pruner keeps the table bounded: the oldest age settles
// near the retention when it does. It fails only when an instrument cannot
// be created. Unregister the returned registration to stop.
func ObserveGuard(mp metric.MeterProvider, table string, retention time.Duration, oldest GuardAgeFunc) (metric.Registration, error) {
	m := mp.Meter(InstrumentationName)
	age, err := m.Float64ObservableGauge(MetricGuardOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest guard row (0 when the table is empty); it settles near the retention while the pruner keeps up."))
	if err != nil {
		return nil, err
	}
	ret, err := m.Float64ObservableGauge(MetricGuardRetention, metric.WithUnit("s"),
		metric.WithDescription("How long guard rows are kept before the pruner deletes them."))
	if err != nil {
		return nil, err
	}
	set := metric.WithAttributes(GuardTable.String(table))
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		o.ObserveFloat64(ret, retention.Seconds(), set)
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		d, err := oldest(ctx)
		if err != nil {
			return err
		}
		o.ObserveFloat64(age, d.Seconds(), set)
		return nil
	}, age, ret)
}

// ObserveRelayActive registers the observable gauge exactly.relay.active
// for the outbox named table: 1 while active reports true (this process's
// relay holds the table's relay lease), else 0. It fails only when the
// instrument cannot be created. Unregister the returned registration to
// stop.
func ObserveRelayActive(mp metric.MeterProvider, table string, active func() bool) (metric.Registration, error) {
	m := mp.Meter(InstrumentationName)
	g, err := m.Int64ObservableGauge(MetricRelayActive,
		metric.WithDescription("1 while this process's relay holds the outbox table's relay lease (it is the one publishing), else 0."))
	if err != nil {
		return nil, err
	}
	set := metric.WithAttributes(OutboxTable.String(table))
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		var v int64
		if active() {
			v = 1
		}
		o.ObserveInt64(g, v, set)
		return nil
	}, g)
}

// module is the module path whose version BuildInfo reports.
const module = "github.com/exactly-go/exactly"

// BuildInfo returns the attributes of exactly.build_info from the running
// binary's build information: version (of the exactly module: the main
// module's when it is exactly itself, else the dependency's; "(devel)"
// for a build from a work tree, "unknown" without build information),
// revision (the binary's VCS revision, "unknown" when not stamped) and
// go_version.
func BuildInfo() []attribute.KeyValue {
	version, revision, goVersion := "unknown", "unknown", runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.GoVersion != "" {
			goVersion = bi.GoVersion
		}
		if bi.Main.Path == module && bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, d := range bi.Deps {
			if d.Path == module && d.Version != "" {
				version = d.Version
				if d.Replace != nil && d.Replace.Version != "" {
					version = d.Replace.Version
				}
			}
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				revision = s.Value
			}
		}
	}
	return []attribute.KeyValue{
		attribute.String("version", version),
		attribute.String("revision", revision),
		attribute.String("go_version", goVersion),
	}
}

// ObserveBuildInfo registers the observable gauge exactly.build_info,
// always 1, with the attributes of [BuildInfo]: which build of exactly a
// process runs (Prometheus: exactly_build_info{version,revision,go_version}).
// It fails only when the instrument cannot be created. Unregister the
// returned registration to stop.
func ObserveBuildInfo(mp metric.MeterProvider) (metric.Registration, error) {
	m := mp.Meter(InstrumentationName)
	g, err := m.Int64ObservableGauge(MetricBuildInfo,
		metric.WithDescription("Always 1; its attributes say which build of exactly the process runs (version, revision, go_version)."))
	if err != nil {
		return nil, err
	}
	set := metric.WithAttributes(BuildInfo()...)
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(g, 1, set)
		return nil
	}, g)
}

// FetchErrors creates the counter exactly.fetch_errors for the consumer of
// group and returns a function that counts one fetch error of topic, of
// kind (a Kafka error code's name, or "other"). It fails only when the
// instrument cannot be created.
func FetchErrors(mp metric.MeterProvider, group string) (func(ctx context.Context, topic, kind string), error) {
	c, err := mp.Meter(InstrumentationName).Int64Counter(MetricFetchErrors, metric.WithUnit("{error}"),
		metric.WithDescription("Fetch errors returned by the Kafka client, by topic and error type (a Kafka error code's name, or other); one per failing partition per fetch."))
	if err != nil {
		return nil, err
	}
	g := MessagingConsumerGroup.String(group)
	return func(ctx context.Context, topic, kind string) {
		c.Add(ctx, 1, metric.WithAttributes(MessagingDestinationName.String(topic), ErrorType.String(kind), g))
	}, nil
}

// CommittedObserver reports committed offsets during one collection (see
// [ObserveCommitted]).
type CommittedObserver struct {
	o     metric.Observer
	g     metric.Int64ObservableGauge
	group attribute.KeyValue
}

// Committed reports off, the offset last committed for partition of topic.
func (c CommittedObserver) Committed(topic string, partition int32, off int64) {
	c.o.ObserveInt64(c.g, off, metric.WithAttributes(
		MessagingDestinationName.String(topic),
		MessagingPartitionID.String(fmt.Sprint(partition)),
		c.group,
	))
}

// ObserveCommitted registers the observable gauge
// exactly.consumer.committed_offset of the consumer of group; observe
// reports it at every collection. Beside exactly.consumer.lag it tells a
// consumer that is behind from one that stands still. It fails only when
// the instrument cannot be created. Unregister the returned registration
// to stop.
func ObserveCommitted(mp metric.MeterProvider, group string, observe func(CommittedObserver)) (metric.Registration, error) {
	m := mp.Meter(InstrumentationName)
	g, err := m.Int64ObservableGauge(MetricConsumerCommitted,
		metric.WithDescription("Offset this member last committed to Kafka for an owned partition (offsets trail the database)."))
	if err != nil {
		return nil, err
	}
	ga := MessagingConsumerGroup.String(group)
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		observe(CommittedObserver{o: o, g: g, group: ga})
		return nil
	}, g)
}

// GroupLagObserver reports a consumer group's lag as the broker sees it
// during one collection (see [ObserveGroupLag]).
type GroupLagObserver struct {
	o                   metric.Observer
	lag, committed, mem metric.Int64ObservableGauge
	group               attribute.KeyValue
}

// Partition reports partition of topic: lag records between the group's
// committed offset (or the log start, when it committed none) and the end,
// and committed, the group's committed offset (-1 reports none).
func (g GroupLagObserver) Partition(topic string, partition int32, lag, committed int64) {
	attrs := metric.WithAttributes(
		MessagingDestinationName.String(topic),
		MessagingPartitionID.String(fmt.Sprint(partition)),
		g.group,
	)
	g.o.ObserveInt64(g.lag, lag, attrs)
	if committed >= 0 {
		g.o.ObserveInt64(g.committed, committed, attrs)
	}
}

// Members reports n, the group's members.
func (g GroupLagObserver) Members(n int64) {
	g.o.ObserveInt64(g.mem, n, metric.WithAttributes(g.group))
}

// ObserveGroupLag registers the observable gauges
// exactly.consumer.group_lag ({message}) and
// exactly.consumer.group_committed_offset, per partition of the group's
// topics whoever owns it, and exactly.consumer.group_members, all read
// from the broker; observe reports them at every collection. Every member
// of a group exports the same figures: aggregate them with max by the
// group, topic and partition. It fails only when an instrument cannot be
// created. Unregister the returned registration to stop.
func ObserveGroupLag(mp metric.MeterProvider, group string, observe func(GroupLagObserver)) (metric.Registration, error) {
	m := mp.Meter(InstrumentationName)
	lag, err := m.Int64ObservableGauge(MetricConsumerGroupLag, metric.WithUnit("{message}"),
		metric.WithDescription("Records of a partition of the group's topics past the group's committed offset, read from the broker; every member reports every partition."))
	if err != nil {
		return nil, err
	}
	committed, err := m.Int64ObservableGauge(MetricConsumerGroupCommitted,
		metric.WithDescription("The group's committed offset of a partition of its topics, read from the broker; every member reports every partition."))
	if err != nil {
		return nil, err
	}
	mem, err := m.Int64ObservableGauge(MetricConsumerGroupMembers, metric.WithUnit("{member}"),
		metric.WithDescription("Members of the consumer group, read from the broker."))
	if err != nil {
		return nil, err
	}
	ga := MessagingConsumerGroup.String(group)
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		observe(GroupLagObserver{o: o, lag: lag, committed: committed, mem: mem, group: ga})
		return nil
	}, lag, committed, mem)
}

// ObserveDatabaseUp registers the observable gauge exactly.database.up: at
// every collection, 1 when ping (bounded to 2s) succeeds, else 0. It fails
// only when the instrument cannot be created. Unregister the returned
// registration to stop.
func ObserveDatabaseUp(mp metric.MeterProvider, ping func(ctx context.Context) error) (metric.Registration, error) {
	m := mp.Meter(InstrumentationName)
	g, err := m.Int64ObservableGauge(MetricDatabaseUp,
		metric.WithDescription("1 when the service's database answered a ping (within 2s) at this collection, else 0."))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		var v int64
		if ping(ctx) == nil {
			v = 1
		}
		o.ObserveInt64(g, v)
		return nil
	}, g)
}
