package apply

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/redact"
	"github.com/exactly-go/exactly/internal/runtime/telemetry"
)

// Retry is the outcome, in spans, of a record that was not committed and
// will be processed again.
const Retry = "retry"

// Telemetry instruments an Executor with traces and metrics. Build it with
// NewTelemetry; a nil *Telemetry records nothing. One Telemetry may serve
// every executor of a handler (it is safe for concurrent use).
type Telemetry struct {
	tracer trace.Tracer
	group  string
	log    *slog.Logger
	spikes *telemetry.DuplicateRate
	// consumerKind is the process spans' kind option, boxed once.
	consumerKind trace.SpanStartOption
	// secrets are scrubbed from error texts recorded on spans.
	secrets []string

	records, retries, deadLetters, spikeCount metric.Int64Counter
	handlerDur, txDur                         metric.Float64Histogram

	// mu guards measures, the measurement options of each combination of
	// attributes seen: an attribute set is sorted and hashed once, not at
	// every measurement.
	mu       sync.RWMutex
	measures map[measure]measureOpts
}

// measure is one combination of a measurement's attributes.
type measure struct {
	kind    measureKind
	handler string
	// value is the outcome (records), the transaction status (txDur) or
	// the retry reason (retries).
	value string
	topic string
}

type measureKind uint8

const (
	measureHandlerDur measureKind = iota
	measureTxDur
	measureRecords
	measureDeadLetters
	measureRetries
	measureSpikes
)

// maxMeasures bounds the cache of measurement options; combinations past
// it get their options built at every measurement.
const maxMeasures = 4096

// attributes returns the attributes of m's measurements.
func (m measure) attributes() []attribute.KeyValue {
	h := telemetry.Handler.String(m.handler)
	switch m.kind {
	case measureTxDur:
		return []attribute.KeyValue{h, attribute.String("exactly.transaction.status", m.value)}
	case measureRecords:
		return []attribute.KeyValue{h, telemetry.Outcome.String(m.value), telemetry.MessagingDestinationName.String(m.topic)}
	case measureDeadLetters:
		return []attribute.KeyValue{h, telemetry.MessagingDestinationName.String(m.topic)}
	case measureRetries:
		return []attribute.KeyValue{h, telemetry.RetryReason.String(m.value)}
	default: // measureHandlerDur, measureSpikes
		return []attribute.KeyValue{h}
	}
}

// measureOpts are the options of one combination of attributes, for
// counters (add) and histograms (rec).
type measureOpts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

// opts returns the options that give a measurement m's attributes.
func (t *Telemetry) opts(m measure) measureOpts {
	t.mu.RLock()
	o, ok := t.measures[m]
	t.mu.RUnlock()
	if ok {
		return o
	}
	set := metric.WithAttributeSet(attribute.NewSet(m.attributes()...))
	o = measureOpts{add: []metric.AddOption{set}, rec: []metric.RecordOption{set}}
	t.mu.Lock()
	if t.measures == nil {
		t.measures = map[measure]measureOpts{}
	}
	if len(t.measures) < maxMeasures {
		t.measures[m] = o
	}
	t.mu.Unlock()
	return o
}

// NewTelemetry builds the telemetry of one handler's executors from tp and
// mp (its metric instruments come from telemetry.NewExecutorInstruments). group is the consumer group (an attribute of every span); spikes,
// when not nil, is fed every committed batch's outcomes, and log receives
// its warnings. It fails only when an instrument cannot be created.
func NewTelemetry(tp trace.TracerProvider, mp metric.MeterProvider, group string, spikes *telemetry.DuplicateRate, log *slog.Logger) (*Telemetry, error) {
	if log == nil {
		log = slog.Default()
	}
	t := &Telemetry{tracer: tp.Tracer(telemetry.InstrumentationName), group: group, log: log, spikes: spikes,
		consumerKind: trace.WithSpanKind(trace.SpanKindConsumer)}
	ins, err := telemetry.NewExecutorInstruments(mp)
	if err != nil {
		return nil, err
	}
	t.records, t.retries, t.deadLetters, t.spikeCount = ins.Records, ins.Retries, ins.DeadLetters, ins.DuplicateSpikes
	t.handlerDur, t.txDur = ins.HandlerDuration, ins.TxDuration
	return t, nil
}

