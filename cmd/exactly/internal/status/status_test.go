package status_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
	"github.com/exactly-go/exactly/internal/testenv"
)

// TestCollectReportsWhatTheConsumerLeft checks every figure of the report
// against what the scenario did: lag per partition from kadm, the outbox
// backlog the consumer's handler left, guard rows, dead-letter size and the
// duplicate ratio from the outcome counters.
func TestCollectReportsWhatTheConsumerLeft(t *testing.T) {
	s := newScenario(t)
	r, err := status.Collect(t.Context(), s.cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Errors) > 0 {
		t.Fatalf("errors: %q", r.Errors)
	}
	var committed, end, lag int64
	for _, p := range r.Partitions {
		if p.Group != scenarioGroup || p.Topic != scenarioTopic {
			t.Errorf("unexpected partition %+v", p)
		}
		if p.Lag != p.End-max(p.Committed, 0) {
			t.Errorf("%s/%d: lag %d != end %d - committed %d", p.Topic, p.Partition, p.Lag, p.End, p.Committed)
		}
		committed += max(p.Committed, 0)
		end += p.End
		lag += p.Lag
	}
	if len(r.Partitions) != 3 || committed != scenarioConsumed || end != scenarioConsumed+scenarioLag || lag != scenarioLag {
		t.Errorf("partitions %d, committed %d, end %d, lag %d; want 3, %d, %d, %d",
			len(r.Partitions), committed, end, lag, scenarioConsumed, scenarioConsumed+scenarioLag, scenarioLag)
	}
	if r.Outbox.Backlog != scenarioUnique || r.Outbox.Oldest <= 0 || len(r.Outbox.Rows) != status.DefaultRows {
		t.Errorf("outbox backlog %d oldest %v rows %d; want %d, > 0, %d", r.Outbox.Backlog, r.Outbox.Oldest, len(r.Outbox.Rows), scenarioUnique, status.DefaultRows)
	}
	if row := r.Outbox.Rows[0]; row.Topic != scenarioOutboxTop || row.Headers["source"] != "status-test" || row.Parked {
		t.Errorf("first outbox row %+v", row)
	}
	if r.Guard.Rows != scenarioUnique || r.Guard.Oldest <= 0 || r.Guard.Violated {
		t.Errorf("guard %+v; want %d rows, an age, within retention", r.Guard, scenarioUnique)
	}
	if len(r.DeadLetters) != 1 || r.DeadLetters[0].Topic != scenarioTopic+".dlq" || r.DeadLetters[0].Records != scenarioDLQ {
		t.Errorf("dead letters %+v; want %s.dlq with %d", r.DeadLetters, scenarioTopic, scenarioDLQ)
	}
	dups := int64(scenarioConsumed - scenarioUnique)
	if len(r.Outcomes) != 1 || r.Outcomes[0].Scope != scenarioHandler || r.Outcomes[0].Applied != scenarioUnique ||
		r.Outcomes[0].Duplicate != dups || r.Outcomes[0].Ratio != float64(dups)/scenarioConsumed {
		t.Errorf("outcomes %+v; want scope %s applied %d duplicate %d", r.Outcomes, scenarioHandler, scenarioUnique, dups)
	}
	// The scenario's group stopped with lag: nothing consumes it, the one
	// problem, saying what to do.
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], `group "order-service" has 45 records of lag and no members`) ||
		!strings.Contains(r.Problems[0], "-> do: start the group's service") ||
		!strings.Contains(r.Problems[0], "docs/operations.md#exactlygrouplagnomembers") {
		t.Errorf("problems %q, want one: the group's lag with no members, with what to do", r.Problems)
	}
}

// TestGroupWithLagAndNoMembersNeedsAHuman: a group with no members (Empty)
// and lag needs a human at the first sample, whether or not records arrive
// meanwhile, and its partitions are never "stalled" (that is for groups
// with members); once its lag is 0 it is quiet.
func TestGroupWithLagAndNoMembersNeedsAHuman(t *testing.T) {
	s := newScenario(t)
	c, err := status.NewCollector(s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if i == 1 {
			testenv.Produce(t, s.brokers, &kgo.Record{Topic: scenarioTopic, Partition: 0, Value: []byte(`{"id":"late"}`)})
		}
		r := c.Collect(t.Context())
		want := fmt.Sprintf(`group "order-service" has %d records of lag and no members`, scenarioLag+min(i, 1))
		if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], want) {
			t.Errorf("sample %d: problems %q, want one saying %q", i, r.Problems, want)
		}
		for _, p := range r.Partitions {
			if p.Stalled {
				t.Errorf("sample %d: partition %d of a group without members marked stalled", i, p.Partition)
			}
		}
	}
}

// TestRetentionViolatedNeedsAHuman holds the guard's oldest row against a
// retention it exceeds.
func TestRetentionViolatedNeedsAHuman(t *testing.T) {
	s := newScenario(t)
	cfg := s.cfg
	cfg.Retention, cfg.RetentionGrace = time.Nanosecond, time.Nanosecond
	r, err := status.Collect(t.Context(), cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ps := apartFromStoppedGroup(r.Problems); !r.Guard.Violated || len(ps) != 1 || !strings.Contains(ps[0], "retention") {
		t.Errorf("guard %+v problems %q; want retention violated", r.Guard, r.Problems)
	}
}

// TestRecentDuplicateRatio compares the outcome counters of two samples.
func TestRecentDuplicateRatio(t *testing.T) {
	s := newScenario(t)
	c, err := status.NewCollector(s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	first := c.Collect(t.Context())
	if first.Outcomes[0].Recent != -1 {
		t.Errorf("first sample has a recent ratio %v; want -1 (nothing to compare)", first.Outcomes[0].Recent)
	}
	// Three more deliveries counted: one applied, two duplicates.
	if _, err := s.pool.Exec(t.Context(), `update exactly_guard_outcomes set applied = applied + 1, duplicate = duplicate + 2
		where ctid = (select ctid from exactly_guard_outcomes limit 1)`); err != nil {
		t.Fatal(err)
	}
	r := c.Collect(t.Context())
	if got := r.Outcomes[0].Recent; got < 0.666 || got > 0.667 {
		t.Errorf("recent duplicate ratio %v; want 2/3", got)
	}
}

// TestParkedRowsNeedAHuman marks an outbox row parked. The parked column
// comes from the relay's outbox migration 0002; until that is on this
// branch the test adds the column (if not exists) itself.
func TestParkedRowsNeedAHuman(t *testing.T) {
	s := newScenario(t)
	if _, err := s.pool.Exec(t.Context(), `alter table exactly_outbox add column if not exists parked_at timestamptz`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(t.Context(), `update exactly_outbox set parked_at = now() where id = (select max(id) from exactly_outbox)`); err != nil {
		t.Fatal(err)
	}
	r, err := status.Collect(t.Context(), s.cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Outbox.ParkedKnown || r.Outbox.Parked != 1 || r.Outbox.Backlog != scenarioUnique-1 || !r.Outbox.Rows[0].Parked {
		t.Errorf("outbox %+v; want 1 parked (listed first), %d pending", r.Outbox, scenarioUnique-1)
	}
	if ps := apartFromStoppedGroup(r.Problems); len(ps) != 1 || !strings.Contains(ps[0], "1 parked") {
		t.Errorf("problems %q; want the parked row", r.Problems)
	}
}
