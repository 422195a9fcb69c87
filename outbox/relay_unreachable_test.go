package outbox_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/outbox"
)

// chanHandler is a slog handler that sends each record's message, with the
// component attribute the relay's logger carries, on a channel (dropping
// what nobody reads).
type chanHandler struct {
	attrs []slog.Attr
	out   chan string
}

func (h chanHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h chanHandler) Handle(_ context.Context, r slog.Record) error {
	component := ""
	for _, a := range h.attrs {
		if a.Key == "component" {
			component = a.Value.String()
		}
	}
	select {
	case h.out <- component + ": " + r.Message:
	default:
	}
	return nil
}
func (h chanHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return chanHandler{attrs: append(append([]slog.Attr{}, h.attrs...), as...), out: h.out}
}
func (h chanHandler) WithGroup(string) slog.Handler { return h }

// A relay whose brokers cannot be reached says so, as the consumer does:
// franz-go retries the connection on its own without a word, and rows
// would pile up in the outbox with nothing in the log.
func TestRelayReportsUnreachableBrokers(t *testing.T) {
	e := setup(t, 1, "events")
	e.add(t, outbox.Message{Topic: "events", Key: []byte("k"), Value: []byte("v")})
	out := make(chan string, 64)
	cfg := e.fastConfig(t)
	cfg.Logger = slog.New(chanHandler{out: out})
	// Nothing listens on port 1: every connection attempt is refused.
	relay, err := outbox.NewRelay(e.pool, []string{"127.0.0.1:1"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	defer func() { cancel(); <-done }()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case line := <-out:
			if line == "outbox-relay: kafka broker unreachable; franz-go keeps retrying" {
				return
			}
		case err := <-done:
			t.Fatalf("relay returned %v before reporting the unreachable broker", err)
		case <-timeout:
			t.Fatal("no report of the unreachable broker in 30s")
		}
	}
}

// A relay whose database is unreachable reconnects with a backoff that
// doubles from RetryBackoff and is capped at 5 seconds (3s, then 5s, not
// 6s), so it is back within seconds of the database.
func TestRelayReconnectBackoffIsCapped(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	logs := make(logAttrs, 100)
	relay, err := outbox.NewRelay(pool, []string{"127.0.0.1:1"}, outbox.RelayConfig{RetryBackoff: 3 * time.Second, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); relay.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; relay.Close() })
	logs.await(t, "outbox relay session ended; reconnecting", "backoff=3s")
	logs.await(t, "outbox relay session ended; reconnecting", "backoff=5s")
}