// Scrub makes t replace each of secrets (a database password, SASL
// credentials) by a placeholder in error texts it records on spans.
func (t *Telemetry) Scrub(secrets ...string) {
	if t != nil {
		t.secrets = append(t.secrets, secrets...)
	}
}

// recordError records err on s, scrubbed of the configured secrets.
func (t *Telemetry) recordError(s trace.Span, err error) {
	if t == nil || !s.IsRecording() {
		return
	}
	s.RecordError(scrubbedError{msg: redact.Bound(redact.Scrub(err.Error(), t.secrets...)), err: err})
}

func (t *Telemetry) secretList() []string {
	if t == nil {
		return nil
	}
	return t.secrets
}

type scrubbedError struct {
	msg string
	err error
}

func (e scrubbedError) Error() string { return e.msg }

var noopTracer = tracenoop.NewTracerProvider().Tracer("")

func (t *Telemetry) tr() trace.Tracer {
	if t == nil {
		return noopTracer
	}
	return t.tracer
}

// batchTrace is the per-record spans of one Run.
type batchTrace struct {
	t     *Telemetry
	e     *Executor
	items []Item
	preps []prepared // per record: its handler and scope
	ctxs  []context.Context
	spans []trace.Span
	txAt  time.Time
	// sa holds the attributes of the batch's spans, taken from the
	// executor's spares when it starts one (a batch that is not traced
	// does not carry their 900 bytes) and handed back when the batch ends
	// (releaseAttrs).
	sa *spanAttrs
}

// spanAttrs are the attribute arrays of one batch's spans, reused by the
// executor's later batches.
type spanAttrs struct {
	// handleAttrs are the attributes of the next handle span, and
	// handleOpts the options that carry them (boxed once): a tracer copies
	// the attributes at Start, so one array serves every record.
	handleAttrs [2]attribute.KeyValue
	handleOpts  [1]trace.SpanStartOption
	// attrs and opts are the same for the process spans; boxed is the
	// slice of attrs that opts[1] carries.
	attrs [13]attribute.KeyValue
	opts  [2]trace.SpanStartOption
	boxed []attribute.KeyValue
}

// spanAttrs returns b's span attribute arrays, taking them from the
// executor's spares (or allocating them) at the first call.
func (b *batchTrace) spanAttrs() *spanAttrs {
	if b.sa == nil {
		b.sa, _ = b.e.attrs.Get().(*spanAttrs)
		if b.sa == nil {
			b.sa = &spanAttrs{}
			b.sa.handleOpts[0] = trace.WithAttributes(b.sa.handleAttrs[:]...)
		}
	}
	return b.sa
}

// releaseAttrs hands b's span attribute arrays back to the executor's
// spares once its spans have started (a tracer copies the attributes at
// Start, see startBatch), cleared so that they keep no string of the
// batch alive.
func (b *batchTrace) releaseAttrs() {
	if b.sa == nil {
		return
	}
	clear(b.sa.attrs[:]) // opts[1] and boxed keep pointing at the array
	b.sa.handleAttrs = [2]attribute.KeyValue{}
	b.e.attrs.Put(b.sa)
	b.sa = nil
}

