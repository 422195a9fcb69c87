package status_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// With no relay running and an outbox row older than
// OutboxProblemAfter, the report says no relay is active and needs a
// human, saying what to do; with a relay running it shows who holds the
// relay (a backend pid and the session's start, or a lease's holder with
// its host and pid, epoch and since) and, the row published, nothing
// about the relay needs a human.
func TestRelayHolderAndNoActiveRelay(t *testing.T) {
	pool := testenv.DB(t)
	ctx := t.Context()
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "events"))
	addOutboxRow(t, pool, outbox.Message{Topic: "events", Key: []byte("k"), Value: []byte("v")})
	if _, err := pool.Exec(ctx, `update exactly_outbox set created_at = now() - interval '10 minutes'`); err != nil {
		t.Fatal(err)
	}
	cfg := status.Config{Pool: pool, Database: pool.Config().ConnString()}
	r, err := status.Collect(ctx, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Relay.Active || len(r.Relay.Holders) != 0 {
		t.Errorf("relay %+v with no relay running, want none active", r.Relay)
	}
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], `outbox "exactly_outbox": no relay is active`) ||
		!strings.Contains(r.Problems[0], "1 rows wait, the oldest for 10m") || !strings.Contains(r.Problems[0], "-> do: start a relay") ||
		!strings.Contains(r.Problems[0], "docs/operations.md#exactlynoactiverelay") {
		t.Errorf("problems %q, want one: no relay active, with what to do", r.Problems)
	}

	relay, err := outbox.NewRelay(pool, brokers, outbox.RelayConfig{TakeoverInterval: 100 * time.Millisecond, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		<-done
		relay.Close()
	})
	started := time.Now()
	for {
		if r, err = status.Collect(ctx, cfg, 0); err != nil {
			t.Fatal(err)
		}
		if r.Relay.Active && r.Outbox.Backlog == 0 {
			break
		}
		if time.Since(started) > time.Minute {
			t.Fatalf("the relay never showed active with the row published: %+v, backlog %d", r.Relay, r.Outbox.Backlog)
		}
		time.Sleep(50 * time.Millisecond) // polling the database's view, as an operator does
	}
	if len(r.Relay.Holders) != 1 {
		t.Fatalf("holders %+v, want one", r.Relay.Holders)
	}
	h := r.Relay.Holders[0]
	t.Logf("relays elect by %s; the holder: %s", r.Relay.Mechanism, h)
	switch r.Relay.Mechanism {
	case "advisory lock":
		if h.PID <= 0 || h.Since.IsZero() || !strings.Contains(h.String(), "backend pid") {
			t.Errorf("lock holder %+v (%s), want its backend pid and since", h, h)
		}
	case "lease":
		host, _ := os.Hostname()
		if !strings.Contains(h.Holder, host) || h.Epoch < 1 || h.Since.IsZero() || h.Expired {
			t.Errorf("lease holder %+v, want this host, an epoch, since, unexpired", h)
		}
	default:
		t.Errorf("mechanism %q", r.Relay.Mechanism)
	}
	if r.NeedsHuman() {
		t.Errorf("with the relay active and the outbox empty: %q", r.Problems)
	}
}
