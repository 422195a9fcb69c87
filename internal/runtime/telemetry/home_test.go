package telemetry_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every metric instrument is created in internal/runtime/telemetry's
// instruments.go, so that a new metric has one obvious place: no other
// non-test Go file of the module asks a meter provider for a meter or
// creates a counter, histogram or gauge.
func TestInstrumentsHaveOneHome(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module root is not %s: %v", root, err)
	}
	home := filepath.Join(root, "internal", "runtime", "telemetry", "instruments.go")
	create := regexp.MustCompile(`\.Meter\(|\.(Int64|Float64)(Counter|UpDownCounter|Histogram|Gauge|ObservableCounter|ObservableUpDownCounter|ObservableGauge)\(`)
	var inHome int
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(src), "\n") {
			if !create.MatchString(line) || strings.HasPrefix(strings.TrimSpace(line), "//") {
				continue
			}
			if path == home {
				inHome++
				continue
			}
			rel, _ := filepath.Rel(root, path)
			t.Errorf("%s:%d creates a metric instrument outside internal/runtime/telemetry/instruments.go:\n\t%s", rel, i+1, strings.TrimSpace(line))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if inHome < 10 {
		t.Errorf("instruments.go creates %d instruments or meters; is the pattern right?", inHome)
	}
}
