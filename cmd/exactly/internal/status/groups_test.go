package status_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
)

const (
	liveGroup    = "live-readers"
	liveClientID = "status-live-member"
)

// joinLiveGroup starts a member of liveGroup that consumes scenarioTopic and
// commits nothing, and returns its client once the coordinator assigned it
// partitions.
func joinLiveGroup(t *testing.T, s *scenario) *kgo.Client {
	t.Helper()
	assigned := make(chan struct{})
	var once bool
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...), kgo.ConsumerGroup(liveGroup),
		kgo.ConsumeTopics(scenarioTopic), kgo.ClientID(liveClientID), kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
			if !once {
				once = true
				close(assigned)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for ctx.Err() == nil {
			cl.PollFetches(ctx)
		}
	}()
	t.Cleanup(func() { stop(); <-polled; cl.Close() })
	select {
	case <-assigned:
	case <-t.Context().Done():
		t.Fatal("the live group's member was never assigned partitions")
	}
	return cl
}

// TestGroupsStateMembersAndHeadlineLag: the scenario's group stopped
// (Empty, no members) and a live group (one member, nothing committed)
// reads the same topic. The report names each group's state and members,
// sums each group's lag, and counts only the live group's lag in the
// headline: the stopped group's lag is reported apart. The JSON carries
// the same.
func TestGroupsStateMembersAndHeadlineLag(t *testing.T) {
	s := newScenario(t)
	joinLiveGroup(t, s)
	cfg := s.cfg
	cfg.Groups = []string{scenarioGroup, liveGroup}
	r, err := status.Collect(t.Context(), cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Errors) > 0 {
		t.Fatalf("errors: %q", r.Errors)
	}
	groups := map[string]status.Group{}
	for _, g := range r.Groups {
		groups[g.Group] = g
	}
	const total = scenarioConsumed + scenarioLag
	stopped, live := groups[scenarioGroup], groups[liveGroup]
	if stopped.State != "Empty" || !stopped.Stopped || len(stopped.Members) != 0 || stopped.Lag != scenarioLag {
		t.Errorf("stopped group %+v; want Empty, stopped, no members, lag %d", stopped, scenarioLag)
	}
	if live.State != "Stable" || live.Stopped || len(live.Members) != 1 || live.Members[0].ClientID != liveClientID ||
		live.Members[0].Host == "" || live.Lag != total {
		t.Errorf("live group %+v; want Stable, one member %q with a host, lag %d", live, liveClientID, total)
	}
	if r.Lag != total || r.StoppedLag != scenarioLag {
		t.Errorf("headline lag %d, stopped lag %d; want %d (the live group only) and %d", r.Lag, r.StoppedLag, total, scenarioLag)
	}

	b, err := r.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var js struct {
		Lag        *int64 `json:"lag"`
		StoppedLag *int64 `json:"stopped_lag"`
		Groups     []struct {
			Group   string
			State   string
			Stopped bool
			Lag     *int64
			Members []struct {
				ClientID string `json:"client_id"`
				Host     string `json:"host"`
			}
		} `json:"groups"`
	}
	if err := json.Unmarshal(b, &js); err != nil {
		t.Fatal(err)
	}
	if js.Lag == nil || *js.Lag != total || js.StoppedLag == nil || *js.StoppedLag != scenarioLag || len(js.Groups) != 2 {
		t.Errorf("JSON lag %v stopped %v groups %d; want %d, %d, 2:\n%s", js.Lag, js.StoppedLag, len(js.Groups), total, scenarioLag, b)
	}
	for _, g := range js.Groups {
		if g.Group == liveGroup && (len(g.Members) != 1 || g.Members[0].ClientID != liveClientID || g.State != "Stable") {
			t.Errorf("JSON live group %+v", g)
		}
		if g.Group == scenarioGroup && (!g.Stopped || g.State != "Empty") {
			t.Errorf("JSON stopped group %+v", g)
		}
	}

	// The page shows the state, the member and the headline without the
	// stopped group.
	_, html := get(t, newPage(t, cfg), http.MethodGet, "/")
	for _, want := range []string{"<b>165</b><span>consumer lag", "<b>45</b><span>lag of stopped groups",
		"Empty (stopped", "<code>" + liveClientID + "</code>", "Stable"} {
		if !strings.Contains(html, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

// TestReportWithoutKafkaHasNullLag: with no Kafka client the lag is no
// data, null in the JSON, not 0.
func TestReportWithoutKafkaHasNullLag(t *testing.T) {
	s := newScenario(t)
	cfg := s.cfg
	cfg.Admin = nil
	r, err := status.Collect(t.Context(), cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.JSON()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"lag": null`) || !strings.Contains(string(b), `"stopped_lag": null`) {
		t.Errorf("JSON without Kafka lacks null lags:\n%s", b)
	}
}
