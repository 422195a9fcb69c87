package status

import (
	"strings"
	"testing"
)

// The JSON report has plain table names and null, not -1, for "no data".
func TestReportJSONHasPlainTablesAndNulls(t *testing.T) {
	r := &Report{
		Partitions: []Partition{
			{Group: "g", Topic: "t", Committed: -1, End: 5, Lag: 5, LagBefore: -1},
			{Group: "g", Topic: "t", Partition: 1, Committed: 2, End: 5, Lag: 3, LagBefore: 4},
		},
		Outbox:   Outbox{Table: `"ops"."exactly_outbox"`, Rows: []OutboxRow{}},
		Guard:    Guard{Table: `"we""ird"`},
		Outcomes: []Outcomes{{Scope: "credit", Applied: 1, Recent: -1}, {Scope: "notify", Applied: 2, Duplicate: 2, Ratio: 0.5, Recent: 0.5}},
	}
	b, err := r.JSON()
	if err != nil {
		t.Fatal(err)
	}
	js := string(b)
	for _, want := range []string{
		`"table": "ops.exactly_outbox"`, `"table": "we\"ird"`,
		`"committed": null`, `"lag_before": null`, `"committed": 2`, `"lag": 3`, `"lag_before": 4`,
		`"recent_duplicate_ratio": null`, `"recent_duplicate_ratio": 0.5`,
		`"group": "g"`, `"end": 5`, `"scope": "credit"`, `"backlog": 0`,
	} {
		if !strings.Contains(js, want) {
			t.Errorf("JSON lacks %s:\n%s", want, js)
		}
	}
	if strings.Contains(js, "-1") {
		t.Errorf("JSON still holds -1:\n%s", js)
	}
	for in, want := range map[string]string{`"a"."b"`: "a.b", `"x"`: "x", `plain`: "plain", `"bad`: `"bad`, `"a".`: `"a".`} {
		if got := unquoteTable(in); got != want {
			t.Errorf("unquoteTable(%s) = %s, want %s", in, got, want)
		}
	}
}
