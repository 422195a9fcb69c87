package telemetry

import "go.opentelemetry.io/otel/attribute"

// InstrumentationName is the instrumentation scope of exactly's tracers and
// meters.
const InstrumentationName = "github.com/exactly-go/exactly"

// Attribute keys: the OpenTelemetry messaging semantic conventions (Kafka)
// and exactly's own.
const (
	MessagingSystem          = attribute.Key("messaging.system")
	MessagingOperationType   = attribute.Key("messaging.operation.type")
	MessagingOperationName   = attribute.Key("messaging.operation.name")
	MessagingDestinationName = attribute.Key("messaging.destination.name")
	MessagingPartitionID     = attribute.Key("messaging.destination.partition.id")
	MessagingKafkaOffset     = attribute.Key("messaging.kafka.offset")
	MessagingConsumerGroup   = attribute.Key("messaging.consumer.group.name")
	MessagingKafkaKey        = attribute.Key("messaging.kafka.message.key")
	MessagingBodySize        = attribute.Key("messaging.message.body.size")
	MessagingBatchCount      = attribute.Key("messaging.batch.message_count")

	// Outcome is how the record ended: applied, duplicate, dead_lettered,
	// or retry (not committed; it will be processed again).
	Outcome = attribute.Key("exactly.outcome")
	// Key is the record's deduplication key.
	Key = attribute.Key("exactly.key")
	// Scope is the namespace of Key in the guard table.
	Scope = attribute.Key("exactly.scope")
	// Handler is the handler's name.
	Handler = attribute.Key("exactly.handler")
	// Attempt counts deliveries of the record to the handler, from 1.
	Attempt = attribute.Key("exactly.attempt")
	// RetryReason says why a record will be retried: "handler_error",
	// "transient" (the database or the broker failed), "contention" (a
	// deadlock or serialization failure), "unavailable" (a codec's service
	// is down), or "after_failure" for a record behind a failed one in its
	// batch.
	RetryReason = attribute.Key("exactly.retry.reason")
	// DuplicateOf* describe the earlier processing a duplicate matched.
	DuplicateOfProcessedAt = attribute.Key("exactly.duplicate.original_processed_at")
	DuplicateOfAge         = attribute.Key("exactly.duplicate.original_age_seconds")
	DuplicateOfFound       = attribute.Key("exactly.duplicate.original_found")
	// DuplicateRatio and DuplicateWindow describe a duplicate spike.
	DuplicateRatio  = attribute.Key("exactly.duplicate.ratio")
	DuplicateWindow = attribute.Key("exactly.duplicate.window_seconds")
	// ErrorType classifies an error with a bounded set of values: the
	// Kafka error code's name (UNKNOWN_TOPIC_ID), or "other".
	ErrorType = attribute.Key("error.type")
	// OutboxTopic is the topic an outbox message is addressed to.
	OutboxTopic = attribute.Key("exactly.outbox.topic")
)

// Span event names.
const (
	// EventDuplicate is added to the process span of a duplicate.
	EventDuplicate = "exactly.duplicate"
	// EventDuplicateSpike is added to the process span of the record whose
	// batch pushed its handler's duplicate ratio over the threshold.
	EventDuplicateSpike = "exactly.duplicate_spike"
)

// Instrument names (OpenTelemetry; the Prometheus exporter turns dots into
// underscores and adds _total to counters and the unit to others).
const (
	MetricRecords          = "exactly.records"
	MetricRetries          = "exactly.retries"
	MetricDeadLetters      = "exactly.dead_letters"
	MetricHandlerDuration  = "exactly.handler.duration"
	MetricTxDuration       = "exactly.transaction.duration"
	MetricDuplicateSpikes  = "exactly.duplicate_spikes"
	MetricDuplicateRatio   = "exactly.duplicate.ratio"
	MetricConsumerLag      = "exactly.consumer.lag"
	MetricOutboxBacklog    = "exactly.outbox.backlog"
	MetricOutboxOldestAge  = "exactly.outbox.oldest_age"
	MetricOutboxParked     = "exactly.outbox.parked" // outbox.MetricOutboxParked
	MetricRelayCommitToAck = "exactly.relay.commit_to_ack"
	MetricGuardPruned      = "exactly.guard.pruned"
	MetricGuardOldestAge   = "exactly.guard.oldest_age"
	MetricGuardRetention   = "exactly.guard.retention"
	MetricRelayActive      = "exactly.relay.active"
	MetricBuildInfo        = "exactly.build_info"
	MetricFetchErrors      = "exactly.fetch_errors"
	// Per owned partition: records fetched and not finished, records
	// held (not finished after a failed attempt: each holds its keys), and
	// 1 while fetching is paused (in-flight share or key-concurrency
	// bounds), else 0.
	MetricPartitionInFlight = "exactly.partition.in_flight"
	MetricPartitionHeld     = "exactly.partition.held"
	MetricPartitionPaused   = "exactly.partition.paused"
	// Per owned partition: its pre-transaction calls running, and its
	// records whose call waits for a call slot (the instance's
	// MaxCallsInFlight, or the partition's share of it).
	MetricPartitionCalls        = "exactly.partition.calls"
	MetricPartitionCallsWaiting = "exactly.partition.calls_waiting"
	// Per handler: the duration of pre-transaction calls (seconds, with
	// exactly.outcome "ok" or "error"), and the calls not made because
	// the record's guard row existed (a duplicate).
	MetricCallDuration = "exactly.call.duration"
	MetricCallsSkipped = "exactly.calls.skipped"
)

// Attribute keys of the outbox and guard instruments.
const (
	OutboxTable = attribute.Key("exactly.outbox.table")
	GuardTable  = attribute.Key("exactly.guard.table")
)

// MetricConsumerCommitted is the offset last committed per owned partition
// (Prometheus: exactly_consumer_committed_offset).
const MetricConsumerCommitted = "exactly.consumer.committed_offset"

// The group's lag as the broker sees it, per partition of the group's
// topics whoever owns it, and its members (Prometheus:
// exactly_consumer_group_lag, exactly_consumer_group_committed_offset,
// exactly_consumer_group_members).
const (
	MetricConsumerGroupLag       = "exactly.consumer.group_lag"
	MetricConsumerGroupCommitted = "exactly.consumer.group_committed_offset"
	MetricConsumerGroupMembers   = "exactly.consumer.group_members"
)

// MetricDatabaseUp is 1 when the service's database answers, else 0
// (Prometheus: exactly_database_up).
const MetricDatabaseUp = "exactly.database.up"
