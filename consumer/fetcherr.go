package consumer

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"

	"github.com/exactly-go/exactly/internal/runtime/telemetry"
)

// How the poll loop treats fetch errors (see fetchErrors).
const (
	// fetchErrBackoffMin and fetchErrBackoffMax bound the wait before the
	// next poll after a poll that returned errors and no records; it
	// doubles from min to max while such polls follow each other. franz-go
	// answers a poll at once with the error of a partition that keeps
	// failing (a deleted topic: UNKNOWN_TOPIC_ID), so without a wait the
	// loop spun at ~15,000 polls a second. The max is also the longest a
	// record of a healthy partition may wait while another partition keeps
	// failing and nothing else arrives.
	fetchErrBackoffMin = 50 * time.Millisecond
	fetchErrBackoffMax = time.Second
	// fetchErrLogEvery is how often an error that lasts is logged again,
	// with the count since the last line.
	fetchErrLogEvery = 30 * time.Second
	// fetchErrClearAfter is how long an error must be absent from the
	// fetches before it is logged as stopped (records fetched from its
	// topic clear it at once).
	fetchErrClearAfter = 10 * time.Second
)

// fetchErrors watches the errors of the consumer's fetches. Each (topic,
// error type) is an episode: it is logged when it appears, then at most
// every fetchErrLogEvery with a count while it lasts, and once when it
// clears (records fetched from the topic) or stops (absent for
// fetchErrClearAfter). Every error is counted in exactly.fetch_errors. It
// tells the poll loop how long to wait before polling again, and which
// topics were deleted or re-created. Only the poll loop uses it.
type fetchErrors struct {
	log      *slog.Logger
	group    string
	count    func(ctx context.Context, topic, kind string)
	episodes map[fetchErrKey]*fetchEpisode
	// streak counts the consecutive polls that returned errors and no
	// records.
	streak int
}

type fetchErrKey struct{ topic, kind string }

type fetchEpisode struct {
	first, seen, logged time.Time
	total, sinceLog     int64
	partitions          []int32
	last                error
}

// newFetchErrors creates the exactly.fetch_errors counter from mp.
func newFetchErrors(mp metric.MeterProvider, log *slog.Logger, group string) (*fetchErrors, error) {
	count, err := telemetry.FetchErrors(mp, group)
	if err != nil {
		return nil, err
	}
	return &fetchErrors{log: log, group: group, count: count, episodes: map[fetchErrKey]*fetchEpisode{}}, nil
}

// errorKind is the bounded label of err: a Kafka error code's name, or
// "other".
func errorKind(err error) string {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Message
	}
	return "other"
}

// observe accounts for one poll's fetches at now. It returns how long the
// poll loop should wait before polling again (0 unless the poll returned
// errors and no records) and the topics whose partitions fail with
// UNKNOWN_TOPIC_ID: the topic was deleted, and maybe re-created, and
// franz-go never fetches it again until it is purged and re-added (see
// Consumer.resubscribe). A topic is reported when its episode begins and
// again each time the episode is logged as lasting.
func (f *fetchErrors) observe(ctx context.Context, fetches kgo.Fetches, now time.Time) (wait time.Duration, gone []string) {
	errs := 0
	fetches.EachError(func(topic string, p int32, err error) {
		errs++
		kind := errorKind(err)
		f.count(ctx, topic, kind)
		key := fetchErrKey{topic, kind}
		e, ok := f.episodes[key]
		if !ok {
			e = &fetchEpisode{first: now, logged: now}
			f.episodes[key] = e
		}
		e.seen, e.last = now, err
		e.total++
		e.sinceLog++
		if !slices.Contains(e.partitions, p) {
			e.partitions = append(e.partitions, p)
		}
		if !ok {
			f.log.Warn("fetch error; retried with backoff, logged again every "+fetchErrLogEvery.String()+" while it lasts",
				"topic", topic, "partition", p, "error", err, "group", f.group)
			if kind == kerr.UnknownTopicID.Message && !slices.Contains(gone, topic) {
				gone = append(gone, topic)
			}
		}
	})
	fetched := map[string]bool{}
	records := false
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) > 0 {
			fetched[p.Topic], records = true, true
		}
	})
	for key, e := range f.episodes {
		switch {
		case fetched[key.topic] && e.seen.Before(now):
			f.log.Info("fetch error cleared: records fetched again", "topic", key.topic, "error_type", key.kind,
				"errors", e.total, "lasted", now.Sub(e.first).Round(time.Millisecond), "group", f.group)
			delete(f.episodes, key)
		case now.Sub(e.seen) >= fetchErrClearAfter:
			f.log.Info("fetch error stopped", "topic", key.topic, "error_type", key.kind, "errors", e.total,
				"lasted", e.seen.Sub(e.first).Round(time.Millisecond), "group", f.group)
			delete(f.episodes, key)
		case e.seen.Equal(now) && now.Sub(e.logged) >= fetchErrLogEvery:
			f.log.Warn("fetch error persists", "topic", key.topic, "partitions", e.partitions, "error", e.last,
				"errors_since_last_log", e.sinceLog, "errors", e.total, "since", e.first, "group", f.group)
			e.logged, e.sinceLog = now, 0
			if key.kind == kerr.UnknownTopicID.Message && !slices.Contains(gone, key.topic) {
				gone = append(gone, key.topic)
			}
		}
	}
	if errs == 0 || records {
		f.streak = 0
		return 0, gone
	}
	f.streak++
	wait = fetchErrBackoffMin << min(f.streak-1, 10)
	return min(wait, fetchErrBackoffMax), gone
}

