package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/consumer/otelexport"
	"github.com/exactly-go/exactly/internal/runtime/telemetry"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/internal/testenv/otlptest"
)

// Traces and metrics reach an OTLP/gRPC receiver over the real wire
// protocol, configured only by the standard OTEL_* variables.
func TestOTLPExportReachesReceiver(t *testing.T) {
	recv := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.Endpoint)
	t.Setenv("OTEL_SERVICE_NAME", "credit-test")
	tel, err := otelexport.Setup(context.Background(), otelexport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if tel.TracesEndpoint == "" || tel.MetricsEndpoint == "" {
		t.Fatalf("OTLP not enabled: %s", tel.Describe())
	}

	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "credits")
	brokers := testenv.Brokers(kc)
	produceCopies(t, brokers, "credits", 3, 2, 1)
	o := newOutcomes()
	stop := startConsumer(t, testConfig(brokers, "g", "credits"), pool, consumer.Handle(creditHandler(0)),
		consumer.WithHooks(o.hooks()), consumer.WithTracerProvider(tel.TracerProvider), consumer.WithMeterProvider(tel.MeterProvider))
	o.await(t, 30*time.Second, "every delivery", func() bool { return o.total() >= 6 })
	stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tel.Shutdown(ctx); err != nil { // flushes both exporters
		t.Fatal(err)
	}

	if !recv.Service("credit-test") {
		t.Errorf("service.name from OTEL_SERVICE_NAME not exported")
	}
	procs := recv.Spans("credits process")
	if len(procs) != 6 {
		t.Fatalf("received %d 'credits process' spans, want 6; names: %v", len(procs), recv.SpanNames())
	}
	byOutcome := map[string]int{}
	for _, a := range procs {
		byOutcome[a["exactly.outcome"]]++
		if a["messaging.system"] != "kafka" || a["exactly.handler"] != "credit" {
			t.Errorf("span attributes %v", a)
		}
	}
	if byOutcome["applied"] != 3 || byOutcome["duplicate"] != 3 {
		t.Errorf("outcomes %v, want 3 applied and 3 duplicate", byOutcome)
	}
	if h, c := len(recv.Spans("exactly.handle")), len(recv.Spans("exactly.claim")); h != 3 || c != 6 {
		t.Errorf("handle spans %d (want 3), claim spans %d (want 6)", h, c)
	}
	if !recv.Metric(telemetry.MetricRecords) {
		t.Errorf("metric %s not exported: %v", telemetry.MetricRecords, recv.MetricNames())
	}
}
