package bench

import (
	"math"
	"testing"
	"time"
)

// The clock counts every record, files the latency of every latencyEvery-th
// and ends with the last, whatever its place in the sampling.
func TestClockSamplesLatencyAndCountsEveryRecord(t *testing.T) {
	const want = 4*latencyEvery*25 + 3 // the last record is not a sampled one
	c := newClock(want)
	before := c.start.Add(-time.Second) // a backlog record: latency from the start
	for i := range want {
		select {
		case <-c.done:
			t.Fatalf("done after %d of %d records", i, want)
		default:
		}
		c.committed(before)
	}
	select {
	case <-c.done:
	default:
		t.Fatalf("not done after %d records", want)
	}
	if got := c.count.Load(); got != want {
		t.Fatalf("count %d, want %d", got, want)
	}
	if got, wantSamples := c.lat.n, uint64(want/latencyEvery); got != wantSamples {
		t.Fatalf("%d latency samples, want %d", got, wantSamples)
	}
	if c.last.Load() == 0 {
		t.Fatal("the last record's time was not kept")
	}
	if p99 := c.lat.quantile(0.99); p99 > 1000 {
		t.Fatalf("p99 %.1f ms counts from the backlog record's timestamp, not the scenario's start", p99)
	}
}

func TestHistBucketsGrowByHistGrowth(t *testing.T) {
	if logGrowth != math.Log(histGrowth) {
		t.Fatalf("logGrowth %v, want math.Log(%v) = %v", logGrowth, histGrowth, math.Log(histGrowth))
	}
	var h hist
	h.add(histMin * 2)
	// the bucket of 2 × histMin ends within one growth step above it
	got := h.quantile(1) * float64(time.Millisecond)
	if lo, hi := float64(2*histMin), float64(2*histMin)*histGrowth; got < lo || got > hi*histGrowth {
		t.Fatalf("2 × histMin filed in a bucket ending at %v ns, want within [%v, %v]", got, lo, hi*histGrowth)
	}
}
