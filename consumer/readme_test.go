package consumer_test

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/consumer"
)

// envVar is a variable of an env tag and the default the tag gives it
// ("" when none).
type envVar struct{ name, def string }

// envVars lists the variables of the env tags of t, nested structs included.
func envVars(t reflect.Type) []envVar {
	var out []envVar
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("env"), ",")
		if name != "" {
			v := envVar{name: name}
			for _, o := range strings.Split(opts, ",") {
				if d, ok := strings.CutPrefix(strings.TrimSpace(o), "default="); ok {
					v.def = d
				}
			}
			out = append(out, v)
			continue
		}
		if f.Type.Kind() == reflect.Struct {
			out = append(out, envVars(f.Type)...)
		}
	}
	return out
}

// The README's configuration table lists every variable the consumer
// reads, with the default its env tag gives it.
func TestReadmeDocumentsEveryVariable(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	vars := envVars(reflect.TypeOf(consumer.Config{}))
	if len(vars) < 10 {
		t.Fatalf("found only %d variables in consumer.Config", len(vars))
	}
	var defaults int
	for _, v := range vars {
		_, row, ok := strings.Cut(string(readme), "| `"+v.name+"` |")
		if !ok {
			t.Errorf("README.md has no configuration row for %s", v.name)
			continue
		}
		if v.def == "" {
			continue
		}
		defaults++
		row, _, _ = strings.Cut(row, "|")
		if got := strings.TrimSpace(row); got != "`"+v.def+"`" {
			t.Errorf("README.md gives %s the default %s; its env tag says `%s`", v.name, got, v.def)
		}
	}
	if defaults < 10 {
		t.Errorf("found only %d defaults in the env tags of consumer.Config: is the tag parsing right?", defaults)
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
