package consumer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"

	"github.com/exactly-go/exactly/internal/runtime/telemetry"
)

// groupLag is what the gauges exactly.consumer.group_lag,
// exactly.consumer.group_committed_offset and exactly.consumer.group_members
// read: the group's lag as the broker sees it, for every partition of the
// consumer's topics, whoever owns it (as kminion reads it): a member that
// died or froze leaves its partitions' lag on the other members' series,
// rising, where its own exactly.consumer.lag series vanished with it.
type groupLag struct {
	mu sync.Mutex
	// read is false until the first successful read, and again after a
	// failed one: the gauges then report nothing rather than old figures.
	read       bool
	partitions map[tp]groupPartition
	members    int
}

// groupPartition is one partition's state in the group, read from the
// broker.
type groupPartition struct {
	lag int64
	// committed is the group's committed offset; -1 when the group has
	// none for the partition (its lag then counts from the log start).
	committed int64
}

// readGroupLag reads the group's committed offsets (OffsetFetch), the
// topics' start and end offsets (ListOffsets) and the group's members
// (DescribeGroups) from the broker. The lag of a partition is its end
// offset minus the group's committed offset, or minus its start offset
// when the group committed none. It fails when any of the three requests
// fails as a whole; a partition whose offsets could not be listed is left
// out.
func readGroupLag(ctx context.Context, adm *kadm.Client, group string, topics []string) (map[tp]groupPartition, int, error) {
	commits, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return nil, 0, fmt.Errorf("fetching the committed offsets of group %q: %w", group, err)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, 0, fmt.Errorf("listing the end offsets of %q: %w", topics, err)
	}
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err != nil {
		return nil, 0, fmt.Errorf("listing the start offsets of %q: %w", topics, err)
	}
	described, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return nil, 0, fmt.Errorf("describing group %q: %w", group, err)
	}
	members := 0
	if g, ok := described[group]; ok {
		if g.Err != nil {
			return nil, 0, fmt.Errorf("describing group %q: %w", group, g.Err)
		}
		members = len(g.Members)
	}
	out := map[tp]groupPartition{}
	ends.Each(func(e kadm.ListedOffset) {
		if e.Err != nil {
			return
		}
		p := groupPartition{committed: -1}
		if c, ok := commits.Lookup(e.Topic, e.Partition); ok && c.Err == nil && c.At >= 0 {
			p.committed = c.At
			p.lag = e.Offset - c.At
		} else if s, ok := starts.Lookup(e.Topic, e.Partition); ok && s.Err == nil {
			p.lag = e.Offset - s.Offset
		} else {
			return
		}
		out[tp{e.Topic, e.Partition}] = p
	})
	return out, members, nil
}

// watchGroupLag reads the group's lag every Config.GroupLagInterval until
// ctx ends. A failed read is logged at debug level (the broker's own
// errors are logged by the poll loop) and clears the figures until the
// next success.
func (c *Consumer) watchGroupLag(ctx context.Context, cl *kgo.Client) {
	adm := kadm.NewClient(cl)
	t := time.NewTicker(c.cfg.GroupLagInterval)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, max(c.cfg.GroupLagInterval, 5*time.Second))
		parts, members, err := readGroupLag(rctx, adm, c.cfg.Group, c.topics)
		cancel()
		c.groupLag.mu.Lock()
		c.groupLag.read = err == nil
		c.groupLag.partitions, c.groupLag.members = parts, members
		c.groupLag.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			c.log.Debug("could not read the group's lag from the broker", "group", c.cfg.Group, "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// observeGroupLag registers the gauges of the group's lag read by
// watchGroupLag.
func (c *Consumer) observeGroupLag() (metric.Registration, error) {
	return telemetry.ObserveGroupLag(c.mp, c.cfg.Group, func(o telemetry.GroupLagObserver) {
		c.groupLag.mu.Lock()
		defer c.groupLag.mu.Unlock()
		if !c.groupLag.read {
			return
		}
		o.Members(int64(c.groupLag.members))
		for key, p := range c.groupLag.partitions {
			o.Partition(key.topic, key.partition, p.lag, p.committed)
		}
	})
}
