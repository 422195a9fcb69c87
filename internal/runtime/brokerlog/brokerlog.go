package brokerlog

import (
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// How often a Log reports a broker that stays unreachable: at once, then
// after firstGap, doubling up to maxGap.
const (
	firstGap = time.Second
	maxGap   = time.Minute
)

// Log is a kgo.HookBrokerConnect (the consumer's and the relays'
// clients carry one; add it with kgo.WithHooks): franz-go retries a
// broker it cannot reach on its own and says nothing, so this logs each
// broker's failed connections, with backoff: the first failure at once,
// then again after 1s, 2s, 4s … up to a minute apart while it keeps failing
// (with the count of failed attempts since the last line), and once when a
// connection to it succeeds again. It is safe for concurrent use.
type Log struct {
	log *slog.Logger
	now func() time.Time

	mu      sync.Mutex
	brokers map[string]*brokerFailures // by host:port
}

// brokerFailures is one unreachable broker's reporting state.
type brokerFailures struct {
	since    time.Time     // first failure of this outage
	failures int           // failed attempts not yet reported
	gap      time.Duration // time between the last two reports
	next     time.Time     // no report before this
}

// New returns a Log that writes to log.
func New(log *slog.Logger) *Log {
	return &Log{log: log, now: time.Now, brokers: map[string]*brokerFailures{}}
}

// OnBrokerConnect implements kgo.HookBrokerConnect: it logs err (a failed
// connection) or the broker's return, as Log says. It never fails.
func (b *Log) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	addr := net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port)))
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.brokers[addr]
	if err == nil {
		if f != nil {
			delete(b.brokers, addr)
			b.log.Info("kafka broker reachable again", "broker", addr, "unreachable_for", now.Sub(f.since).Round(time.Millisecond))
		}
		return
	}
	if f == nil {
		f = &brokerFailures{since: now}
		b.brokers[addr] = f
	}
	f.failures++
	if now.Before(f.next) {
		return
	}
	switch {
	case f.gap == 0:
		f.gap = firstGap
	default:
		f.gap = min(2*f.gap, maxGap)
	}
	f.next = now.Add(f.gap)
	b.log.Warn("kafka broker unreachable; franz-go keeps retrying", "broker", addr, "failed_attempts", f.failures,
		"unreachable_for", now.Sub(f.since).Round(time.Millisecond), "next_report_in", f.gap, "error", err)
	f.failures = 0
}
