package consumer

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkOffsetTracking is a partition worker's offset bookkeeping for one
// batch of 100 records: enqueue, take, mark after the commit, and the
// committer's pending/committed.
func BenchmarkOffsetTracking(b *testing.B) {
	w := &worker{wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}), committedAt: -1}
	recs := make([]*kgo.Record, 100)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: "t", Partition: 0, Value: make([]byte, 64)}
	}
	var off int64
	b.ReportAllocs()
	for b.Loop() {
		for _, r := range recs {
			r.Offset = off
			off++
		}
		w.enqueue(recs)
		batch := w.take(len(recs))
		w.markDone(batch[len(batch)-1])
		eo, ok := w.pending()
		if !ok {
			b.Fatal("nothing pending")
		}
		w.committed(eo)
	}
}
