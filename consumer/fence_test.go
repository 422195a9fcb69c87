package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
)

// fenceConfig is a member of group with short session and heartbeat
// settings, so that the broker expels a silent member in about a second.
func fenceConfig(brokers []string, group, clientID string) consumer.Config {
	cfg := testConfig(brokers, group, "credits")
	cfg.ClientID = clientID
	cfg.SessionTimeout = time.Second
	cfg.RebalanceTimeout = 3 * time.Second
	cfg.CommitInterval = 20 * time.Millisecond
	return cfg
}

// fenceKafka starts a broker whose groups accept one-second sessions.
func fenceKafka(t *testing.T, partitions int32) *kfake.Cluster {
	return testenv.KafkaWith(t, []kfake.Opt{kfake.GroupMinSessionTimeout(time.Second)}, partitions, "credits")
}

// fastHeartbeats makes the member heartbeat well within its one-second
// session.
func fastHeartbeats() consumer.Option {
	return consumer.WithKafkaOptions(kgo.HeartbeatInterval(100 * time.Millisecond))
}

// awaitGroup waits until group is stable and ok holds for it.
func awaitGroup(t *testing.T, kc *kfake.Cluster, group, what string, ok func(*kfake.GroupInfo) bool) *kfake.GroupInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gi, err := kc.WaitGroupInfo(ctx, group, func(g *kfake.GroupInfo) bool {
		return g != nil && g.State == "Stable" && ok(g)
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v (group: %+v)", what, err, gi)
	}
	return gi
}

// assignedTo returns the partitions of topic the member with clientID owns
// in gi.
func assignedTo(gi *kfake.GroupInfo, clientID, topic string) []int32 {
	for _, m := range gi.Members {
		if m.ClientID == clientID {
			return m.Assignment[topic]
		}
	}
	return nil
}

// produceTo sends credits order-<from>..order-<to-1> to partition p.
func produceTo(t *testing.T, brokers []string, p int32, from, to int) {
	t.Helper()
	var recs []*kgo.Record
	for i := from; i < to; i++ {
		v, _ := json.Marshal(credit{OrderID: fmt.Sprintf("order-%d", i), Account: int64(i % 10), Amount: 100})
		recs = append(recs, &kgo.Record{Topic: "credits", Partition: p, Value: v})
	}
	produceManual(t, brokers, recs...)
}

