package status_test

import (
	"strings"
	"testing"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
)

// Above the threshold of guard rows still counting themselves, status
// reads the counter rows and the planner's estimate of the applied guard
// rows instead of counting them, and marks the scope's figures estimated;
// at the threshold it still counts them exactly. The scenario's guard holds
// scenarioUnique rows, so a threshold one below it takes the estimate path.
func TestOutcomesAreEstimatedAboveTheThreshold(t *testing.T) {
	s := newScenario(t)
	ctx := t.Context()
	// The planner's statistics, as autovacuum would have them on a table
	// past the threshold.
	if _, err := s.pool.Exec(ctx, "analyze"); err != nil {
		t.Fatal(err)
	}
	dups := int64(scenarioConsumed - scenarioUnique)

	c, err := status.NewCollector(s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	status.SetOutcomeEstimateAbove(c, scenarioUnique)
	r := c.Collect(ctx)
	if len(r.Outcomes) != 1 || r.Outcomes[0].Estimated || r.Outcomes[0].Applied != scenarioUnique || r.Outcomes[0].Duplicate != dups {
		t.Fatalf("at the threshold: outcomes %+v (errors %q); want exact applied %d duplicate %d, not estimated",
			r.Outcomes, r.Errors, scenarioUnique, dups)
	}

	status.SetOutcomeEstimateAbove(c, scenarioUnique-1)
	r = c.Collect(ctx)
	if len(r.Outcomes) != 1 {
		t.Fatalf("above the threshold: outcomes %+v (errors %q); want one scope", r.Outcomes, r.Errors)
	}
	o := r.Outcomes[0]
	// Duplicates are counter rows (exact); applied rows count themselves
	// and are the planner's estimate, near the truth after analyze.
	if !o.Estimated || o.Scope != scenarioHandler || o.Duplicate != dups || o.Applied < scenarioUnique/2 || o.Applied > 2*scenarioUnique {
		t.Errorf("above the threshold: outcome %+v; want estimated, duplicate %d, applied near %d", o, dups, scenarioUnique)
	}
	b, err := r.JSON()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"estimated": true`) {
		t.Errorf("JSON does not mark the estimate:\n%s", b)
	}
}