// startBatch starts one "<topic> process" span per item, each continuing
// the trace of its record's traceparent header.
//
// A tracer copies the attributes it is given at Start (the SDK's
// NewSpanStartConfig appends them to its own slice), so one array holds
// every record's in turn, batch after batch (the executor keeps it between
// batches), and the option carrying it is boxed again only when the slice
// changes length; the span name is built once per topic.
func (e *Executor) startBatch(b *batchTrace, ctx context.Context, items []Item, preps []prepared) {
	b.t, b.e, b.items, b.preps = e.Telemetry, e, items, preps
	if cap(b.ctxs) < len(items) || cap(b.spans) < len(items) {
		b.ctxs, b.spans = make([]context.Context, len(items)), make([]trace.Span, len(items))
	}
	b.ctxs, b.spans = b.ctxs[:len(items)], b.spans[:len(items)]
	if e.Telemetry == nil {
		// No tracer: a record's context is its trace context, which the
		// no-op tracer would only wrap in a context of its own.
		for i := range items {
			b.ctxs[i] = propagation.TraceContext{}.Extract(ctx, headerCarrier{&items[i].Record})
			b.spans[i] = trace.SpanFromContext(b.ctxs[i])
		}
		return
	}
	sa := b.spanAttrs()
	tr := e.Telemetry.tr()
	group := ""
	kind := trace.WithSpanKind(trace.SpanKindConsumer)
	if e.Telemetry != nil {
		group, kind = e.Telemetry.group, e.Telemetry.consumerKind
	}
	attrs := sa.attrs[:0]
	sa.opts[0] = kind
	opts := sa.opts[:]
	passThrough := false // set after the first record: see isPassThrough
	var topic, name string
	for i := range items {
		rec := &items[i].Record
		pctx := propagation.TraceContext{}.Extract(ctx, headerCarrier{rec})
		if i > 0 && passThrough {
			b.ctxs[i], b.spans[i] = pctx, trace.SpanFromContext(pctx)
			continue
		}
		attrs = append(attrs[:0],
			telemetry.MessagingSystem.String("kafka"),
			telemetry.MessagingOperationType.String("process"),
			telemetry.MessagingOperationName.String("process"),
			telemetry.MessagingDestinationName.String(redact.Bound(rec.Topic)),
			telemetry.MessagingPartitionID.String(strconv.FormatInt(int64(rec.Partition), 10)),
			telemetry.MessagingKafkaOffset.Int64(rec.Offset),
			telemetry.MessagingBodySize.Int(len(rec.Value)),
			telemetry.Handler.String(preps[i].Handler),
			telemetry.Scope.String(preps[i].Scope),
			telemetry.Attempt.Int(items[i].Attempt),
		)
		if group != "" {
			attrs = append(attrs, telemetry.MessagingConsumerGroup.String(group))
		}
		if len(rec.Key) > 0 && utf8.Valid(rec.Key) {
			attrs = append(attrs, telemetry.MessagingKafkaKey.String(redact.Bound(string(rec.Key))))
		}
		if len(items) > 1 {
			attrs = append(attrs, telemetry.MessagingBatchCount.Int(len(items)))
		}
		if len(attrs) != len(sa.boxed) {
			opts[1], sa.boxed = trace.WithAttributes(attrs...), attrs
		}
		if name == "" || rec.Topic != topic {
			topic, name = rec.Topic, rec.Topic+" process"
		}
		b.ctxs[i], b.spans[i] = tr.Start(pctx, name, opts...)
		if i == 0 {
			passThrough = isPassThrough(pctx, b.spans[0])
		}
	}
}

// isPassThrough reports whether span, started in parent, is a span that a
// tracer starting no spans of its own returns: not recording, and carrying
// the parent's span context unchanged. The no-op tracer and the global
// tracer before an SDK is installed do that for every span; a tracing SDK
// never does, since even a span its sampler drops gets a new span ID. For
// such a tracer, startBatch starts the first record's span only, and gives
// every other record its trace context as is: the spans it would start
// would be the same, at three allocations a record.
func isPassThrough(parent context.Context, span trace.Span) bool {
	return !span.IsRecording() && span.SpanContext().Equal(trace.SpanContextFromContext(parent))
}

