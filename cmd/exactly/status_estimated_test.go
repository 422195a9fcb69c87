package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
)

// The text report marks an estimated applied figure with ≈ and leaves an
// exact one unmarked.
func TestPrintStatusMarksEstimatedOutcomes(t *testing.T) {
	var out bytes.Buffer
	printStatus(&out, &status.Report{Outcomes: []status.Outcomes{
		{Scope: "big", Applied: 5000000, Duplicate: 3, Estimated: true, Recent: -1},
		{Scope: "small", Applied: 7, Recent: -1},
	}})
	text := out.String()
	if !strings.Contains(text, `"big": applied ≈5000000, duplicate 3`) || !strings.Contains(text, `"small": applied 7, duplicate 0`) {
		t.Errorf("text report:\n%s\nwant big's applied marked ≈ and small's not", text)
	}
}
