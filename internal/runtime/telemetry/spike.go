package telemetry

import (
	"sync"
	"time"
)

// spikeBuckets is how many buckets a window is divided into: the window
// slides by a tenth of its length.
const spikeBuckets = 10

// DuplicateRate watches one handler's duplicate ratio over a sliding
// window: the diagnostic hook of Making Background Jobs Idempotent. A steady trickle of duplicates is
// normal at-least-once behaviour; a ratio above Threshold over at least
// MinRecords records in the window means mass redelivery (a crashed fleet,
// a rebalance storm, a producer retrying in a loop) and is reported once,
// when it starts; it is reported again only after the ratio has fallen to
// half the threshold or below. Safe for concurrent use.
type DuplicateRate struct {
	window     time.Duration
	threshold  float64
	minRecords int64
	now        func() time.Time

	mu      sync.Mutex
	buckets [spikeBuckets]rateBucket
	spiking bool
}

type rateBucket struct {
	slot       int64 // time slot this bucket holds, -1 when empty
	total, dup int64
}

// NewDuplicateRate returns a detector over window (at least 10ns) that
// fires above threshold (a ratio in (0, 1]) once the window holds at least
// minRecords records. now is the clock (nil: time.Now), injectable for
// tests.
func NewDuplicateRate(window time.Duration, threshold float64, minRecords int, now func() time.Time) *DuplicateRate {
	if window < spikeBuckets {
		window = spikeBuckets
	}
	if now == nil {
		now = time.Now
	}
	d := &DuplicateRate{window: window, threshold: threshold, minRecords: int64(minRecords), now: now}
	for i := range d.buckets {
		d.buckets[i].slot = -1
	}
	return d
}

// Window returns the length of the sliding window.
func (d *DuplicateRate) Window() time.Duration { return d.window }

// Threshold returns the ratio above which a spike is reported.
func (d *DuplicateRate) Threshold() float64 { return d.threshold }

// Observe adds total records, dup of them duplicates, at the current time.
// It returns the window's ratio and record count after adding them, and
// spike=true when this observation starts a spike.
func (d *DuplicateRate) Observe(total, dup int) (ratio float64, records int64, spike bool) {
	if d == nil {
		return 0, 0, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	slot := d.slot()
	b := &d.buckets[slot%spikeBuckets]
	if b.slot != slot {
		*b = rateBucket{slot: slot}
	}
	b.total += int64(total)
	b.dup += int64(dup)
	ratio, records = d.ratioLocked(slot)
	switch {
	case !d.spiking && records >= d.minRecords && ratio > d.threshold:
		d.spiking = true
		return ratio, records, true
	case d.spiking && (ratio <= d.threshold/2 || records < d.minRecords):
		d.spiking = false
	}
	return ratio, records, false
}

// Ratio returns the current window's duplicate ratio (0 with no records)
// and its record count.
func (d *DuplicateRate) Ratio() (float64, int64) {
	if d == nil {
		return 0, 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ratioLocked(d.slot())
}

func (d *DuplicateRate) slot() int64 {
	return d.now().UnixNano() / int64(d.window/spikeBuckets)
}

func (d *DuplicateRate) ratioLocked(slot int64) (float64, int64) {
	var total, dup int64
	for _, b := range d.buckets {
		if b.slot >= 0 && b.slot > slot-spikeBuckets && b.slot <= slot {
			total += b.total
			dup += b.dup
		}
	}
	if total == 0 {
		return 0, 0
	}
	return float64(dup) / float64(total), total
}
