package consumer

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// inflight counts records fetched but not yet finished, and pauses fetching
// while they exceed the configured bounds, so memory is bounded by the
// limits and not by the topic's size.
type inflight struct {
	maxRecords, maxBytes int
	client               *kgo.Client
	topics               []string

	mu      sync.Mutex
	records int
	bytes   int
	paused  bool
}

func newInflight(maxRecords, maxBytes int) *inflight {
	return &inflight{maxRecords: maxRecords, maxBytes: maxBytes}
}

func (f *inflight) add(records, bytes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.records += records
	f.bytes += bytes
	if !f.paused && (f.records >= f.maxRecords || f.bytes >= f.maxBytes) {
		f.paused = true
		f.client.PauseFetchTopics(f.topics...)
	}
}

func (f *inflight) sub(records, bytes int) {
	if records == 0 && bytes == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.records -= records
	f.bytes -= bytes
	if f.paused && f.records <= f.maxRecords/2 && f.bytes <= f.maxBytes/2 {
		f.paused = false
		f.client.ResumeFetchTopics(f.topics...)
	}
}
