package workload_test

import (
	"os"
	"strings"
	"testing"
)

// The tools' copies of the example handlers are the examples' code: below
// the package clause, each file is byte for byte the example's, so the
// binaries the chaos harness runs and the checks it makes agree.
func TestSameAsExample(t *testing.T) {
	for _, pkg := range []string{"credit", "notify"} {
		example, err := os.ReadFile("../../../../examples/" + pkg + "/" + pkg + "/" + pkg + ".go")
		if err != nil {
			t.Fatal(err)
		}
		copied, err := os.ReadFile(pkg + "/" + pkg + ".go")
		if err != nil {
			t.Fatal(err)
		}
		clause := "package " + pkg + "\n"
		_, e, ok1 := strings.Cut(string(example), clause)
		_, c, ok2 := strings.Cut(string(copied), clause)
		if !ok1 || !ok2 {
			t.Fatalf("%s: no %q clause", pkg, clause)
		}
		if e != c {
			t.Errorf("cmd/exactly/internal/workload/%s/%s.go differs from examples/%s/%s/%s.go below the package clause: copy it again", pkg, pkg, pkg, pkg, pkg)
		}
	}
}
