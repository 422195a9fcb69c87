package outbox

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactly-go/exactly/internal/runtime/redact"
)

// tracerName is the instrumentation scope of the outbox's spans.
const tracerName = "github.com/exactly-go/exactly/outbox"

// addSpan starts an "exactly.outbox.add" span, child of the span in ctx,
// from that span's own tracer provider: no global state, and nothing at all
// when ctx carries no span (ok false: ctx and the no-op span are returned,
// and there is no trace context to store). Add stores the trace context of
// the returned ctx in the row.
func addSpan(ctx context.Context, topic string) (_ context.Context, _ trace.Span, ok bool) {
	parent := trace.SpanFromContext(ctx)
	if !parent.SpanContext().IsValid() {
		return ctx, parent, false
	}
	actx, span := parent.TracerProvider().Tracer(tracerName).Start(ctx, "exactly.outbox.add",
		trace.WithAttributes(attribute.String("exactly.outbox.topic", redact.Bound(topic))))
	return actx, span, true
}

// withTraceContexts sets each record's Context to ctx carrying the trace
// context stored in its traceparent header, so that a tracing hook on the
// relay's client (franz-go's kotel, see RelayConfig.KafkaOptions) starts the
// publish span as a child of the trace that wrote the row, and writes that
// span's traceparent into the record: one trace from the command through
// the handler to the consumers of what it emitted.
func withTraceContexts(ctx context.Context, recs []*kgo.Record) {
	for _, r := range recs {
		r.Context = propagation.TraceContext{}.Extract(ctx, recordCarrier{r})
	}
}

type recordCarrier struct{ r *kgo.Record }

func (c recordCarrier) Get(key string) string {
	for i := len(c.r.Headers) - 1; i >= 0; i-- {
		if c.r.Headers[i].Key == key {
			return string(c.r.Headers[i].Value)
		}
	}
	return ""
}

func (c recordCarrier) Set(string, string) {}

func (c recordCarrier) Keys() []string {
	keys := make([]string, len(c.r.Headers))
	for i, h := range c.r.Headers {
		keys[i] = h.Key
	}
	return keys
}
