package testenv

import (
	"fmt"
	"slices"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// GroupLog records, in the order the broker reads them, every
// OffsetCommit request a kfake cluster receives and every assignment a
// group leader hands out in SyncGroup, so that a test can check what each
// member committed against what it owned at that moment. It can also fence
// a member: answer its heartbeats with UNKNOWN_MEMBER_ID, as a broker does
// for a member it expelled, while the broker's own session of the member
// runs out. Build it with [RecordGroups].
type GroupLog struct {
	c *kfake.Cluster

	mu     sync.Mutex
	seq    int
	events []groupEvent
	fenced map[string]int // member ID → seq at which it was first told it is fenced; -1 armed, not yet told
	refuse map[string]int // member ID → its OffsetCommit requests refused so far
}

// A Commit is one partition of one OffsetCommit request, as the broker
// received it (it may have rejected it).
type Commit struct {
	Seq        int // position in the log
	Group      string
	MemberID   string
	Generation int32
	Topic      string
	Partition  int32
	Offset     int64
	// Refused is set when the log answered the request itself with
	// COORDINATOR_LOAD_IN_PROGRESS (see RefuseCommits): it changed nothing.
	Refused bool

	topicID [16]byte // v10+ requests name the topic by ID only
}

type groupEvent struct {
	seq    int
	commit *Commit
	// a leader's SyncGroup: the assignment of every member of generation
	sync       bool
	group      string
	generation int32
	assigned   map[string]map[string][]int32 // member → topic → partitions
}

// RecordGroups installs request controls on c that record into the
// returned log; they observe and let the broker handle every request,
// except the heartbeats of members fenced with [GroupLog.Fence].
func RecordGroups(c *kfake.Cluster) *GroupLog {
	l := &GroupLog{c: c, fenced: map[string]int{}}
	c.ControlKey(kmsg.OffsetCommit.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		oc := req.(*kmsg.OffsetCommitRequest)
		if !l.offsetCommit(oc) {
			return nil, nil, false
		}
		resp := oc.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, t := range oc.Topics {
			rt := kmsg.NewOffsetCommitResponseTopic()
			rt.Topic, rt.TopicID = t.Topic, t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewOffsetCommitResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, kerr.CoordinatorLoadInProgress.Code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp, nil, true
	})
	c.ControlKey(kmsg.SyncGroup.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		l.syncGroup(req.(*kmsg.SyncGroupRequest))
		return nil, nil, false
	})
	c.ControlKey(kmsg.Heartbeat.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		hb := req.(*kmsg.HeartbeatRequest)
		l.mu.Lock()
		defer l.mu.Unlock()
		at, ok := l.fenced[hb.MemberID]
		if !ok {
			return nil, nil, false
		}
		if at < 0 {
			l.seq++
			l.fenced[hb.MemberID] = l.seq
		}
		resp := hb.ResponseKind().(*kmsg.HeartbeatResponse)
		resp.ErrorCode = kerr.UnknownMemberID.Code
		return resp, nil, true
	})
	return l
}

// offsetCommit records req and reports whether to refuse it.
func (l *GroupLog) offsetCommit(req *kmsg.OffsetCommitRequest) (refused bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.refuse[req.MemberID]; ok {
		l.refuse[req.MemberID]++
		refused = true
	}
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			l.seq++
			l.events = append(l.events, groupEvent{seq: l.seq, commit: &Commit{
				Seq: l.seq, Group: req.Group, MemberID: req.MemberID, Generation: req.Generation,
				Topic: t.Topic, topicID: t.TopicID, Partition: p.Partition, Offset: p.Offset, Refused: refused,
			}})
		}
	}
	return refused
}

func (l *GroupLog) syncGroup(req *kmsg.SyncGroupRequest) {
	if len(req.GroupAssignment) == 0 {
		return // a follower's sync: the leader's carries every assignment
	}
	assigned := map[string]map[string][]int32{}
	for _, a := range req.GroupAssignment {
		var ma kmsg.ConsumerMemberAssignment
		if err := ma.ReadFrom(a.MemberAssignment); err != nil {
			continue // not a consumer group's assignment
		}
		m := map[string][]int32{}
		for _, t := range ma.Topics {
			m[t.Topic] = slices.Clone(t.Partitions)
		}
		assigned[a.MemberID] = m
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	l.events = append(l.events, groupEvent{seq: l.seq, sync: true, group: req.Group, generation: req.Generation, assigned: assigned})
}

// Fence makes the broker answer every later heartbeat of memberID with
// UNKNOWN_MEMBER_ID, without refreshing the member's session: the member
// learns it is out of the group at its next heartbeat, and the broker
// expels it when its session timeout passes.
func (l *GroupLog) Fence(memberID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.fenced[memberID]; !ok {
		l.fenced[memberID] = -1
	}
}

// RefuseCommits makes the broker answer every OffsetCommit request of
// memberID with the retriable COORDINATOR_LOAD_IN_PROGRESS, committing
// nothing, until the returned function is called. franz-go retries such a
// commit with backoff.
func (l *GroupLog) RefuseCommits(memberID string) (lift func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refuse == nil {
		l.refuse = map[string]int{}
	}
	l.refuse[memberID] = 0
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.refuse, memberID)
	}
}

