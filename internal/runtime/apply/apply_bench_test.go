package apply_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/exactly-go/exactly/dedupe"
)

// BenchmarkRun measures one batch of 100 fresh records through Executor.Run
// (claim, 100 handler inserts, counters, commit): the transaction the
// consumer runs per batch under a backlog. Reported per batch.
func BenchmarkRun(b *testing.B) {
	f := newFixture(b)
	ctx := context.Background()
	batch := make([]cmd, 100)
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		for i := range batch {
			batch[i] = cmd{ID: fmt.Sprint(n)}
			n++
		}
		its := items(b, 1, batch...)
		res, herr, err := f.exec.Run(ctx, its)
		if err != nil || herr != nil || len(res) != len(its) || res[0].Outcome != dedupe.Applied {
			b.Fatalf("%v %v", herr, err)
		}
	}
	b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "records/s")
}
