package consumer

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// messages is a slog handler that keeps the messages logged.
type messages struct {
	mu   sync.Mutex
	msgs []string
}

func (m *messages) Enabled(context.Context, slog.Level) bool { return true }
func (m *messages) Handle(_ context.Context, r slog.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.msgs = append(m.msgs, r.Message)
	return nil
}
func (m *messages) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m *messages) WithGroup(string) slog.Handler      { return m }

// count returns how many messages logged begin with prefix.
func (m *messages) count(prefix string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, s := range m.msgs {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

// testFetchErrors is a fetchErrors logging to the returned messages.
func testFetchErrors() (*fetchErrors, *messages) {
	m := &messages{}
	return &fetchErrors{log: slog.New(m), group: "g", count: func(context.Context, string, string) {},
		episodes: map[fetchErrKey]*fetchEpisode{}}, m
}

// fetches is one poll's fetches of topic t: partition 0 failing with err
// (none: nil), and partition 1 returning records (records > 0).
func fetches(err error, records int) kgo.Fetches {
	var ps []kgo.FetchPartition
	if err != nil {
		ps = append(ps, kgo.FetchPartition{Partition: 0, Err: err})
	}
	if records > 0 {
		p := kgo.FetchPartition{Partition: 1}
		for i := range records {
			p.Records = append(p.Records, &kgo.Record{Topic: "t", Partition: 1, Offset: int64(i)})
		}
		ps = append(ps, p)
	}
	return kgo.Fetches{{Topics: []kgo.FetchTopic{{Topic: "t", Partitions: ps}}}}
}

// A topic deleted (and maybe re-created) is reported gone at the first poll
// that fails with UNKNOWN_TOPIC_ID, so the consumer subscribes to it again
// at once, not when the error is next logged (fetchErrLogEvery later); the
// polls after it in the same episode do not report it again.
func TestDeletedTopicIsReportedAtItsFirstError(t *testing.T) {
	f, _ := testFetchErrors()
	ctx, now := context.Background(), time.Now()
	if _, gone := f.observe(ctx, fetches(kerr.UnknownTopicID, 0), now); !slices.Equal(gone, []string{"t"}) {
		t.Fatalf("gone at the first UNKNOWN_TOPIC_ID = %v, want [t]: the re-created topic would be consumed only %v later", gone, fetchErrLogEvery)
	}
	for i := 1; i < 10; i++ {
		if _, gone := f.observe(ctx, fetches(kerr.UnknownTopicID, 0), now.Add(time.Duration(i)*time.Second)); len(gone) != 0 {
			t.Fatalf("gone at poll %d of the same episode = %v, want none", i, gone)
		}
	}
	if _, gone := f.observe(ctx, fetches(kerr.UnknownServerError, 0), now); len(gone) != 0 {
		t.Fatalf("gone at UNKNOWN_SERVER_ERROR = %v, want none", gone)
	}
}

// An error that lasts is logged when it appears and then once every
// fetchErrLogEvery, however often the poll loop polls: 65 s of polls every
// 100 ms log it three times (at 0, 30 and 60 s).
func TestLastingFetchErrorIsLoggedEveryInterval(t *testing.T) {
	f, m := testFetchErrors()
	ctx, start := context.Background(), time.Now()
	for at := time.Duration(0); at <= 65*time.Second; at += 100 * time.Millisecond {
		f.observe(ctx, fetches(kerr.UnknownServerError, 0), start.Add(at))
	}
	if first, again := m.count("fetch error;"), m.count("fetch error persists"); first != 1 || again != 2 {
		t.Errorf("650 polls over 65 s of one error logged it %d times and %d times again, want once and twice (every %v)",
			first, again, fetchErrLogEvery)
	}
}

// Polls that return only errors are spaced out, doubling from
// fetchErrBackoffMin to fetchErrBackoffMax; a poll that returns records of a
// healthy partition beside the failing one waits for nothing, so healthy
// partitions are not throttled while another fails.
func TestFetchErrorsBackOffOnlyWithoutRecords(t *testing.T) {
	f, _ := testFetchErrors()
	ctx, now := context.Background(), time.Now()
	var waits []time.Duration
	for range 7 {
		wait, _ := f.observe(ctx, fetches(kerr.UnknownServerError, 0), now)
		waits = append(waits, wait)
	}
	want := []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
		800 * time.Millisecond, time.Second, time.Second}
	if !slices.Equal(waits, want) {
		t.Errorf("waits after polls of errors only = %v, want %v", waits, want)
	}
	if wait, _ := f.observe(ctx, fetches(kerr.UnknownServerError, 3), now); wait != 0 {
		t.Errorf("wait after a poll with a failing partition and a healthy one's records = %v, want 0", wait)
	}
	if wait, _ := f.observe(ctx, fetches(kerr.UnknownServerError, 0), now); wait != fetchErrBackoffMin {
		t.Errorf("wait after records then errors only = %v, want %v (the backoff starts again)", wait, fetchErrBackoffMin)
	}
}

// resubscribe, for a topic that was deleted (or re-created), stops the
// topic's partition workers and forgets them, so that no commit carries
// their marks (offsets of the deleted instance, which would skip the new
// one's records); the workers of other topics go on.
func TestResubscribeDropsTheTopicsWorkers(t *testing.T) {
	m := &messages{}
	c := &Consumer{log: slog.New(m), limit: newInflight(0, 0), workers: map[tp]*worker{}}
	idle := func(topic string, p int32) *worker {
		w := &worker{c: c, topic: topic, partition: p, quit: make(chan struct{}), done: make(chan struct{})}
		c.workers[tp{topic, p}] = w
		c.limit.register(tp{topic, p})
		go func() { <-w.quit; close(w.done) }()
		return w
	}
	gone0, gone1, other := idle("t", 0), idle("t", 1), idle("u", 0)
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumeTopics("t", "u"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c.resubscribe(cl, "t")
	if _, ok := c.workers[tp{"t", 0}]; ok || len(c.workers) != 1 || c.workers[tp{"u", 0}] != other {
		t.Errorf("workers after resubscribing to t: %v, want only u/0's: t's marks would be committed", slices.Collect(maps.Keys(c.workers)))
	}
	for _, w := range []*worker{gone0, gone1} {
		select {
		case <-w.done:
		default:
			t.Errorf("worker of t/%d still runs after its topic was resubscribed", w.partition)
		}
	}
	select {
	case <-other.done:
		t.Error("worker of u/0 stopped: only the deleted topic's workers stop")
	default:
	}
	if n := m.count("topic was deleted or re-created"); n != 1 {
		t.Errorf("resubscribing logged %d lines, want 1", n)
	}
}
