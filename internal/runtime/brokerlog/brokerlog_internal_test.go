package brokerlog

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// lines is a slog handler keeping each record's message and attributes.
type lines struct {
	mu   sync.Mutex
	msgs []string
	at   []map[string]string
}

func (l *lines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lines) Handle(_ context.Context, r slog.Record) error {
	a := map[string]string{}
	r.Attrs(func(x slog.Attr) bool { a[x.Key] = x.Value.String(); return true })
	l.mu.Lock()
	l.msgs, l.at = append(l.msgs, r.Message), append(l.at, a)
	l.mu.Unlock()
	return nil
}
func (l *lines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *lines) WithGroup(string) slog.Handler      { return l }

// A broker that stays unreachable is reported again, at growing intervals
// (1s, 2s, 4s … at most a minute), with the attempts in between counted;
// its return is reported once.
func TestBrokerLogReportsAgainWithBackoff(t *testing.T) {
	var out lines
	b := New(slog.New(&out))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b.now = func() time.Time { return now }
	broker := kgo.BrokerMetadata{Host: "127.0.0.1", Port: 9092}
	other := kgo.BrokerMetadata{Host: "127.0.0.1", Port: 9093}
	refused := errors.New("connect: connection refused")
	// One failed attempt every 250ms for 10s.
	for range 40 {
		b.OnBrokerConnect(broker, 0, nil, refused)
		now = now.Add(250 * time.Millisecond)
	}
	b.OnBrokerConnect(other, 0, nil, nil) // another broker is fine: nothing to say
	b.OnBrokerConnect(broker, 0, nil, nil)
	b.OnBrokerConnect(broker, 0, nil, nil)

	want := []struct{ failures, gap string }{{"1", "1s"}, {"4", "2s"}, {"8", "4s"}, {"16", "8s"}}
	if len(out.msgs) != len(want)+1 {
		t.Fatalf("%d lines %q, want %d reports of the outage and one of the return", len(out.msgs), out.msgs, len(want)+1)
	}
	for i, w := range want {
		if out.msgs[i] != "kafka broker unreachable; franz-go keeps retrying" || out.at[i]["broker"] != "127.0.0.1:9092" ||
			out.at[i]["failed_attempts"] != w.failures || out.at[i]["next_report_in"] != w.gap || out.at[i]["error"] != refused.Error() {
			t.Errorf("report %d: %q %v; want %s failed attempts, next in %s", i, out.msgs[i], out.at[i], w.failures, w.gap)
		}
	}
	if last := len(out.msgs) - 1; out.msgs[last] != "kafka broker reachable again" || out.at[last]["unreachable_for"] != "10s" {
		t.Errorf("last line %q %v, want the broker's return after 10s", out.msgs[last], out.at[last])
	}

	// The gap stops growing at a minute.
	for range 20 {
		b.OnBrokerConnect(broker, 0, nil, refused)
		now = now.Add(5 * time.Minute)
	}
	if gap := out.at[len(out.at)-1]["next_report_in"]; gap != "1m0s" {
		t.Errorf("gap after a long outage %s, want 1m0s", gap)
	}
}
