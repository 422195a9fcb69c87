package consumer

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/outbox"
)

// Option configures a [Consumer].
type Option func(*Consumer)

// Handle routes records of topics to h, a *handler.Handler[T] or, for
// several record types on one topic, a *handler.Router. With no topics, h
// consumes the configuration's Topics. Each topic has exactly one handler
// (or router); [New] fails when a topic has two or none.
func Handle(h handler.Any, topics ...string) Option {
	return func(c *Consumer) { c.handles = append(c.handles, handle{handler: h, topics: topics}) }
}

// WithLogger sets the logger; the default (and what nil means) is
// slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *Consumer) {
		if l != nil {
			c.log = l
		}
	}
}

// WithTracerProvider sets where the consumer's spans go: one
// "<topic> process" span per record, continuing the trace of the record's
// traceparent header, with claim and handler child spans. The default is
// OpenTelemetry's global provider (a no-op unless the application set one).
// The consumer keeps no global state of its own.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *Consumer) { c.tp = tp }
}

// WithMeterProvider sets where the consumer's metrics go (records by handler
// and outcome, latencies, retries, dead letters, duplicate spikes, lag). The
// default is OpenTelemetry's global provider (a no-op unless the
// application set one).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *Consumer) { c.mp = mp }
}

// WithGuard sets the guard (the guard table); the default is the table
// named by the configuration's GuardTable.
func WithGuard(g *dedupe.Guard) Option { return func(c *Consumer) { c.guard = g } }

// WithKafkaOptions appends franz-go client options, for settings this
// package does not wrap (SASL, TLS, fetch sizes, a custom dialer). Options
// that conflict with how the consumer works (group, topics, commits,
// partition callbacks) are overridden.
func WithKafkaOptions(opts ...kgo.Opt) Option {
	return func(c *Consumer) { c.kopts = append(c.kopts, opts...) }
}

// WithDeadLetters makes records that cannot be decoded or keyed, and
// records whose handler failed MaxAttempts times, go to the dead-letter
// topic through fn, in the transaction that lets their offset advance.
// Without it such records hold their partition and are retried forever,
// with an error in the log. outbox.DeadLetters provides fn.
func WithDeadLetters(fn handler.DeadLetterFunc) Option {
	return func(c *Consumer) { c.deadLetter = fn }
}

// Hooks are optional callbacks into the consumer's life, for observability
// and for fault-injection tests. Each may be nil and must not block for long.
// Each receives a context and one struct, so that what a hook is told can
// grow without breaking it (pgx's tracer …Data structs are the model).
// BeforeDBCommit, AfterDBCommit, OnOutcome and OnRetry run on the partition's
// worker goroutine (workers of different partitions call them concurrently);
// OnRevoke runs inside franz-go's revoke callback; OnOffsetsCommitted runs
// wherever offsets are committed (the periodic committer, a revoke, the
// shutdown), possibly concurrently.
type Hooks struct {
	// BeforeDBCommit runs just before a batch's COMMIT: before the round
	// trip that sends the batch's queued writes with COMMIT (or, when a
	// pipelined handler checks a result, before the writes whose checks
	// precede COMMIT). It runs again when that round trip fails a record
	// and the batch is replayed.
	BeforeDBCommit func(ctx context.Context, d CommitData)
	// AfterDBCommit runs just after a batch's COMMIT, before its offsets are
	// marked.
	AfterDBCommit func(ctx context.Context, d CommitData)
	// OnOutcome runs once per committed record with its outcome.
	OnOutcome func(ctx context.Context, d OutcomeData)
	// OnRetry runs when a batch or record will be retried after an error.
	OnRetry func(ctx context.Context, d RetryData)
	// OnOffsetsCommitted runs after offsets were committed to Kafka.
	OnOffsetsCommitted func(ctx context.Context, d OffsetsCommittedData)
	// OnRevoke runs in the rebalance's revoke callback, after the revoked
	// partitions' in-flight transactions finished and before their offsets
	// are committed (crash-point tests die here).
	OnRevoke func(ctx context.Context, d RevokeData)
}

// CommitData is what BeforeDBCommit and AfterDBCommit are told: the batch's
// partition and the offsets of its first and last records.
type CommitData struct {
	Topic                   string
	Partition               int32
	FirstOffset, LastOffset int64
}

// OutcomeData is what OnOutcome is told about one committed record.
type OutcomeData struct {
	// Record is the record. Neither it nor its bytes may be kept past the
	// call (the consumer reuses both once it is done with the record): keep
	// a copy (handler.Record.Clone).
	Record *handler.Record
	// Handler is the name of the handler the record was for.
	Handler string
	// Key is the record's deduplication key ("" when none was derived).
	Key string
	// Outcome is how the record ended: dedupe.Applied, dedupe.Duplicate or
	// dedupe.DeadLettered.
	Outcome dedupe.Outcome
}

// RetryData is what OnRetry is told: the record whose batch will be
// retried, and why.
type RetryData struct {
	Topic     string
	Partition int32
	Offset    int64
	Err       error
}

// OffsetsCommittedData is what OnOffsetsCommitted is told: the committed
// next-offsets per topic and partition.
type OffsetsCommittedData struct {
	Offsets map[string]map[int32]int64
}

// RevokeData is what OnRevoke is told: the revoked partitions per topic.
type RevokeData struct {
	Revoked map[string][]int32
}

// WithHooks installs hooks.
func WithHooks(h Hooks) Option { return func(c *Consumer) { c.hooks = h } }

// WithOutbox sets the outbox a [Service] relays, dead-letters through and
// migrates; the default is outbox.New() (the default table). Handlers add
// messages to that outbox's table (through o, or any Outbox value of the
// same table, such as outbox.Add's default). A plain [Consumer] uses o only
// to wake the relays built from o in this process after each COMMIT of a
// batch that wrote to o's table.
func WithOutbox(o *outbox.Outbox) Option { return func(c *Consumer) { c.outbox = o } }

// WithMetricsHandler makes a [Service] serve h at
// http://Config.MetricsAddr/metrics; NewService fails with a
// [*ConfigError] when MetricsAddr is empty, and when MetricsAddr is set
// without this option (nothing would be served there). Pass otelexport's Exporter.MetricsHandler for Prometheus; the core
// links no Prometheus client. A plain [Consumer] ignores it.
func WithMetricsHandler(h http.Handler) Option { return func(c *Consumer) { c.metricsHandler = h } }
