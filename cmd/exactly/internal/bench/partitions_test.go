package bench

import (
	"slices"
	"strings"
	"testing"
)

// The sizes tried run from 8 to one per partition (plus the relay's and
// the pruner's), doubling; given sizes are sorted without repeats.
func TestSweepPools(t *testing.T) {
	if got, want := sweepPools(256, nil), []int{8, 16, 32, 64, 128, 258}; !slices.Equal(got, want) {
		t.Errorf("sweepPools(256) = %v, want %v", got, want)
	}
	if got, want := sweepPools(6, nil), []int{8}; !slices.Equal(got, want) {
		t.Errorf("sweepPools(6) = %v, want %v", got, want)
	}
	if got, want := sweepPools(64, []int{32, 8, 32}), []int{8, 32}; !slices.Equal(got, want) {
		t.Errorf("sweepPools(64, [32 8 32]) = %v, want %v", got, want)
	}
	if _, err := ParsePools("8,x"); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("ParsePools(8,x) = %v, want an error naming x", err)
	}
}

// The row is the default pool's rate; its note names the server
// connections it held, and the best size tried beside it, skipped sizes
// said as such.
func TestPartitionsResult(t *testing.T) {
	runs := []poolRun{
		{conns: 18, peak: 18, res: Result{Records: 1000, Seconds: 1, Rate: 1000}},
		{conns: 8, peak: 8, res: Result{Rate: 900}},
		{conns: 32, peak: 32, res: Result{Rate: 1200}},
		{conns: 258, peak: -1, skipped: "the server has 196 connections free"},
	}
	r := partitionsResult("256 partitions", 18, runs)
	if r.ID != idPartitions || r.Rate != 1000 || r.Missing {
		t.Fatalf("result %+v, want the default pool's rate 1000", r)
	}
	for _, want := range []string{"max_conns 18: 1000 rec/s with 18 server connections", "best of the sizes tried: pool 32, 1200 rec/s with 32 server connections", "0.83 × best", "pool 258 skipped (the server has 196 connections free)"} {
		if !strings.Contains(r.Note, want) {
			t.Errorf("note %q lacks %q", r.Note, want)
		}
	}
	if r := partitionsResult("256 partitions", 300, []poolRun{{conns: 300, skipped: "no room"}}); !r.Missing {
		t.Errorf("a skipped default pool gives %+v, want the row missing", r)
	}
}
