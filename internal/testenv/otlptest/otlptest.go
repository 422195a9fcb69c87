// Package otlptest is an in-process OTLP/gRPC collector for tests: it
// speaks the real wire protocol on a loopback port and keeps what it is
// sent.
package otlptest

import (
	"context"
	"net"
	"sort"
	"sync"
	"testing"

	collmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	colltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// Receiver collects exported spans (name and string attributes), service
// names and metric names.
type Receiver struct {
	colltrace.UnimplementedTraceServiceServer

	// Endpoint is "http://127.0.0.1:<port>", for OTEL_EXPORTER_OTLP_ENDPOINT.
	Endpoint string

	mu       sync.Mutex
	spans    map[string][]map[string]string
	services map[string]bool
	metrics  map[string]bool
}

// Start listens on a loopback port and serves until the test ends. It fails
// t when it cannot listen.
func Start(t testing.TB) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("otlptest: listening: %v", err)
	}
	r := &Receiver{Endpoint: "http://" + ln.Addr().String(),
		spans: map[string][]map[string]string{}, services: map[string]bool{}, metrics: map[string]bool{}}
	srv := grpc.NewServer()
	colltrace.RegisterTraceServiceServer(srv, r)
	collmetrics.RegisterMetricsServiceServer(srv, metricsServer{r: r})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return r
}

// Export implements the OTLP trace service.
func (r *Receiver) Export(_ context.Context, req *colltrace.ExportTraceServiceRequest) (*colltrace.ExportTraceServiceResponse, error) {
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

type metricsServer struct {
	collmetrics.UnimplementedMetricsServiceServer
	r *Receiver
}

func (m metricsServer) Export(_ context.Context, req *collmetrics.ExportMetricsServiceRequest) (*collmetrics.ExportMetricsServiceResponse, error) {
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

// Spans returns the attributes of every received span named name.
func (r *Receiver) Spans(name string) []map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string]string(nil), r.spans[name]...)
}

// SpanNames returns the names of the received spans, sorted.
func (r *Receiver) SpanNames() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return sortedKeys(r.spans)
}

// Service reports whether a resource with service.name name was received.
func (r *Receiver) Service(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.services[name]
}

// Metric reports whether a metric named name was received.
func (r *Receiver) Metric(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.metrics[name]
}

// MetricNames returns the names of the received metrics, sorted.
func (r *Receiver) MetricNames() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return sortedKeys(r.metrics)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
