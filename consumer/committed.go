package consumer

import (
	"go.opentelemetry.io/otel/metric"

	"github.com/exactly-go/exactly/internal/runtime/telemetry"
)

// committedOffsets is what the gauge exactly.consumer.committed_offset
// reads: the offset this member last committed to Kafka for each partition
// it owns. Guarded by the Consumer's mu.
type committedOffsets map[tp]int64

// noteCommitted records the offsets of a successful commit.
func (c *Consumer) noteCommitted(done map[string]map[int32]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.committedAt == nil {
		c.committedAt = committedOffsets{}
	}
	for topic, parts := range done {
		for p, off := range parts {
			c.committedAt[tp{topic, p}] = off
		}
	}
}

// observeCommitted registers the gauge exactly.consumer.committed_offset:
// per owned partition, the offset this member last committed (no series
// until its first commit since the partition was assigned). Beside
// exactly.consumer.lag it tells a consumer that is behind from one that
// stands still: lag growing while the committed offset does not move.
func (c *Consumer) observeCommitted() (metric.Registration, error) {
	return telemetry.ObserveCommitted(c.mp, c.cfg.Group, func(o telemetry.CommittedObserver) {
		c.mu.Lock()
		defer c.mu.Unlock()
		for key := range c.workers {
			if off, ok := c.committedAt[key]; ok {
				o.Committed(key.topic, key.partition, off)
			}
		}
	})
}