// recording reports whether any span is sampled.
func (b *batchTrace) recording() bool {
	for _, s := range b.spans {
		if s.IsRecording() {
			return true
		}
	}
	return false
}

// keyed records the deduplication key of item i.
func (b *batchTrace) keyed(i int, key string) {
	if key != "" && b.spans[i].IsRecording() {
		b.spans[i].SetAttributes(telemetry.Key.String(redact.Bound(key)))
	}
}

// claimed adds an "exactly.claim" child span, timed like the batch's one
// claim statement, to each record whose key was claimed.
func (b *batchTrace) claimed(start, end time.Time, idx []int, outs []dedupe.Outcome) {
	if !b.recording() {
		return
	}
	tr := b.t.tr()
	for j, i := range idx {
		_, s := tr.Start(b.ctxs[i], "exactly.claim", trace.WithTimestamp(start), trace.WithAttributes(
			telemetry.Scope.String(b.preps[i].Scope),
			attribute.String("exactly.claim.result", outs[j].String()),
			attribute.Int("exactly.claim.batch_size", len(idx)),
			attribute.String("db.system.name", "postgresql"),
			attribute.String("db.operation.name", "INSERT"),
		))
		s.End(trace.WithTimestamp(end))
	}
}

// handle runs the handler of item i in an "exactly.handle" child span
// whose context the handler gets: outbox.Add inside the handler stores that
// span's trace context, and its own spans become its children. When the
// record's span is not recording (not sampled, or no tracing SDK), no
// child span is started: the handler gets the record's context, whose
// trace context outbox.Add stores, and nothing is lost but the work.
func (b *batchTrace) handle(i int, p *prepared, run func(ctx context.Context) error) error {
	ctx, s := b.ctxs[i], b.spans[i]
	child := s.IsRecording()
	if child {
		sa := b.spanAttrs()
		sa.handleAttrs = [2]attribute.KeyValue{telemetry.Handler.String(p.Handler), telemetry.Attempt.Int(b.items[i].Attempt)}
		ctx, s = b.t.tr().Start(ctx, "exactly.handle", sa.handleOpts[:]...)
	}
	timed := b.t != nil && b.t.handlerDur.Enabled(ctx)
	var start time.Time
	if timed {
		start = time.Now()
	}
	err := run(ctx)
	if timed {
		b.t.handlerDur.Record(context.Background(), time.Since(start).Seconds(),
			b.t.opts(measure{kind: measureHandlerDur, handler: p.Handler}).rec...)
	}
	if err != nil && child {
		b.t.recordError(s, err)
		s.SetStatus(codes.Error, "handler failed")
	}
	if child {
		s.End()
	}
	return err
}

// txDone records the transaction's duration.
func (b *batchTrace) txDone(committed bool) {
	ctx := context.Background()
	if b.t == nil || b.txAt.IsZero() || !b.t.txDur.Enabled(ctx) {
		return
	}
	status := "rolled_back"
	if committed {
		status = "committed"
	}
	b.t.txDur.Record(ctx, time.Since(b.txAt).Seconds(),
		b.t.opts(measure{kind: measureTxDur, handler: b.e.Handler.Name(), value: status}).rec...)
}

// CountUnavailable counts one record retried for a transient reason, as
// a failed batch's are (see batchTrace.end): one that the key-concurrent
// dispatcher could not admit because its codec's service is down
// (handler.UnavailableError), so that no Run counted it.
func (e *Executor) CountUnavailable(ctx context.Context, err error) {
	t := e.Telemetry
	if t == nil || !t.retries.Enabled(ctx) {
		return
	}
	t.retries.Add(ctx, 1, t.opts(measure{kind: measureRetries, handler: e.Handler.Name(), value: retryUnavailable}).add...)
}

