package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The log accepts a commit by the partition's owner and flags one by a
// client that does not own it, and tells a fenced member so.
func TestGroupLogChecksOwnership(t *testing.T) {
	kc := Kafka(t, 1, "events")
	log := RecordGroups(kc)
	brokers := Brokers(kc)
	Produce(t, brokers, &kgo.Record{Topic: "events", Value: []byte("a")}, &kgo.Record{Topic: "events", Value: []byte("b")})

	member, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("events"),
		kgo.ClientID("owner"), kgo.DisableAutoCommit(), kgo.HeartbeatInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer member.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var got int
	for got < 2 {
		fs := member.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of 2 records", got)
		}
		got += len(fs.Records())
	}
	if err := member.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatal(err)
	}
	if v := log.Violations("g"); len(v) != 0 {
		t.Fatalf("the owner's commit flagged: %v", v)
	}
	owner := MemberOf(kc, "g", "owner")
	if owner == "" {
		t.Fatal("no member with client id owner")
	}

	// A client outside the group commits the partition (moving it back):
	// the broker refuses it, the log flags it.
	adm := kadm.NewClient(member)
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: "events", Partition: 0, At: 0, LeaderEpoch: -1})
	_, _ = adm.CommitOffsets(ctx, "g", offs)
	v := log.Violations("g")
	if len(v) != 1 || !strings.Contains(v[0], "owned by \""+owner+"\"") {
		t.Errorf("violations %q, want one: a commit of events/0 by a client other than its owner %s", v, owner)
	}
	if cs := log.Commits("g"); len(cs) != 2 || cs[0].Topic != "events" || cs[0].Offset != 2 || cs[0].MemberID != owner {
		t.Errorf("commits %+v, want the owner's at 2, then the outsider's", cs)
	}

	log.Fence(owner)
	deadline := time.Now().Add(10 * time.Second)
	for !log.Told(owner) {
		if time.Now().After(deadline) {
			t.Fatal("the fenced member's heartbeat was not answered within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