// Refused returns how many OffsetCommit requests of memberID were refused
// since RefuseCommits.
func (l *GroupLog) Refused(memberID string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refuse[memberID]
}

// Told reports whether memberID was fenced and has been answered so.
func (l *GroupLog) Told(memberID string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fenced[memberID] > 0
}

// Commits returns the recorded commits of group, in the order received,
// with topic IDs resolved to names.
func (l *GroupLog) Commits(group string) []Commit {
	l.mu.Lock()
	var out []Commit
	for _, e := range l.events {
		if e.commit != nil && e.commit.Group == group {
			out = append(out, *e.commit)
		}
	}
	l.mu.Unlock()
	for i := range out {
		out[i].Topic = l.resolve(&out[i])
	}
	return out
}

// resolve returns c's topic name, looking it up by ID when the request
// named the topic by ID only.
func (l *GroupLog) resolve(c *Commit) string {
	if c.Topic != "" {
		return c.Topic
	}
	if ti := l.c.TopicIDInfo(c.topicID); ti != nil {
		return ti.Topic
	}
	return fmt.Sprintf("topic-id-%x", c.topicID)
}

// Violations checks group's recorded commits and returns one line for each
// that breaks the rule offsets trail ownership:
//   - a member committed a partition it did not own when the broker read
//     the request. The owner of a partition is the member the latest
//     leader's assignment gave it to; a partition the latest assignment
//     leaves unassigned (a cooperative rebalance moving it) stays with its
//     previous owner, who may commit it in its revoke callback;
//   - a fenced member committed anything after it was told it is fenced;
//   - a partition's committed offset moved backwards (among commits by its
//     owner).
//
// Requests refused with RefuseCommits changed nothing and are not checked.
func (l *GroupLog) Violations(group string) []string {
	l.mu.Lock()
	events := slices.Clone(l.events)
	fenced := map[string]int{}
	for m, at := range l.fenced {
		if at > 0 {
			fenced[m] = at
		}
	}
	l.mu.Unlock()

	type tp struct {
		topic string
		part  int32
	}
	owner := map[tp]string{}
	last := map[tp]int64{}
	var out []string
	for _, e := range events {
		if e.sync && e.group == group {
			for m, topics := range e.assigned {
				for t, ps := range topics {
					for _, p := range ps {
						owner[tp{t, p}] = m
					}
				}
			}
			continue
		}
		c := e.commit
		if c == nil || c.Group != group || c.Refused {
			continue
		}
		topic := l.resolve(c)
		k := tp{topic, c.Partition}
		if at, ok := fenced[c.MemberID]; ok && c.Seq > at {
			out = append(out, fmt.Sprintf("#%d: member %s committed %s/%d at %d (generation %d) after it was told it is fenced (#%d)",
				c.Seq, c.MemberID, topic, c.Partition, c.Offset, c.Generation, at))
			continue
		}
		if o, ok := owner[k]; !ok || o != c.MemberID {
			out = append(out, fmt.Sprintf("#%d: member %s committed %s/%d at %d (generation %d), owned by %q",
				c.Seq, c.MemberID, topic, c.Partition, c.Offset, c.Generation, o))
			continue
		}
		if prev, ok := last[k]; ok && c.Offset < prev {
			out = append(out, fmt.Sprintf("#%d: member %s moved %s/%d back from %d to %d",
				c.Seq, c.MemberID, topic, c.Partition, prev, c.Offset))
		}
		last[k] = max(last[k], c.Offset)
	}
	return out
}

// MemberOf returns the ID of the member of group whose client ID is
// clientID, or "" when there is none (or more than one).
func MemberOf(c *kfake.Cluster, group, clientID string) string {
	gi := c.GroupInfo(group)
	if gi == nil {
		return ""
	}
	var id string
	for _, m := range gi.Members {
		if m.ClientID == clientID {
			if id != "" {
				return ""
			}
			id = m.MemberID
		}
	}
	return id
}

// RefuseProduce returns the broker's answer to req that refuses every
// partition of every topic with the error code code returns for the topic,
// for a kfake ControlKey function that fails produce requests.
func RefuseProduce(req *kmsg.ProduceRequest, code func(kmsg.ProduceRequestTopic) int16) kmsg.Response {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		c := code(rt)
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition, sp.ErrorCode = rp.Partition, c
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}