// The reasons of exactly_retries_total besides handler_error: a batch
// retried because the database or the broker failed (transient), because
// its transaction met another in a deadlock or a serialization failure
// (contention: the database works), or because a codec's service was down
// (unavailable: a schema registry, say). An alert on the database reads
// transient alone.
const (
	retryTransient   = "transient"
	retryContention  = "contention"
	retryUnavailable = "unavailable"
)

// retryReason is the reason a batch that failed with err is retried for.
func retryReason(err error) string {
	switch {
	case IsContention(err):
		return retryContention
	case handler.IsUnavailable(err):
		return retryUnavailable
	}
	return retryTransient
}

// end ends every span with its outcome and records the metrics, after Run
// decided results, herr and err.
func (b *batchTrace) end(ctx context.Context, results []Result, herr *HandlerError, err error) {
	name := b.e.Handler.Name()
	if err != nil {
		reason := retryReason(err)
		for _, s := range b.spans {
			if s.IsRecording() {
				s.SetAttributes(telemetry.Outcome.String(Retry), telemetry.RetryReason.String(reason))
				b.t.recordError(s, err)
				s.SetStatus(codes.Error, "transaction failed; the batch will be retried")
			}
			s.End()
		}
		if b.t != nil && b.t.retries.Enabled(ctx) {
			b.t.retries.Add(ctx, int64(len(b.items)), b.t.opts(measure{kind: measureRetries, handler: name, value: reason}).add...)
		}
		return
	}
	var dups []int
	var nDup int
	for i, res := range results {
		s := b.spans[i]
		recording := s.IsRecording()
		if recording {
			s.SetAttributes(telemetry.Outcome.String(string(res.Outcome)))
		}
		switch res.Outcome {
		case dedupe.Duplicate:
			nDup++
			if recording {
				dups = append(dups, i)
			}
		case dedupe.DeadLettered:
			if recording {
				if res.Reason != nil {
					b.t.recordError(s, res.Reason)
				}
				s.SetStatus(codes.Error, "dead-lettered")
			}
		}
		if res.Outcome == dedupe.DeadLettered && b.t != nil && b.t.deadLetters.Enabled(ctx) {
			b.t.deadLetters.Add(ctx, 1, b.t.opts(measure{kind: measureDeadLetters, handler: b.preps[i].Handler, topic: b.items[i].Record.Topic}).add...)
		}
	}
	if b.t != nil && b.t.records.Enabled(ctx) {
		b.countRecords(ctx, results)
	}
	if len(dups) > 0 {
		b.duplicateEvents(ctx, results, dups)
	}
	if b.t != nil && b.t.spikes != nil && len(results) > 0 {
		ratio, n, spike := b.t.spikes.Observe(len(results), nDup)
		if spike {
			last := b.items[len(results)-1].Record
			b.t.spikeCount.Add(ctx, 1, b.t.opts(measure{kind: measureSpikes, handler: name}).add...)
			b.spans[len(results)-1].AddEvent(telemetry.EventDuplicateSpike, trace.WithAttributes(
				telemetry.DuplicateRatio.Float64(ratio), telemetry.DuplicateWindow.Float64(b.t.spikes.Window().Seconds()),
				attribute.Int64("exactly.duplicate.window_records", n)))
			b.t.log.Warn("duplicate rate spike: most deliveries are duplicates, a sign of mass redelivery "+
				"(crashed or restarted consumers, rebalance storm, offsets not committed, a producer retrying in a loop); nothing was applied twice",
				"handler", name, "ratio", ratio, "threshold", b.t.spikes.Threshold(), "window", b.t.spikes.Window(),
				"records_in_window", n, "topic", last.Topic, "partition", last.Partition, "offset", last.Offset)
		}
	}
	if herr != nil {
		for i := len(results); i < len(b.spans); i++ {
			s := b.spans[i]
			if !s.IsRecording() {
				continue
			}
			s.SetAttributes(telemetry.Outcome.String(Retry))
			if i == herr.Index {
				s.SetAttributes(telemetry.RetryReason.String("handler_error"))
				b.t.recordError(s, herr.Err)
				s.SetStatus(codes.Error, "handler failed; the record will be retried")
			} else {
				s.SetAttributes(telemetry.RetryReason.String("after_failure"))
			}
		}
		if b.t != nil && b.t.retries.Enabled(ctx) {
			b.t.retries.Add(ctx, 1, b.t.opts(measure{kind: measureRetries, handler: name, value: "handler_error"}).add...)
		}
	}
	for _, s := range b.spans {
		s.End()
	}
}

