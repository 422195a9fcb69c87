package consumer_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	collmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	colltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/telemetry"
	"github.com/exactly-go/exactly/internal/testenv"
)

// otlpReceiver is an in-process OTLP/gRPC collector: it keeps what it is
// sent.
type otlpReceiver struct {
	colltrace.UnimplementedTraceServiceServer
	collmetrics.UnimplementedMetricsServiceServer

	mu       sync.Mutex
	spans    map[string][]map[string]string // span name -> attributes of each
	services map[string]bool
	metrics  map[string]bool
}

func (r *otlpReceiver) Export(_ context.Context, req *colltrace.ExportTraceServiceRequest) (*colltrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				r.services[a.GetValue().GetStringValue()] = true
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				attrs := map[string]string{}
				for _, a := range s.GetAttributes() {
					attrs[a.GetKey()] = a.GetValue().GetStringValue()
				}
				r.spans[s.GetName()] = append(r.spans[s.GetName()], attrs)
			}
		}
	}
	return &colltrace.ExportTraceServiceResponse{}, nil
}

type metricsService struct{ r *otlpReceiver }

func (m metricsService) Export(_ context.Context, req *collmetrics.ExportMetricsServiceRequest) (*collmetrics.ExportMetricsServiceResponse, error) {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	for _, rm := range req.GetResourceMetrics() {
		for _, sm := range rm.GetScopeMetrics() {
			for _, mt := range sm.GetMetrics() {
				m.r.metrics[mt.GetName()] = true
			}
		}
	}
	return &collmetrics.ExportMetricsServiceResponse{}, nil
}

type metricsServer struct {
	collmetrics.UnimplementedMetricsServiceServer
	metricsService
}

func (m metricsServer) Export(ctx context.Context, req *collmetrics.ExportMetricsServiceRequest) (*collmetrics.ExportMetricsServiceResponse, error) {
	return m.metricsService.Export(ctx, req)
}

// Traces and metrics reach an OTLP/gRPC receiver over the real wire
// protocol, configured only by the standard OTEL_* variables.
func TestOTLPExportReachesReceiver(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	recv := &otlpReceiver{spans: map[string][]map[string]string{}, services: map[string]bool{}, metrics: map[string]bool{}}
	srv := grpc.NewServer()
	colltrace.RegisterTraceServiceServer(srv, recv)
	collmetrics.RegisterMetricsServiceServer(srv, metricsServer{metricsService: metricsService{recv}})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+ln.Addr().String())
	t.Setenv("OTEL_SERVICE_NAME", "credit-test")
	tel, err := telemetry.Setup(context.Background(), telemetry.Config{})
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

	recv.mu.Lock()
	defer recv.mu.Unlock()
	if !recv.services["credit-test"] {
		t.Errorf("service.name from OTEL_SERVICE_NAME not exported: %v", recv.services)
	}
	procs := recv.spans["credits process"]
	if len(procs) != 6 {
		t.Fatalf("received %d 'credits process' spans, want 6; names: %v", len(procs), keys(recv.spans))
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
	if len(recv.spans["exactly.handle"]) != 3 || len(recv.spans["exactly.claim"]) != 6 {
		t.Errorf("handle spans %d (want 3), claim spans %d (want 6)", len(recv.spans["exactly.handle"]), len(recv.spans["exactly.claim"]))
	}
	if !recv.metrics[telemetry.MetricRecords] {
		t.Errorf("metric %s not exported: %v", telemetry.MetricRecords, keys(recv.metrics))
	}
}
