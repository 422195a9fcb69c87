package bench

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/workload"
	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// groupRun counts one group's outcomes and notes which member last applied
// each partition, each member's first outcome, and each partition's first
// outcome (by a member other than left) after mark.
type groupRun struct {
	mu      sync.Mutex
	first   time.Time
	last    time.Time
	applied int
	owner   map[int32]int       // partition → member that last applied it
	after   map[int32]time.Time // partition → first outcome after mark
	mark    time.Time           // when member left left
	left    int
	firstBy map[int]time.Time // member → its first outcome
}

func newGroupRun() *groupRun {
	return &groupRun{left: -1, firstBy: map[int]time.Time{}, owner: map[int32]int{}, after: map[int32]time.Time{}}
}

func (g *groupRun) hook(member int) consumer.Hooks {
	return consumer.Hooks{OnOutcome: func(_ context.Context, d consumer.OutcomeData) {
		rec, o := d.Record, d.Outcome
		now := time.Now()
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.first.IsZero() {
			g.first = now
		}
		g.last = now
		if o == "applied" {
			g.applied++
		}
		g.owner[rec.Partition] = member
		if _, ok := g.firstBy[member]; !ok {
			g.firstBy[member] = now
		}
		if !g.mark.IsZero() && member != g.left && g.after[rec.Partition].IsZero() {
			g.after[rec.Partition] = now
		}
	}}
}

func (g *groupRun) count() int { g.mu.Lock(); defer g.mu.Unlock(); return g.applied }

