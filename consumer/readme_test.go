package consumer_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
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

// The configuration table of docs/configuration.md, the one place the
// variables are documented, lists every variable the consumer reads, with
// the default its env tag gives it.
func TestConfigurationDocumentsEveryVariable(t *testing.T) {
	const page = "../docs/configuration.md"
	doc, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	vars := envVars(reflect.TypeOf(consumer.Config{}))
	if len(vars) < 10 {
		t.Fatalf("found only %d variables in consumer.Config", len(vars))
	}
	var defaults int
	for _, v := range vars {
		_, row, ok := strings.Cut(string(doc), "| `"+v.name+"` |")
		if !ok {
			t.Errorf("%s has no configuration row for %s", page, v.name)
			continue
		}
		if v.def == "" {
			continue
		}
		defaults++
		row, _, _ = strings.Cut(row, "|")
		if got := strings.TrimSpace(row); got != "`"+v.def+"`" {
			t.Errorf("%s gives %s the default %s; its env tag says `%s`", page, v.name, got, v.def)
		}
	}
	if defaults < 10 {
		t.Errorf("found only %d defaults in the env tags of consumer.Config: is the tag parsing right?", defaults)
	}
	// One home: no other page has a row of its own for a variable, which
	// would drift from this one.
	others, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(others, "../README.md") {
		if f == page {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vars {
			if strings.Contains(string(b), "| `"+v.name+"` |") {
				t.Errorf("%s has a table row for %s; the variables are documented in %s only", f, v.name, page)
			}
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

// Every test, benchmark and example README.md and docs/*.md name (as
// `TestX`) is a function of some _test.go file of the module: a renamed or
// deleted test cannot stay cited as the guard of an invariant.
func TestDocsCiteExistingTests(t *testing.T) {
	docs, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	cited := map[string][]string{}
	name := regexp.MustCompile("`((?:Test|Benchmark|Example)[A-Z][A-Za-z0-9_]*)")
	for _, f := range append(docs, "../README.md") {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range name.FindAllStringSubmatch(string(b), -1) {
			cited[m[1]] = append(cited[m[1]], filepath.Base(f))
		}
	}
	defined := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Example)[A-Za-z0-9_]*)\(`)
	err = filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(cited) < 50 || !defined["TestDocsCiteExistingTests"] {
		t.Fatalf("%d tests cited, %d defined: is the scan right?", len(cited), len(defined))
	}
	for n, in := range cited {
		if !defined[n] {
			t.Errorf("%s names %s, which no _test.go defines", strings.Join(slices.Compact(in), ", "), n)
		}
	}
}

// docs/performance.md is a reference, not a run log: the method, what each
// row is, one run's figures, the targets and what limits the figures, in at
// most maxPerformanceLines lines. A change's runs go in its CHANGELOG entry.
func TestPerformancePageIsAReference(t *testing.T) {
	const maxPerformanceLines = 400
	b, err := os.ReadFile("../docs/performance.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > maxPerformanceLines {
		t.Errorf("docs/performance.md has %d lines, more than %d: move run logs to CHANGELOG.md", n, maxPerformanceLines)
	}
	for _, h := range []string{"\n## What each row is\n", "\n## Current figures\n", "\n## Targets\n", "\n## What limits the figures\n"} {
		if !strings.Contains(string(b), h) {
			t.Errorf("docs/performance.md lacks the section %q", strings.TrimSpace(h))
		}
	}
}