// awaitCommitted waits until the group's committed offsets, read from the
// broker, reach every partition's end: the group committed everything.
func awaitCommitted(t *testing.T, brokers []string, group string) {
	t.Helper()
	adm := kadm.NewClient(mustClient(t, brokers))
	defer adm.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ends, err1 := adm.ListEndOffsets(ctx, "credits")
		offs, err2 := adm.FetchOffsets(ctx, group)
		cancel()
		behind := ""
		if err1 != nil || err2 != nil {
			behind = fmt.Sprint(err1, err2)
		} else {
			ends.Each(func(e kadm.ListedOffset) {
				if o, ok := offs.Lookup(e.Topic, e.Partition); e.Offset > 0 && (!ok || o.At < e.Offset) {
					behind += fmt.Sprintf(" %d: committed %d of %d;", e.Partition, o.At, e.Offset)
				}
			})
		}
		if behind == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s did not commit every partition's end:%s", group, behind)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkLedgerOnce fails t unless the ledger holds orders order-0 ..
// order-<n-1>, each once, and each partition's rows in offset order with no
// gap.
func checkLedgerOnce(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	var rows, distinct, gaps int
	if err := pool.QueryRow(context.Background(), `select count(*), count(distinct order_id) from ledger`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != n || distinct != n {
		t.Errorf("ledger: %d rows, %d distinct orders; want %d of each (a record lost or applied twice)", rows, distinct, n)
	}
	if err := pool.QueryRow(context.Background(), `select count(*) from (
		select off, lag(off) over (partition by part order by id) as prev from ledger) x
		where prev is not null and off <> prev + 1`).Scan(&gaps); err != nil {
		t.Fatal(err)
	}
	if gaps != 0 {
		t.Errorf("ledger: %d records applied out of offset order or after a gap", gaps)
	}
}

// checkViolations fails t with every commit the broker received that broke
// the ownership rules (see testenv.GroupLog.Violations).
func checkViolations(t *testing.T, log *testenv.GroupLog, group string) {
	t.Helper()
	if v := log.Violations(group); len(v) > 0 {
		t.Errorf("%d offset commits broke the ownership rules:\n%s", len(v), strings.Join(v, "\n"))
	}
	if len(log.Commits(group)) == 0 {
		t.Errorf("the broker received no offset commit from group %s", group)
	}
}

// A member that the broker fences while it shuts down (its heartbeats are
// answered UNKNOWN_MEMBER_ID while a transaction is in flight) commits no
// offset once it is told, neither for the marks it had nor for the batch
// that finished during the shutdown: the partitions are the next owner's,
// who applies what was left, and every offset the broker ever received was
// committed by the member owning the partition, never moving backwards.
func TestFencedMemberCommitsNothingItLostAtShutdown(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	const group = "fence"
	kc := fenceKafka(t, 4)
	log := testenv.RecordGroups(kc)
	brokers := testenv.Brokers(kc)

	// The victim commits offsets only at revoke and shutdown, so it holds
	// marks it never committed when it is fenced; its handler can be held
	// inside a transaction.
	var hold atomic.Bool
	inside, release := make(chan struct{}, 1), make(chan struct{})
	gated := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			if hold.Load() {
				select {
				case inside <- struct{}{}:
				default:
				}
				<-release
			}
			_, err := tx.Exec(ctx, `insert into ledger(order_id, account, amount, topic, part, off) values($1,$2,$3,$4,$5,$6)`,
				msg.Value.OrderID, msg.Value.Account, msg.Value.Amount, msg.Record.Topic, msg.Record.Partition, msg.Record.Offset)
			return err
		})
	o := newOutcomes()
	victimCfg := fenceConfig(brokers, group, "victim")
	victimCfg.CommitInterval = time.Hour
	stopVictim := startConsumer(t, victimCfg, pool, consumer.Handle(gated), consumer.WithHooks(o.hooks()), fastHeartbeats())
	awaitGroup(t, kc, group, "the victim alone", func(g *kfake.GroupInfo) bool { return g.NumAssigned() == 4 })
	startConsumer(t, fenceConfig(brokers, group, "healthy"), pool, consumer.Handle(creditHandler(0)),
		consumer.WithHooks(o.hooks()), fastHeartbeats())
	gi := awaitGroup(t, kc, group, "two members with two partitions each", func(g *kfake.GroupInfo) bool {
		return len(g.Members) == 2 && len(assignedTo(g, "victim", "credits")) == 2 && len(assignedTo(g, "healthy", "credits")) == 2
	})
	victimID, victimParts := testenv.MemberOf(kc, group, "victim"), assignedTo(gi, "victim", "credits")

	// Records on every partition, all applied: the victim holds marks
	// for its two partitions.
	const per = 10
	for p := int32(0); p < 4; p++ {
		produceTo(t, brokers, p, int(p)*per, int(p+1)*per)
	}
	o.await(t, 30*time.Second, "every record applied", func() bool { return o.get("applied") == 4*per })

	// One more record on a victim partition, held inside its transaction;
	// the victim shuts down meanwhile and is fenced.
	hold.Store(true)
	produceTo(t, brokers, victimParts[0], 4*per, 4*per+1)
	select {
	case <-inside:
	case <-time.After(30 * time.Second):
		t.Fatal("the victim did not start the last record's transaction")
	}
	victimDone := make(chan struct{})
	go func() { defer close(victimDone); stopVictim() }()
	log.Fence(victimID)
	o.await(t, 30*time.Second, "the victim to be told it is fenced", func() bool { return log.Told(victimID) })
	hold.Store(false)
	close(release)
	select {
	case <-victimDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the fenced victim did not shut down")
	}

	// The healthy member gets every partition and finishes the work.
	awaitGroup(t, kc, group, "the healthy member alone", func(g *kfake.GroupInfo) bool {
		return len(g.Members) == 1 && len(assignedTo(g, "healthy", "credits")) == 4
	})
	awaitCommitted(t, brokers, group)
	checkLedgerOnce(t, pool, 4*per+1)
	for _, c := range log.Commits(group) {
		if c.MemberID == victimID {
			t.Errorf("the victim committed %s/%d at %d (generation %d); it never committed while it owned the partitions, so any commit is one after its loss",
				c.Topic, c.Partition, c.Offset, c.Generation)
		}
	}
	checkViolations(t, log, group)
	o.checkCommitsTrail(t)
}

