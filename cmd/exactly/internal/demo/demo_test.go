package demo_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/cmd/exactly/internal/demo"
	"github.com/exactly-go/exactly/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The demo's numbers, counted from the database: naive triples, exactly
// applies each command once and reports the other copies as duplicates.
func TestDemoCounts(t *testing.T) {
	var out bytes.Buffer
	res, err := demo.Run(context.Background(), demo.Config{DatabaseURL: testenv.DBURL(t), Commands: 40, Copies: 3}, &out)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	if res.NaiveRows != 120 || !res.NaiveTripled {
		t.Errorf("naive: %d rows, tripled=%v; want 120 rows, tripled", res.NaiveRows, res.NaiveTripled)
	}
	if res.GuardedRows != 40 || res.GuardRows != 40 || res.Applied != 40 || res.Duplicates != 80 || !res.BalancesExact {
		t.Errorf("guarded: %+v; want 40 rows, 40 guard rows, 40 applied, 80 duplicates, exact balances", res)
	}
	if res.Notifications != 40 || res.NotifyDuplicates != int64(res.Republished) || res.Republished == 0 {
		t.Errorf("notify: %d notifications, %d duplicates, %d republished; want 40 notifications and duplicates == republished > 0",
			res.Notifications, res.NotifyDuplicates, res.Republished)
	}
	for _, line := range []string{"naive:   120 ledger rows, balances tripled", "guarded: 40 ledger rows, 80 duplicates skipped"} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("output lacks %q:\n%s", line, out.String())
		}
	}
}