// afterFetchErrors is the poll loop's answer to observe: it subscribes
// again to the topics that are gone, then waits (up to wait, or until ctx
// is done) before the next poll.
func (c *Consumer) afterFetchErrors(ctx context.Context, cl *kgo.Client, wait time.Duration, gone []string) {
	for _, topic := range gone {
		c.resubscribe(cl, topic)
	}
	if wait <= 0 {
		return
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// resubscribe handles a topic that was deleted (and maybe re-created)
// while this member consumed it. franz-go keeps the deleted instance's
// topic ID and fails every fetch with UNKNOWN_TOPIC_ID until the topic is
// purged from the client and added again; a re-created topic is not
// consumed before that. resubscribe stops the topic's partition workers
// and drops their uncommitted marks (offsets of the deleted instance,
// which committed to the new one would skip its records; the records they
// cover did commit in the database, so at worst they are duplicates of a
// topic that no longer exists), then purges the topic from the client and
// adds it again: the client re-discovers it through its metadata, the
// group assigns its partitions anew, and they are consumed from the
// group's committed offsets, or from the start when there are none (the
// broker forgets a deleted topic's offsets). Until the topic exists
// again, nothing is fetched from it and nothing is logged.
func (c *Consumer) resubscribe(cl *kgo.Client, topic string) {
	c.mu.Lock()
	var parts []int32
	for key := range c.workers {
		if key.topic == topic {
			parts = append(parts, key.partition)
		}
	}
	c.mu.Unlock()
	ws := c.detach(map[string][]int32{topic: parts})
	c.stopWorkers(ws)
	cl.PurgeTopicsFromConsuming(topic)
	cl.AddConsumeTopics(topic)
	c.log.Warn("topic was deleted or re-created (UNKNOWN_TOPIC_ID): dropped its uncommitted offsets and subscribed to it again; it is consumed once it exists",
		"topic", topic, "partitions_dropped", len(ws), "group", c.cfg.Group)
}

// commitErrors rate-limits the log of failing offset commits, as
// fetchErrors does for fetches: a commit that keeps failing (its topic was
// deleted, the coordinator is away) is retried every Config.CommitInterval,
// and used to log every time. The first failure is logged, then at most one
// line every fetchErrLogEvery with a count, and one when a commit succeeds
// again. Its zero value is ready; it is safe for concurrent use (the commit
// loop, rebalance callbacks and shutdown all commit).
type commitErrors struct {
	mu            sync.Mutex
	failing       bool
	first, logged time.Time
	total, since  int64
}

// failed records a failed commit at now and logs it when due.
func (c *commitErrors) failed(log *slog.Logger, err error, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total++
	c.since++
	switch {
	case !c.failing:
		c.failing, c.first, c.logged, c.since = true, now, now, 0
		log.Warn("committing offsets failed; they will be committed later or redelivered as duplicates (logged again every "+fetchErrLogEvery.String()+" while commits fail)",
			"error", err)
	case now.Sub(c.logged) >= fetchErrLogEvery:
		log.Warn("committing offsets still fails", "error", err, "failures_since_last_log", c.since, "failures", c.total, "since", c.first)
		c.logged, c.since = now, 0
	}
}

// succeeded records a successful commit at now, logging the end of a run
// of failures.
func (c *commitErrors) succeeded(log *slog.Logger, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failing {
		log.Info("committing offsets succeeds again", "failures", c.total, "lasted", now.Sub(c.first).Round(time.Millisecond))
		c.failing, c.total, c.since = false, 0, 0
	}
}