// A partition moves from its first member to a second one that joins, and
// back when the second leaves, twice (join, leave, join, leave): after each
// hand-back the first member processes the partition again from where the
// second left it, so records produced at every stage are applied once each,
// in offset order, with no gap, and every commit the broker receives comes
// from the partition's owner and never moves backwards.
func TestPartitionHandedBackResumesOnFirstMember(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	const group, per = "handback", 10
	kc := fenceKafka(t, 2)
	log := testenv.RecordGroups(kc)
	brokers := testenv.Brokers(kc)
	o := newOutcomes()
	member := func(clientID string) (stop func()) {
		return startConsumer(t, fenceConfig(brokers, group, clientID), pool, consumer.Handle(creditHandler(0)),
			consumer.WithHooks(o.hooks()), fastHeartbeats())
	}
	next := 0
	stage := func(what string) {
		t.Helper()
		for p := int32(0); p < 2; p++ {
			produceTo(t, brokers, p, next, next+per)
			next += per
		}
		o.await(t, 30*time.Second, "the records produced "+what, func() bool { return o.get("applied") == next })
	}
	firstOwnsAll := func(g *kfake.GroupInfo) bool {
		return len(g.Members) == 1 && len(assignedTo(g, "first", "credits")) == 2
	}
	oneEach := func(g *kfake.GroupInfo) bool {
		return len(g.Members) == 2 && len(assignedTo(g, "first", "credits")) == 1 && len(assignedTo(g, "second", "credits")) == 1
	}

	member("first")
	awaitGroup(t, kc, group, "the first member alone", firstOwnsAll)
	stage("with the first member alone")
	for round := 1; round <= 2; round++ {
		stopSecond := member("second")
		gi := awaitGroup(t, kc, group, "a partition moved to the second member", oneEach)
		moved := assignedTo(gi, "second", "credits")[0]
		stage(fmt.Sprintf("with partition %d on the second member (round %d)", moved, round))
		stopSecond()
		awaitGroup(t, kc, group, fmt.Sprintf("partition %d back on the first member", moved), firstOwnsAll)
		stage(fmt.Sprintf("after partition %d came back to the first member (round %d)", moved, round))
	}

	awaitCommitted(t, brokers, group)
	if a := o.get("applied"); a != next {
		t.Errorf("applied = %d, want %d", a, next)
	}
	checkLedgerOnce(t, pool, next)
	checkViolations(t, log, group)
	o.checkCommitsTrail(t)
}

