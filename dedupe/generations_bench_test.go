package dedupe_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/exactly-go/exactly/dedupe"
)

// BenchmarkClaimRecordsSealed claims batches of 100 new keys (one
// transaction each, rolled back: the statement's cost, not the commit's)
// with 0, 2 and 4 sealed generations of 100,000 rows each to probe: the
// cost of the generations, side by side in one run (go test -run '^$'
// -bench ClaimRecordsSealed -count 3 ./dedupe).
func BenchmarkClaimRecordsSealed(b *testing.B) {
	for _, sealed := range []int{0, 2, 4} {
		b.Run(fmt.Sprintf("sealed=%d", sealed), func(b *testing.B) {
			ctx := context.Background()
			pool := testDB(b)
			g := dedupe.New()
			if err := g.Migrate(ctx, pool); err != nil {
				b.Fatal(err)
			}
			p, err := g.NewPruner(pool, dedupe.PrunerConfig{Retention: time.Hour, AllowShortRetention: true, GenerationSpan: time.Microsecond})
			if err != nil {
				b.Fatal(err)
			}
			for range sealed {
				if _, err := pool.Exec(ctx, `insert into exactly_guard (scope, key, topic, kafka_partition, kafka_offset, handler, self_counted)
select 'credit', 'credit:' || gen_random_uuid(), 't', 0, n, 'credit', true from generate_series(1, 100000) as n`); err != nil {
					b.Fatal(err)
				}
				if _, _, err := p.PruneOnce(ctx); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := pool.Exec(ctx, `analyze`); err != nil {
				b.Fatal(err)
			}
			claims := make([]dedupe.RecordClaim, 100)
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				for j := range claims {
					claims[j] = dedupe.RecordClaim{Scope: "credit", Key: fmt.Sprintf("credit:new-%d-%d", i, j), Topic: "t", Offset: int64(i*100 + j), Handler: "credit"}
				}
				tx, err := pool.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := g.ClaimRecords(ctx, tx, claims); err != nil {
					b.Fatal(err)
				}
				if err := tx.Rollback(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*len(claims)), "µs/claim")
		})
	}
}