// TestConsumerGroupScaling measures one exactly consumer against a group of
// three on kfake and one PostgreSQL (the credit handler: guard, ledger row,
// outbox event), then the rebalance cost when a member leaves and when one
// joins: how long the partitions that changed hands go without progress.
// It asserts that every record is applied exactly once across the
// handovers and that each handover resumes within the session timeout; it
// logs the figures quoted in docs/scaling.md (the machine is shared, so
// they vary from run to run).
func TestConsumerGroupScaling(t *testing.T) {
	pool := testenv.DB(t)
	ctx := context.Background()
	const parts, n, accounts = 12, 12000, 1000
	kc := testenv.Kafka(t, parts, "one", "three")
	brokers := testenv.Brokers(kc)
	cfgFor := func(group, topic string) consumer.Config {
		c := consumer.DefaultConfig()
		c.Brokers, c.Group, c.Topics = brokers, group, []string{topic}
		c.CommitInterval = 100 * time.Millisecond
		c.SessionTimeout = 6 * time.Second
		c.RebalanceTimeout = 10 * time.Second
		return c
	}
	run := func(t *testing.T, schema, topic string, members int) (*groupRun, []func(), func(i int)) {
		f := fixture(schema, "events-"+schema)
		if err := f.migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		g := newGroupRun()
		var stops []func()
		start := func(i int) {
			c, err := consumer.New(cfgFor("g-"+schema, topic), pool, consumer.Handle(f.svc.Handler()), consumer.WithGuard(f.guard),
				consumer.WithDeadLetters(outbox.DeadLetters(f.ob, ".dlq")), consumer.WithHooks(g.hook(i)),
				consumer.WithKafkaOptions(kgo.FetchMaxWait(50*time.Millisecond)))
			if err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- c.Run(cctx) }()
			var once sync.Once
			stop := func() {
				once.Do(func() {
					cancel()
					if err := <-done; err != nil {
						t.Errorf("member %d: %v", i, err)
					}
				})
			}
			t.Cleanup(stop)
			stops = append(stops, stop)
		}
		for i := range members {
			start(i)
		}
		// Produce once every member has its partitions, so the rate is
		// the group's, not the first member's.
		adm := kadm.NewClient(workload.Client(brokers))
		defer adm.Close()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		err := workload.Poll(wctx, func() (bool, error) {
			gs, err := adm.DescribeGroups(wctx, "g-"+schema)
			if err != nil {
				return false, err
			}
			d := gs["g-"+schema]
			return d.State == "Stable" && len(d.Members) == members, nil
		})
		if err != nil {
			t.Fatalf("group of %d members not stable: %v", members, err)
		}
		if err := workload.Produce(ctx, brokers, topic, parts, workload.Commands(n, accounts), 1); err != nil {
			t.Fatal(err)
		}
		return g, stops, start
	}
	await := func(t *testing.T, g *groupRun, want int, what string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		if err := workload.Poll(wctx, func() (bool, error) { return g.count() >= want, nil }); err != nil {
			t.Fatalf("%s: %d of %d applied: %v", what, g.count(), want, err)
		}
	}
	rate := func(g *groupRun, k int) float64 {
		g.mu.Lock()
		defer g.mu.Unlock()
		return float64(k) / g.last.Sub(g.first).Seconds()
	}

	g1, stops1, _ := run(t, "grp1", "one", 1)
	await(t, g1, n, "one member")
	r1 := rate(g1, n)
	stops1[0]()

	g3, stops3, start3 := run(t, "grp3", "three", 3)
	await(t, g3, n/3, "three members, first third")
	r3 := rate(g3, g3.count())
	// A member leaves: the partitions it held stall until the others
	// have them.
	g3.mu.Lock()
	var held []int32
	for p, m := range g3.owner {
		if m == 0 {
			held = append(held, p)
		}
	}
	g3.mu.Unlock()
	g3.mu.Lock()
	leaveAt := time.Now()
	g3.mark, g3.left = leaveAt, 0
	g3.mu.Unlock()
	stops3[0]()
	// The leaver may have drained its partitions before it left (a fast
	// member can apply all of its share before the others fetch), so one
	// new record per partition guarantees the new owners have work: a
	// partition that does not resume is then a stuck handover, never an
	// empty one.
	if err := workload.Produce(ctx, brokers, "three", parts, workload.Commands(n+parts, accounts)[n:], 1); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := workload.Poll(wctx, func() (bool, error) {
		g3.mu.Lock()
		defer g3.mu.Unlock()
		for _, p := range held {
			if g3.after[p].IsZero() {
				return false, nil
			}
		}
		return true, nil
	})
	cancel()
	if err != nil {
		t.Fatalf("the partitions %v of the member that left did not resume: %v", held, err)
	}
	g3.mu.Lock()
	var leaveStall time.Duration
	for _, p := range held {
		if a := g3.after[p]; !a.IsZero() {
			leaveStall = max(leaveStall, a.Sub(leaveAt))
		}
	}
	g3.mark, g3.after = time.Time{}, map[int32]time.Time{}
	g3.mu.Unlock()
	await(t, g3, n+parts, "two members after the leave")
	// A member joins while more records arrive: the time until it
	// applies its first record.
	more := n / 3
	joinAt := time.Now()
	start3(3)
	// Paced over about 3 s, so there is work when the joiner gets its
	// partitions (a rebalance takes about a second).
	cmds := workload.Commands(n+parts+more, accounts)[n+parts:]
	const chunks = 30
	for i := range chunks {
		if err := workload.Produce(ctx, brokers, "three", parts, cmds[i*more/chunks:(i+1)*more/chunks], 1); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // pacing, not synchronisation
	}
	await(t, g3, n+parts+more, "three members after the join")
	g3.mu.Lock()
	joined := g3.firstBy[3]
	g3.mu.Unlock()
	if joined.IsZero() {
		t.Fatalf("the member that joined applied nothing of %d new records", more)
	}
	joinStall := joined.Sub(joinAt)
	want := map[string]int{"grp1": n, "grp3": n + parts + more}
	for _, schema := range []string{"grp1", "grp3"} {
		var ledger, guard int
		if err := pool.QueryRow(ctx, fmt.Sprintf(`select (select count(*) from %[1]s.ledger), (select count(*) from %[1]s.exactly_guard)`, schema)).Scan(&ledger, &guard); err != nil {
			t.Fatal(err)
		}
		if ledger != want[schema] || guard != want[schema] {
			t.Fatalf("%s: %d ledger rows and %d guard rows, want %d each (exactly once across handovers)", schema, ledger, guard, want[schema])
		}
	}
	if leaveStall > 6*time.Second {
		t.Fatalf("partitions of the member that left resumed after %v, want within the 6s session timeout", leaveStall)
	}
	t.Logf("figures: %d records, %d partitions, one PostgreSQL; 1 member %.0f rec/s; 3 members %.0f rec/s (first third); leave: its %d partitions resumed after %v; join (with %d new records): its first record after %v",
		n, parts, r1, r3, len(held), leaveStall.Round(time.Millisecond), more, joinStall.Round(time.Millisecond))
}
