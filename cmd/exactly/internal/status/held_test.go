package status_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// TestHeldRecordAndPausedPartitionAreReported runs a consumer (key
// concurrency, MaxOffsetGap 5) whose handler keeps failing the record of
// order-0 at offset 0 while the 10 records after it apply as far as the
// gap lets them. The report lists the held record (group, partition,
// offset, key, handler, attempts, last error, retry time) and the paused
// partition; the paused partition is a problem, the record held for
// seconds is not, until it has been held longer than HeldProblemAfter.
// The JSON and the page show them; Inspect of the key, as a guard key and
// as a Kafka key, shows the held state.
func TestHeldRecordAndPausedPartitionAreReported(t *testing.T) {
	ctx := t.Context()
	pool := testenv.DB(t)
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	brokers := testenv.Brokers(testenv.Kafka(t, 1, scenarioTopic))
	var recs []*kgo.Record
	for i := range 11 {
		v, _ := json.Marshal(order{ID: fmt.Sprintf("order-%d", i)})
		recs = append(recs, &kgo.Record{Topic: scenarioTopic, Key: []byte(fmt.Sprintf("order-%d", i)), Value: v})
	}
	testenv.Produce(t, brokers, recs...)
	h := handler.New(scenarioHandler,
		handler.FromPayload(func(o order) string { return dedupe.Key("order", o.ID) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[order]) error {
			if msg.Value.ID == "order-0" {
				return errors.New("payment service unavailable")
			}
			return nil
		})
	cfg := consumer.DefaultConfig()
	cfg.Brokers, cfg.Group, cfg.Topics = brokers, scenarioGroup, []string{scenarioTopic}
	cfg.MaxOffsetGap = 5
	cfg.RetryBackoff, cfg.RetryBackoffMax = 20*time.Millisecond, 500*time.Millisecond
	c, err := consumer.New(cfg, pool, consumer.Handle(h), consumer.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	}()

	scfg := status.Config{Pool: pool, Database: pool.Config().ConnString()}
	var r *status.Report
	deadline := time.Now().Add(60 * time.Second)
	for {
		if r, err = status.Collect(ctx, scfg, 0); err != nil {
			t.Fatal(err)
		}
		if len(r.Held.Records) == 1 && r.Held.Records[0].Attempts >= 2 && len(r.Held.Paused) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no held record with 2 attempts and paused partition reported: %+v", r.Held)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !r.Held.Known || r.Held.Total != 1 || r.Held.Stuck != 0 {
		t.Errorf("held %+v: want known, 1 record, none stuck", r.Held)
	}
	x := r.Held.Records[0]
	if x.Group != scenarioGroup || x.Topic != scenarioTopic || x.Partition != 0 || x.Offset != 0 || x.Handler != scenarioHandler ||
		x.KeyText() != "order:order-0" || x.Scope == nil || *x.Scope != scenarioHandler || x.LastError != "payment service unavailable" ||
		x.RetryIn > time.Second || x.HeldFor < 0 || x.Stuck {
		t.Errorf("held record %+v (key %s)", x, x.KeyText())
	}
	p := r.Held.Paused[0]
	if p.Group != scenarioGroup || p.Topic != scenarioTopic || p.Partition != 0 || p.Reason != "offset_gap" || p.LowestUnfinished != 0 || p.Handler != scenarioHandler {
		t.Errorf("paused partition %+v", p)
	}
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], `partition "orders"/0 of "order-service" paused`) {
		t.Errorf("problems %q: want the paused partition alone (a record held for seconds is no problem)", r.Problems)
	}

	b, err := r.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var j struct {
		Held struct {
			Records []struct {
				Key       *string `json:"key"`
				Attempts  int     `json:"attempts"`
				LastError string  `json:"last_error"`
				RetryIn   *int64  `json:"retry_in_ns"`
			} `json:"records"`
			Paused []struct {
				Reason string `json:"reason"`
			} `json:"paused"`
		} `json:"held"`
	}
	if err := json.Unmarshal(b, &j); err != nil || len(j.Held.Records) != 1 || j.Held.Records[0].Key == nil || *j.Held.Records[0].Key != "order:order-0" ||
		j.Held.Records[0].Attempts < 2 || j.Held.Records[0].LastError != "payment service unavailable" || j.Held.Records[0].RetryIn == nil ||
		len(j.Held.Paused) != 1 || j.Held.Paused[0].Reason != "offset_gap" {
		t.Errorf("JSON held %+v (%v):\n%s", j.Held, err, b)
	}

	res, body := get(t, newPage(t, scfg), http.MethodGet, "/")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("page: %s", res.Status)
	}
	for _, want := range []string{"<h2>Held records</h2>", "<code>order:order-0</code>", "payment service unavailable", "<h3>Paused partitions</h3>", "offset_gap"} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}

	for _, key := range []string{"order:order-0", "order-0"} {
		rep, err := status.Inspect(ctx, scfg, key, status.InspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.HeldKnown || len(rep.Held) != 1 || rep.Held[0].Offset != 0 || rep.Held[0].Attempts < 2 ||
			rep.Held[0].LastError != "payment service unavailable" || rep.Held[0].RetryIn > time.Second {
			t.Errorf("inspect %q: held %+v", key, rep.Held)
		}
	}
	if rep, err := status.Inspect(ctx, scfg, "order-1", status.InspectOptions{}); err != nil || len(rep.Held) != 0 {
		t.Errorf("inspect order-1 (applied): held %+v, %v; want none", rep.Held, err)
	}

	// Held for longer than HeldProblemAfter: a problem that names it.
	if _, err := pool.Exec(ctx, `update exactly_guard_held set held_since = now() - interval '10 minutes'`); err != nil {
		t.Fatal(err)
	}
	if r, err = status.Collect(ctx, scfg, 0); err != nil {
		t.Fatal(err)
	}
	if r.Held.Stuck != 1 || !r.Held.Records[0].Stuck || len(r.Problems) != 2 ||
		!strings.Contains(r.Problems[1], "1 record held longer than 5m0s") || !strings.Contains(r.Problems[1], "order:order-0") {
		t.Errorf("after 10 minutes held: stuck %d, problems %q", r.Held.Stuck, r.Problems)
	}
}

// TestHeldWithoutItsTablesIsUnknownNotAProblem: a database migrated before
// the held tables existed reports Held.Known false, nothing held, and no
// problem or error.
func TestHeldWithoutItsTablesIsUnknownNotAProblem(t *testing.T) {
	ctx := t.Context()
	pool := testenv.DB(t)
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `drop table exactly_guard_held, exactly_guard_paused`); err != nil {
		t.Fatal(err)
	}
	r, err := status.Collect(ctx, status.Config{Pool: pool}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Held.Known || len(r.Held.Records) != 0 || len(r.Problems) != 0 || len(r.Errors) != 0 {
		t.Errorf("held %+v, problems %q, errors %q: want unknown and no problem", r.Held, r.Problems, r.Errors)
	}
}
