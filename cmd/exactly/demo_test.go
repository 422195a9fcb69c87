package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/internal/testenv/otlptest"
)

// `exactly demo` exports its traces to the OTLP endpoint of
// OTEL_EXPORTER_OTLP_ENDPOINT and says where to look; the duplicate skips
// are there as process spans with exactly.outcome=duplicate.
func TestDemoExportsToOTLPEndpoint(t *testing.T) {
	recv := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.Endpoint)
	t.Setenv("OTEL_SERVICE_NAME", "")
	var out bytes.Buffer
	if err := runDemo(context.Background(), []string{"-commands", "20"}, &out); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "traces sent to") || !strings.Contains(out.String(), "exactly.outcome=duplicate") {
		t.Errorf("demo output does not say where to look:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "guarded: 20 ledger rows, 40 duplicates skipped") {
		t.Errorf("demo output:\n%s", out.String())
	}
	if !recv.Service("exactly-demo") {
		t.Error("no spans of service exactly-demo received")
	}
	dups := 0
	for _, name := range recv.SpanNames() {
		if !strings.HasSuffix(name, " process") {
			continue
		}
		for _, a := range recv.Spans(name) {
			if a["exactly.outcome"] == "duplicate" {
				dups++
			}
		}
	}
	// 40 duplicate credits, plus the notify consumer's duplicates of the
	// events the crashed relay republished.
	if dups < 40 {
		t.Errorf("received %d process spans with exactly.outcome=duplicate, want at least 40 (span names %v)", dups, recv.SpanNames())
	}
}