// While the group coordinator refuses offset commits (a retriable
// COORDINATOR_LOAD_IN_PROGRESS, which franz-go retries with backoff), a second
// member joins: the first member's revoke cancels its periodic commit stuck
// in those retries instead of waiting for it, so the rebalance goes on at
// once; once the coordinator accepts commits again, everything is applied
// once and committed by its owner.
func TestRevokeCancelsAPeriodicCommitInProgress(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	const group, per = "revoke-cancel", 10
	kc := fenceKafka(t, 2)
	log := testenv.RecordGroups(kc)
	brokers := testenv.Brokers(kc)
	o := newOutcomes()
	revoked := make(chan struct{})
	var once sync.Once
	hooks := o.hooks()
	hooks.OnRevoke = func(context.Context, consumer.RevokeData) { once.Do(func() { close(revoked) }) }
	startConsumer(t, fenceConfig(brokers, group, "first"), pool, consumer.Handle(creditHandler(0)),
		consumer.WithHooks(hooks), fastHeartbeats())
	awaitGroup(t, kc, group, "the first member alone", func(g *kfake.GroupInfo) bool { return g.NumAssigned() == 2 })
	produceTo(t, brokers, 0, 0, per)
	produceTo(t, brokers, 1, per, 2*per)
	o.await(t, 30*time.Second, "the first records applied", func() bool { return o.get("applied") == 2*per })
	awaitCommitted(t, brokers, group)

	refuse := kc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: kerr.CoordinatorLoadInProgress, Count: -1})
	t.Cleanup(refuse.Remove)
	produceTo(t, brokers, 0, 2*per, 2*per+1)
	produceTo(t, brokers, 1, 2*per+1, 2*per+2)
	o.await(t, 30*time.Second, "the last records applied", func() bool { return o.get("applied") == 2*per+2 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := refuse.Wait(ctx, 2); err != nil {
		t.Fatalf("the periodic commit did not retry against the refusing coordinator: %v", err)
	}

	start := time.Now()
	startConsumer(t, fenceConfig(brokers, group, "second"), pool, consumer.Handle(creditHandler(0)),
		consumer.WithHooks(o.hooks()), fastHeartbeats())
	select {
	case <-revoked:
		t.Logf("revoke reached its commit %v after the second member started", time.Since(start).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatalf("the revoke did not get past the periodic commit stuck in retries within 10s")
	}
	refuse.Remove()
	awaitGroup(t, kc, group, "one partition each", func(g *kfake.GroupInfo) bool {
		return len(g.Members) == 2 && len(assignedTo(g, "first", "credits")) == 1 && len(assignedTo(g, "second", "credits")) == 1
	})
	awaitCommitted(t, brokers, group)
	checkLedgerOnce(t, pool, 2*per+2)
	checkViolations(t, log, group)
	o.checkCommitsTrail(t)
}

// A member's final offset commit at shutdown is stuck in retries (the
// coordinator refuses it with the retriable COORDINATOR_LOAD_IN_PROGRESS)
// when the broker fences the member: the loss cancels the stuck commit, so the member shuts down at
// once and never sends those marks again, even once the coordinator would
// accept them; the other member applies and commits everything.
func TestLossCancelsAStuckShutdownCommit(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	const group, per = "fence-final", 10
	kc := fenceKafka(t, 2)
	log := testenv.RecordGroups(kc)
	brokers := testenv.Brokers(kc)
	o := newOutcomes()
	victimCfg := fenceConfig(brokers, group, "victim")
	victimCfg.CommitInterval = time.Hour // its marks wait for the final commit
	// The final commit may take up to the rebalance timeout, and franz-go
	// retries a refused commit for up to 30 s rather than 20 times (about
	// 3 s): a final commit the loss does not cancel outlives the test's
	// patience.
	victimCfg.RebalanceTimeout = 25 * time.Second
	stopVictim := startConsumer(t, victimCfg, pool, consumer.Handle(creditHandler(0)), consumer.WithHooks(o.hooks()),
		fastHeartbeats(), consumer.WithKafkaOptions(kgo.RequestRetries(1000)))
	awaitGroup(t, kc, group, "the victim alone", func(g *kfake.GroupInfo) bool { return g.NumAssigned() == 2 })
	startConsumer(t, fenceConfig(brokers, group, "healthy"), pool, consumer.Handle(creditHandler(0)),
		consumer.WithHooks(o.hooks()), fastHeartbeats())
	awaitGroup(t, kc, group, "one partition each", func(g *kfake.GroupInfo) bool {
		return len(g.Members) == 2 && len(assignedTo(g, "victim", "credits")) == 1 && len(assignedTo(g, "healthy", "credits")) == 1
	})
	victimID := testenv.MemberOf(kc, group, "victim")
	produceTo(t, brokers, 0, 0, per)
	produceTo(t, brokers, 1, per, 2*per)
	o.await(t, 30*time.Second, "every record applied", func() bool { return o.get("applied") == 2*per })

	lift := log.RefuseCommits(victimID)
	t.Cleanup(lift)
	victimDone := make(chan struct{})
	go func() { defer close(victimDone); stopVictim() }()
	o.await(t, 30*time.Second, "the final commit to be refused and retried", func() bool { return log.Refused(victimID) >= 2 })
	log.Fence(victimID)
	o.await(t, 30*time.Second, "the victim to be told it is fenced", func() bool { return log.Told(victimID) })
	select {
	case <-victimDone:
	case <-time.After(10 * time.Second):
		t.Errorf("the fenced victim did not shut down within 10s: its loss did not cancel the stuck final commit")
	}
	lift()
	<-victimDone

	awaitGroup(t, kc, group, "the healthy member alone", func(g *kfake.GroupInfo) bool {
		return len(g.Members) == 1 && len(assignedTo(g, "healthy", "credits")) == 2
	})
	awaitCommitted(t, brokers, group)
	checkLedgerOnce(t, pool, 2*per)
	for _, c := range log.Commits(group) {
		if c.MemberID == victimID && !c.Refused {
			t.Errorf("the victim committed %s/%d at %d (generation %d) after its final commit was refused", c.Topic, c.Partition, c.Offset, c.Generation)
		}
	}
	checkViolations(t, log, group)
	o.checkCommitsTrail(t)
}
