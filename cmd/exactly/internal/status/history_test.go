package status_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
)

// TestHistoryThroughputAndSparklines: between two samples the live group's
// member commits 10 more records on partition 0 and the stopped group's
// offset is moved on by 7. The second history point's throughput is the
// live group's 10 records over the time between the samples (the stopped
// group is left out), its lag the headline; the first point's throughput
// is unknown (null in JSON). The page draws the history as inline SVG and
// keeps its Content-Security-Policy.
func TestHistoryThroughputAndSparklines(t *testing.T) {
	s := newScenario(t)
	live := joinLiveGroup(t, s)
	commit := func(at int64) {
		t.Helper()
		var err error
		live.CommitOffsetsSync(t.Context(), map[string]map[int32]kgo.EpochOffset{scenarioTopic: {0: {Epoch: -1, Offset: at}}},
			func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, e error) {
				err = e
				for _, rt := range resp.Topics {
					for _, rp := range rt.Partitions {
						if err == nil {
							err = kerr.ErrorForCode(rp.ErrorCode)
						}
					}
				}
			})
		if err != nil {
			t.Fatalf("committing %d for the live group: %v", at, err)
		}
	}
	cfg := s.cfg
	cfg.Groups = []string{scenarioGroup, liveGroup}
	c, err := status.NewCollector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	commit(5)
	first := c.Collect(t.Context())
	if len(first.History) != 1 || first.History[0].Throughput != -1 {
		t.Fatalf("first history %+v; want one point with unknown throughput", first.History)
	}
	commit(15)
	stoppedAt, err := s.admin.FetchOffsets(t.Context(), scenarioGroup)
	if err != nil {
		t.Fatal(err)
	}
	var moved kadm.Offsets
	o, _ := stoppedAt.Lookup(scenarioTopic, 0)
	moved.Add(kadm.Offset{Topic: scenarioTopic, Partition: 0, At: o.At + 7, LeaderEpoch: -1})
	if _, err := s.admin.CommitOffsets(t.Context(), scenarioGroup, moved); err != nil {
		t.Fatalf("moving the stopped group's offset: %v", err)
	}
	r := c.Collect(t.Context())
	if len(r.History) != 2 {
		t.Fatalf("history of %d points, want 2", len(r.History))
	}
	p := r.History[1]
	if want := 10 / r.Interval.Seconds(); p.Throughput != want || p.Lag != r.Lag || p.Backlog != r.Outbox.Backlog {
		t.Errorf("second point %+v; want throughput %.2f (10 records over %v), lag %d, backlog %d",
			p, want, r.Interval, r.Lag, r.Outbox.Backlog)
	}

	b, err := r.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var js struct {
		History []struct {
			Throughput *float64 `json:"throughput"`
			Lag        *int64   `json:"lag"`
		} `json:"history"`
	}
	if err := json.Unmarshal(b, &js); err != nil {
		t.Fatal(err)
	}
	if len(js.History) != 2 || js.History[0].Throughput != nil || js.History[1].Throughput == nil || js.History[1].Lag == nil {
		t.Errorf("JSON history %s; want null throughput first, then figures", b)
	}

	page, err := status.NewPage(c, 5e9, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, html := get(t, page, http.MethodGet, "/")
	if csp := res.Header.Get("Content-Security-Policy"); csp != "default-src 'none'; style-src 'unsafe-inline'; img-src data:" {
		t.Errorf("CSP changed: %q", csp)
	}
	for _, want := range []string{"<h2>History (last 3 samples", `<svg class="spark"`, "<polyline", "throughput (records committed per second)"} {
		if !strings.Contains(html, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(html, "<script") {
		t.Error("page has a script")
	}
}

// With the page sampling in the background (Page.Sample, which Serve runs)
// the history grows by one point per refresh, whoever looks: twenty loads
// in a row add no point of their own, and with no load at all the history
// still grows.
func TestPageSamplesInTheBackground(t *testing.T) {
	s := newScenario(t)
	c, err := status.NewCollector(s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	page, err := status.NewPage(c, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	sampled := make(chan struct{})
	go func() { defer close(sampled); page.Sample(ctx) }()
	defer func() { cancel(); <-sampled }()

	history := func() int {
		_, body := get(t, page, http.MethodGet, "/status.json")
		var r status.Report
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatalf("/status.json: %v", err)
		}
		return len(r.History)
	}
	start := time.Now()
	before := history()
	for range 20 {
		history()
	}
	after := history()
	// At most one point per refresh (one second) passed, and one more for
	// a sample that was under way: never one per load.
	if limit := before + int(time.Since(start)/time.Second) + 1; after > limit {
		t.Errorf("history grew from %d to %d points over 22 loads in %v: samples follow the loads", before, after, time.Since(start))
	}
	deadline := time.Now().Add(30 * time.Second)
	for n := after; n < after+2; n = history() {
		if time.Now().After(deadline) {
			t.Fatalf("the history stayed at %d points for 30 s: nothing samples in the background", n)
		}
		time.Sleep(100 * time.Millisecond) // the sampler adds a point per second; reading adds none
	}
}
