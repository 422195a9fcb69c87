package consumer_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The core (consumer, handler, dedupe, outbox) links the OpenTelemetry API
// and nothing that exports: no gRPC, no OTLP exporter, no OpenTelemetry
// SDK, no Prometheus client. Those come only with consumer/otelexport.
func TestCoreLinksNoExporter(t *testing.T) {
	core := []string{"github.com/exactly-go/exactly/consumer", "github.com/exactly-go/exactly/handler",
		"github.com/exactly-go/exactly/dedupe", "github.com/exactly-go/exactly/outbox"}
	deps := goListDeps(t, core...)
	if !deps["go.opentelemetry.io/otel/trace"] || !deps["go.opentelemetry.io/otel/metric"] {
		t.Fatalf("the core does not link the OpenTelemetry API (go list found %d packages): is the list right?", len(deps))
	}
	forbidden := []string{"google.golang.org/grpc", "go.opentelemetry.io/otel/exporters/", "go.opentelemetry.io/otel/sdk",
		"github.com/prometheus/"}
	for dep := range deps {
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) {
				t.Errorf("the core links %s (matches %s)", dep, f)
			}
		}
	}
	// The plugin does link them: the check above can fail.
	if plugin := goListDeps(t, "github.com/exactly-go/exactly/consumer/otelexport"); !plugin["google.golang.org/grpc"] ||
		!plugin["github.com/prometheus/client_golang/prometheus"] {
		t.Error("consumer/otelexport links no gRPC or Prometheus: the forbidden prefixes are stale")
	}
}

// goListDeps returns the packages the given packages link (go list -deps).
func goListDeps(t *testing.T, pkgs ...string) map[string]bool {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-deps"}, pkgs...)...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	deps := map[string]bool{}
	for _, l := range strings.Fields(string(out)) {
		deps[l] = true
	}
	return deps
}
