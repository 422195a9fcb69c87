package outbox_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// messages is a slog handler that sends each record's message on a
// channel (dropping it when the channel is full).
type messages chan string

func (m messages) Enabled(context.Context, slog.Level) bool { return true }
func (m messages) Handle(_ context.Context, r slog.Record) error {
	select {
	case m <- r.Message:
	default:
	}
	return nil
}
func (m messages) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m messages) WithGroup(string) slog.Handler      { return m }

// await waits for a message starting with prefix, failing t after 10 s.
func (m messages) await(t *testing.T, prefix string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case msg := <-m:
			if strings.HasPrefix(msg, prefix) {
				return
			}
		case <-deadline:
			t.Fatalf("no log message %q within 10s", prefix)
		}
	}
}

// A standby relay says so, once, and says when it becomes active.
func TestStandbyRelayLogsStandbyThenActive(t *testing.T) {
	e := setup(t, 1, "t")
	first := e.fastConfig(t)
	active := make(chan bool, 4)
	first.Hooks.OnActive = func(a bool) { active <- a }
	a := e.startRelay(t, first)
	if !<-active {
		t.Fatal("first OnActive(false)")
	}

	logs := make(messages, 100)
	second := e.fastConfig(t)
	second.Logger = slog.New(logs)
	e.startRelay(t, second)
	logs.await(t, "outbox relay on standby")
	a.stop()
	logs.await(t, "outbox relay active")
}
