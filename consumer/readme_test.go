package consumer_test

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/consumer"
)

// envVars lists the variables of the env tags of t, nested structs included.
func envVars(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if name != "" {
			out = append(out, name)
			continue
		}
		if f.Type.Kind() == reflect.Struct {
			out = append(out, envVars(f.Type)...)
		}
	}
	return out
}

// The README's configuration table lists every variable the consumer reads.
func TestReadmeDocumentsEveryVariable(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	vars := envVars(reflect.TypeOf(consumer.Config{}))
	if len(vars) < 10 {
		t.Fatalf("found only %d variables in consumer.Config", len(vars))
	}
	for _, v := range vars {
		if !strings.Contains(string(readme), "| `"+v+"` |") {
			t.Errorf("README.md has no configuration row for %s", v)
		}
	}
}

// The README's embedding example is, verbatim, the code that ExampleService
// runs: the region between the README markers of example_service_test.go.
func TestReadmeEmbeddingIsTheExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_service_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, region, ok := strings.Cut(string(src), "// README:begin\n")
	region, _, ok2 := strings.Cut(region, "// README:end\n")
	if !ok || !ok2 {
		t.Fatal("example_service_test.go lacks the README:begin/README:end markers")
	}
	_, section, ok := strings.Cut(string(readme), "## Embedding a handler in your own `main`")
	if !ok {
		t.Fatal("README.md lacks the embedding section")
	}
	_, block, ok := strings.Cut(section, "```go\n")
	block, _, ok2 = strings.Cut(block, "```\n")
	if !ok || !ok2 {
		t.Fatal("the README's embedding section has no go code block")
	}
	if strings.TrimSpace(block) != strings.TrimSpace(region) {
		t.Errorf("README.md's embedding example differs from example_service_test.go's README region;\nREADME:\n%s\nexample:\n%s", block, region)
	}
}
