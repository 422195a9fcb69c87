package consumer

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// inflight bounds the records fetched but not yet finished, so memory is
// bounded by the configured limits and not by a topic's size or backlog.
//
// Each owned partition gets an equal share of the limits. A partition over
// its share is paused (PauseFetchPartitions) while the others keep
// fetching, so one busy partition cannot starve the rest of the member's
// workers; it resumes once it has worked off half its share. A partition is
// also paused when the member as a whole is over its limits (after a
// rebalance shrinks the shares), and resumes when both hold again.
type inflight struct {
	maxRecords, maxBytes int
	client               *kgo.Client

	mu      sync.Mutex
	parts   map[tp]*budget
	records int
	bytes   int
}

type budget struct {
	records, bytes int
	paused         bool
	// held is set by the partition's worker while it works as far ahead
	// of its lowest unfinished record as it may (see worker.holdFetching):
	// the partition stays paused whatever its share.
	held bool
}

func newInflight(maxRecords, maxBytes int) *inflight {
	return &inflight{maxRecords: maxRecords, maxBytes: maxBytes, parts: map[tp]*budget{}}
}

// shareLocked is one partition's share of the limits.
func (f *inflight) shareLocked() (records, bytes int) {
	n := max(len(f.parts), 1)
	return max(f.maxRecords/n, 1), max(f.maxBytes/n, 1)
}

func (f *inflight) setClient(cl *kgo.Client) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.client = cl
}

func (f *inflight) register(t tp) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.parts[t]; !ok {
		f.parts[t] = &budget{}
	}
}

// unregister forgets a partition that is no longer owned, resuming it so
// that a later assignment starts unpaused.
func (f *inflight) unregister(t tp) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.parts[t]
	if !ok {
		return
	}
	f.records -= b.records
	f.bytes -= b.bytes
	delete(f.parts, t)
	if (b.paused || b.held) && f.client != nil {
		f.client.ResumeFetchPartitions(map[string][]int32{t.topic: {t.partition}})
	}
	f.resumeLocked()
}

func (f *inflight) add(t tp, records, bytes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.parts[t]
	if !ok {
		return
	}
	b.records += records
	b.bytes += bytes
	f.records += records
	f.bytes += bytes
	shareRecords, shareBytes := f.shareLocked()
	over := b.records >= shareRecords || b.bytes >= shareBytes ||
		f.records >= f.maxRecords || f.bytes >= f.maxBytes
	if over && !b.paused && f.client != nil {
		b.paused = true
		f.client.PauseFetchPartitions(map[string][]int32{t.topic: {t.partition}})
	}
}

func (f *inflight) sub(t tp, records, bytes int) {
	if records == 0 && bytes == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.parts[t]
	if !ok {
		return
	}
	b.records -= records
	b.bytes -= bytes
	f.records -= records
	f.bytes -= bytes
	f.resumeLocked()
}

// resumeLocked resumes every paused partition that is at or under half its
// share, while the member is under its limits.
func (f *inflight) resumeLocked() {
	if f.client == nil || f.records >= f.maxRecords || f.bytes >= f.maxBytes {
		return
	}
	shareRecords, shareBytes := f.shareLocked()
	var resume map[string][]int32
	for t, b := range f.parts {
		if b.paused && !b.held && b.records <= shareRecords/2 && b.bytes <= shareBytes/2 {
			b.paused = false
			if resume == nil {
				resume = map[string][]int32{}
			}
			resume[t.topic] = append(resume[t.topic], t.partition)
		}
	}
	if resume != nil {
		f.client.ResumeFetchPartitions(resume)
	}
}

// hold pauses fetching for t while on, whatever its share, and lets it
// resume (once under half its share) when turned off.
func (f *inflight) hold(t tp, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.parts[t]
	if !ok || b.held == on {
		return
	}
	b.held = on
	if on && !b.paused && f.client != nil {
		b.paused = true
		f.client.PauseFetchPartitions(map[string][]int32{t.topic: {t.partition}})
	}
	if !on {
		f.resumeLocked()
	}
}

// state returns t's records in flight (fetched, not finished) and whether
// fetching is paused for it.
func (f *inflight) state(t tp) (records int, paused bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b, ok := f.parts[t]; ok {
		return b.records, b.paused
	}
	return 0, false
}
