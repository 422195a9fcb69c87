package consumer_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testenv"
)

// A Consumer started while its database cannot be reached (down, or still
// starting) does not fail: it cannot tell whether the guard table is
// there, so it warns, joins the group and consumes, its batches retried
// until the database is back, as in any outage; cancelled, it returns
// nil. Only a *SchemaError (the table missing or behind) stops it at start.
func TestConsumerRunGoesOnWhenTheDatabaseIsUnreachable(t *testing.T) {
	kc := testenv.Kafka(t, 1, "credits")
	joined := make(chan struct{})
	kc.ControlKey(kmsg.JoinGroup.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		select {
		case <-joined:
		default:
			close(joined)
		}
		return nil, nil, false
	})
	// Nothing listens on port 1: every connection attempt is refused.
	pool, err := pgxpool.New(context.Background(), "postgres://exactly@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	logs := newLogCapture()
	c, err := consumer.New(testConfig(testenv.Brokers(kc), "g", "credits"), pool, consumer.Handle(creditHandler(0)), consumer.WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-joined:
	case err := <-done:
		t.Fatalf("Run returned %v before joining the group; want it to consume while the database is down", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no join request in 30s")
	}
	if len(logs.matching("could not check the guard table")) == 0 {
		t.Error("no warning that the guard table could not be checked")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run after cancel = %v, want nil", err)
	}
}

// A Consumer whose brokers cannot be reached says so again while they stay
// unreachable, not once at start and then nothing (franz-go retries
// silently): the second report comes about a second after the first.
func TestConsumerReportsUnreachableBrokersAgain(t *testing.T) {
	logs := newLogCapture()
	pool := testenv.DB(t)
	setupLedger(t, pool)
	// Nothing listens on port 1: every connection attempt is refused.
	c, err := consumer.New(testConfig([]string{"127.0.0.1:1"}, "g", "credits"), pool, consumer.Handle(creditHandler(0)), consumer.WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	recs := logs.await(t, 30*time.Second, 2, "kafka broker unreachable")
	if gap := recs[1].Time.Sub(recs[0].Time); gap < 900*time.Millisecond {
		t.Errorf("second report %v after the first, want about a second (backoff)", gap)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run after cancel = %v, want nil", err)
	}
}
