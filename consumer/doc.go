// Package consumer is the exactly consumer-group member: it runs typed
// handlers over Kafka records so that each record's effect happens once.
//
// # One entry point
//
// [NewService] and [Service.Run] run what a service needs from one
// [Config]: the consumer, the outbox relay (with the consumer's SASL and TLS
// settings), the guard pruner and, optionally, a metrics endpoint. Run
// checks the guard and outbox tables' schema first and fails at once when
// one is missing or behind ([Service.Migrate] creates them); on shutdown it
// stops fetching, finishes in-flight work, commits offsets, lets the relay
// flush, and closes. [New] builds the consumer alone; its [Consumer.Run]
// checks the guard table the same way, with the same [*SchemaError], before
// it joins the group.
//
// # The path of a record
//
// One worker per assigned partition takes that partition's records in
// offset order; partitions work in parallel. A worker takes what is already
// fetched, up to Config.BatchMaxRecords, and runs it in one PostgreSQL
// transaction: it decodes and keys each record (handler.KeySource), takes
// the batch's declared lock keys (handler.WithLockKeys) in one sorted
// statement and claims its guard rows in another, sent in the same round
// trip as BEGIN, runs the handler of every record whose key it claimed,
// then sends the queued writes, the batch's outbox rows and one row of
// outcome counts together, and commits. After COMMIT it wakes the outbox
// relay (in-process, or by a notification sent outside the transaction);
// the batch's transaction never notifies and its outbox rows take no key
// locks. A
// record whose key was taken already is a duplicate: its handler does not
// run. Batches form from what is fetched, so light traffic gives small
// batches (latency) and a backlog large ones (throughput).
//
// # Key concurrency
//
// With Config.KeyConcurrency above 1 (the default), the worker is a
// dispatcher: records of one key (Kafka key, dedupe key, declared lock
// keys) run one at a time in offset order, records of other keys go on
// while one retries, and the pre-transaction calls of handlers built with
// handler.NewWithCall or handler.WithCall run concurrently
// (Config.KeyConcurrency per partition, a partition's share of
// Config.MaxCallsInFlight per instance), outside any transaction, each
// bounded by Config.CallTimeout; revoke and shutdown wait for them at most
// that long (and at most 5 s) before abandoning them. Ready
// records still share one transaction at a time per partition, so the
// pool stays at one connection per partition. The offset marked is the
// lowest unfinished one; past Config.MaxOffsetGap offsets ahead of it, or
// KeyConcurrency records held, the partition pauses fetching (logged, and
// the exactly.partition.paused gauge). KeyConcurrency 1 applies a
// partition's records strictly in offset order.
//
// # Offsets trail the database
//
// A record's offset is marked only after its transaction committed. Marks
// are committed to Kafka every Config.CommitInterval, on revoke (after the
// revoked partitions' in-flight transactions finished) and at shutdown.
// Lost partitions commit nothing, and marks of partitions this member no
// longer owns are dropped. A crash between the database commit and the offset
// commit redelivers records whose guard rows exist: they are duplicates.
//
// # Failures
//
// A handler error rolls back that record alone; the records before it in
// the batch commit. The record is retried with exponential backoff
// (Config.RetryBackoff up to Config.RetryBackoffMax) and, after
// Config.MaxAttempts, sent to the dead-letter topic through the outbox in
// the transaction that lets its offset advance (WithDeadLetters). Records
// that cannot be decoded or keyed go there at once, and so does a record
// whose handler returned handler.Permanent. A dead-lettered record keeps a
// dead_lettered mark in the guard table, so its redelivery reports a
// duplicate and writes no second dead letter. Without dead letters, a
// failing record holds its key (its partition with Config.KeyConcurrency
// 1) and is never skipped. Database outages
// (lost connections, serialization failures, deadlocks, a restarting
// server) are retried until the database is back and never count as
// attempts. A handler that returns nil but left its transaction aborted (it
// swallowed a database error) fails its own record (handler.AbortedTxError),
// as does one that overruns the batch deadline; neither is taken for an
// outage. A panicking handler is recovered and counts as a failure. One bad
// record, row or handler holds only its own key, visibly.
//
// # Bounds
//
// Fetched but unfinished records are bounded by Config.MaxInFlightRecords
// and Config.MaxInFlightBytes: past either, fetching pauses until workers
// catch up. Kafka fetches whole record batches, so the records held can
// exceed the bound by one producer batch per owned partition; memory
// follows the batch size, not the backlog. Fetches wait at most 100ms at the broker for records
// (kgo.FetchMaxWait, franz-go's default is 5s), so a partition resumed
// while the others are idle is fetched again within 100ms; an idle member
// sends about ten empty fetches a second per broker.
// WithKafkaOptions(kgo.FetchMaxWait(d)) sets another wait.
//
// # Configuration
//
// A zero Config field means its documented default, so a literal with
// Brokers and Group is complete; Config.Validate names the fields at
// fault (a [*ConfigError]). ConfigFromEnv fills the same struct from the
// environment (go-envconfig) and names the variables instead. Kafka SASL
// and TLS are configured there too (Config.KafkaOptions).
//
// # Telemetry
//
// The package uses only the OpenTelemetry API (WithTracerProvider,
// WithMeterProvider). Exporters (OTLP over gRPC, Prometheus) are set up by
// package consumer/otelexport, which the core does not import.
package consumer
