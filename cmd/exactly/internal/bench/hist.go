package bench

import (
	"math"
	"sync"
	"time"
)

// hist is a latency histogram with logarithmic buckets (2% wide) from 10µs
// to about 30 minutes: constant memory however many samples, so it does not
// weigh on the peak RSS it is measured next to.
type hist struct {
	mu     sync.Mutex
	counts [1000]uint64
	n      uint64
}

const (
	histMin    = 10 * time.Microsecond
	histGrowth = 1.02
	// logGrowth is math.Log(histGrowth), which hist.add divides by.
	logGrowth = 0.01980262729617973
)

func (h *hist) add(d time.Duration) {
	i := 0
	if d > histMin {
		i = int(math.Log(float64(d)/float64(histMin)) / logGrowth)
		i = min(i, len(h.counts)-1)
	}
	h.mu.Lock()
	h.counts[i]++
	h.n++
	h.mu.Unlock()
}

// quantile returns the upper bound of the bucket holding quantile q, in
// milliseconds, or -1 without samples.
func (h *hist) quantile(q float64) float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 {
		return -1
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			upper := float64(histMin) * math.Pow(histGrowth, float64(i+1))
			return upper / float64(time.Millisecond)
		}
	}
	return -1
}