// countRecords adds the committed records to the records counter: one
// addition per run of consecutive records with the same handler, outcome
// and topic.
func (b *batchTrace) countRecords(ctx context.Context, results []Result) {
	var run measure
	var n int64
	for i, res := range results {
		m := measure{kind: measureRecords, handler: b.preps[i].Handler, value: string(res.Outcome), topic: b.items[i].Record.Topic}
		if n > 0 && m != run {
			b.t.records.Add(ctx, n, b.t.opts(run).add...)
			n = 0
		}
		run = m
		n++
	}
	if n > 0 {
		b.t.records.Add(ctx, n, b.t.opts(run).add...)
	}
}

// duplicateEvents adds an "exactly.duplicate" event to the spans of the
// duplicates at idx, saying when the processing they matched happened, read
// in one query for the whole batch after the commit.
func (b *batchTrace) duplicateEvents(ctx context.Context, results []Result, idx []int) {
	keys := make([]string, 0, len(idx))
	for _, i := range idx {
		keys = append(keys, results[i].Key)
	}
	var when []time.Time // aligned with keys; zero: no row
	var lookupErr error
	if b.e.Pool != nil {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		when, lookupErr = b.e.Guard.LookupKeys(lctx, b.e.Pool, b.e.Handler.Scope(), keys)
		cancel()
	}
	now := time.Now()
	for j, i := range idx {
		attrs := []attribute.KeyValue{telemetry.Key.String(redact.Bound(results[i].Key)), telemetry.Scope.String(b.e.Handler.Scope())}
		if j < len(when) && !when[j].IsZero() {
			at := when[j]
			attrs = append(attrs, telemetry.DuplicateOfFound.Bool(true),
				telemetry.DuplicateOfProcessedAt.String(at.UTC().Format(time.RFC3339Nano)),
				telemetry.DuplicateOfAge.Float64(now.Sub(at).Seconds()))
		} else {
			attrs = append(attrs, telemetry.DuplicateOfFound.Bool(false))
			if lookupErr != nil {
				attrs = append(attrs, attribute.String("exactly.duplicate.lookup_error", redact.Bound(redact.Scrub(lookupErr.Error(), b.t.secretList()...))))
			}
		}
		b.spans[i].AddEvent(telemetry.EventDuplicate, trace.WithAttributes(attrs...))
	}
}

// headerCarrier reads a record's headers for trace context extraction.
type headerCarrier struct{ rec *handler.Record }

func (c headerCarrier) Get(key string) string {
	v, _ := c.rec.Header(key)
	return string(v)
}

func (c headerCarrier) Set(string, string) {}

func (c headerCarrier) Keys() []string {
	keys := make([]string, len(c.rec.Headers))
	for i, h := range c.rec.Headers {
		keys[i] = h.Key
	}
	return keys
}

// CallRetried counts a failed attempt of a record's pre-transaction call,
// which the record retries, in exactly.retries (reason "handler_error":
// it counts towards the attempts, as a handler's failure does). t may be
// nil.
func (t *Telemetry) CallRetried(ctx context.Context, handler string) {
	if t != nil && t.retries.Enabled(ctx) {
		t.retries.Add(ctx, 1, t.opts(measure{kind: measureRetries, handler: handler, value: "handler_error"}).add...)
	}
}
