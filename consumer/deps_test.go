package consumer_test

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// The core (consumer, handler, dedupe, outbox) links the OpenTelemetry API
// and nothing that exports: no gRPC, no OTLP exporter, no OpenTelemetry
// SDK, no Prometheus client. Those come only with consumer/otelexport. It
// links no Protobuf, Avro or Schema Registry code either: those come only
// with handler/schemaregistry's codecs.
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
	// Nor Protobuf or Avro code: those come only with the Schema Registry
	// codecs (handler/schemaregistry/...).
	for dep := range deps {
		for _, f := range []string{"github.com/hamba/avro", "github.com/twmb/franz-go/pkg/sr", "google.golang.org/protobuf"} {
			if strings.HasPrefix(dep, f) {
				t.Errorf("the core links %s (matches %s): Protobuf and Avro belong to handler/schemaregistry", dep, f)
			}
		}
	}
	if codecs := goListDeps(t, "github.com/exactly-go/exactly/handler/schemaregistry/protobuf",
		"github.com/exactly-go/exactly/handler/schemaregistry/avro"); !codecs["github.com/hamba/avro/v2"] || !codecs["google.golang.org/protobuf/proto"] {
		t.Error("the Schema Registry codecs link no Avro or Protobuf library: the forbidden prefixes are stale")
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

// The layering docs/design.md gives (the tools live in cmd/exactly/internal,
// where Go's internal rule keeps every other package out of them): the
// public packages link neither the test environment (internal/testenv) nor
// an example; nothing outside an example imports it (its tests included:
// the tools run copies of the example handlers, kept equal by
// TestSameAsExample); and an example's code imports only the public
// packages, its own subpackages and other modules (never internal/...), so
// that it can be copied out of the repository as it is. (An example's
// tests may use the test environment.)
func TestLayering(t *testing.T) {
	const mod = "github.com/exactly-go/exactly/"
	public := []string{mod + "consumer/...", mod + "handler/...", mod + "dedupe", mod + "outbox"}
	deps := goListDeps(t, public...)
	if !deps[mod+"internal/runtime/apply"] {
		t.Fatalf("the public packages do not link internal/runtime/apply (go list found %d packages): is the list right?", len(deps))
	}
	for dep := range deps {
		if strings.HasPrefix(dep, mod+"internal/testenv") || strings.HasPrefix(dep, mod+"examples/") {
			t.Errorf("a public package links %s", dep)
		}
	}
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, mod+"examples/...").Output()
	if err != nil {
		t.Fatalf("go list examples: %v", err)
	}
	allowed := []string{mod + "consumer", mod + "handler", mod + "dedupe", mod + "outbox"}
	var checked int
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		example := strings.Join(strings.SplitN(f[0], "/", 6)[:5], "/") // github.com/exactly-go/exactly/examples/<name>
		checked++
	imports:
		for _, imp := range f[1:] {
			if !strings.HasPrefix(imp, mod) || imp == example || strings.HasPrefix(imp, example+"/") {
				continue
			}
			for _, a := range allowed {
				if imp == a || strings.HasPrefix(imp, a+"/") {
					continue imports
				}
			}
			t.Errorf("%s imports %s: an example imports only the public packages and its own", f[0], imp)
		}
	}
	if checked < 4 {
		t.Errorf("go list found %d example packages; want the four examples and their handlers", checked)
	}
	all, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}`, mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(all)), "\n") {
		f := strings.Fields(line)
		if strings.HasPrefix(f[0], mod+"examples/") {
			continue
		}
		for _, imp := range f[1:] {
			if strings.HasPrefix(imp, mod+"examples/") {
				t.Errorf("%s imports %s: nothing imports an example", f[0], imp)
			}
		}
	}
}

// The public documentation names no internal type: go doc -all of every
// public package mentions no identifier of a package under internal/ (a
// user cannot name such a type, so a signature carrying one is a leak) and
// no internal import path. The internal packages' names come from go list,
// so a new internal package is covered without editing the test.
func TestPublicDocsNameNoInternalType(t *testing.T) {
	const mod = "github.com/exactly-go/exactly/"
	out, err := exec.Command("go", "list", "-f", "{{.Name}}", mod+"internal/...", mod+"cmd/exactly/internal/...").Output()
	if err != nil {
		t.Fatalf("go list internal packages: %v", err)
	}
	names := map[string]bool{}
	for _, n := range strings.Fields(string(out)) {
		names[regexp.QuoteMeta(n)] = true
	}
	if !names["workunit"] || !names["telemetry"] {
		t.Fatalf("go list found internal packages %v, without workunit and telemetry: is the pattern right?", names)
	}
	alt := make([]string, 0, len(names))
	for n := range names {
		alt = append(alt, n)
	}
	// A qualified identifier: the package's name, a dot, an exported name.
	leak := regexp.MustCompile(`\b(` + strings.Join(alt, "|") + `)\.[A-Z]\w*|exactly/internal/|cmd/exactly/internal`)
	for _, pkg := range []string{"consumer", "consumer/otelexport", "handler", "handler/handlertest", "dedupe", "outbox",
		"handler/schemaregistry", "handler/schemaregistry/protobuf", "handler/schemaregistry/avro", "handler/schemaregistry/jsonschema", "handler/schemaregistry/srtest"} {
		doc, err := exec.Command("go", "doc", "-all", mod+pkg).Output()
		if err != nil {
			t.Fatalf("go doc -all %s: %v", pkg, err)
		}
		if len(doc) < 200 {
			t.Fatalf("go doc -all %s printed %d bytes: is the package right?", pkg, len(doc))
		}
		for i, line := range strings.Split(string(doc), "\n") {
			if m := leak.FindString(line); m != "" {
				t.Errorf("go doc -all %s, line %d names %s, which users cannot import:\n\t%s", pkg, i+1, m, strings.TrimSpace(line))
			}
		}
	}
}
