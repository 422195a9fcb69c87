package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/cmd/exactly/internal/workload"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/credit"
)

// brokerMaxMessageBytes is kfake's (and Kafka's) default message.max.bytes.
const brokerMaxMessageBytes = 1_048_588

// fault is one scheduled fault.
type fault struct {
	at     time.Duration
	kind   string // FaultKill, FaultStop, FaultPGRestart, FaultBrokerRestart, or "kafka"
	target int    // index of the process, for kill and stop
	pick   uint64 // further seeded choices (fault subtype, error, delay)
}

// schedule draws the faults of cfg.Plan at seeded times in [5%, 90%] of the
// fault window, in time order.
func schedule(rng *rand.Rand, cfg Config) []fault {
	var fs []fault
	add := func(kind string, n int) {
		for range n {
			at := time.Duration((0.05 + 0.85*rng.Float64()) * float64(cfg.Duration))
			fs = append(fs, fault{at: at, kind: kind, target: rng.IntN(2 * cfg.Consumers), pick: rng.Uint64()})
		}
	}
	p := cfg.Plan
	add(FaultKill, p.Kills)
	add(FaultStop, p.Stops)
	add(FaultPGRestart, p.PGRestarts)
	add(FaultBrokerRestart, p.BrokerRestarts)
	add("kafka", p.KafkaFaults)
	if !cfg.NoDenial {
		// While the first copies flow (they are sent over 0-40% of the
		// window), so that audit events meet the denial.
		at := time.Duration((0.1 + 0.2*rng.Float64()) * float64(cfg.Duration))
		fs = append(fs, fault{at: at, kind: FaultDenied})
	}
	slices.SortStableFunc(fs, func(a, b fault) int { return int(a.at - b.at) })
	return fs
}

// injectFaults runs the schedule and returns at the end of the fault window
// (or when ctx ends). Process restarts and wake-ups it schedules may still
// be pending; heal completes them.
func (h *harness) injectFaults(ctx context.Context, sched []fault) {
	for _, f := range sched {
		if !sleepUntil(ctx, h.start.Add(f.at)) {
			return
		}
		h.inject(ctx, f)
	}
	sleepUntil(ctx, h.start.Add(h.cfg.Duration))
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// pickProc returns the process at i if it runs unpaused, or the next one
// that does; nil if none does.
func (h *harness) pickProc(i int) *proc {
	for k := range h.procs {
		p := h.procs[(i+k)%len(h.procs)]
		if p.running() && !p.isPaused() {
			return p
		}
	}
	return nil
}

func (h *harness) inject(ctx context.Context, f fault) {
	r := rand.New(rand.NewPCG(f.pick, uint64(f.at)))
	switch f.kind {
	case FaultKill:
		p := h.pickProc(f.target)
		if p == nil {
			return
		}
		delay := time.Duration(500+r.IntN(2500)) * time.Millisecond
		kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		killed := p.kill9(kctx)
		cancel()
		if !killed {
			return
		}
		h.count(FaultKill)
		h.event("kill -9 %s (restart in %s)", p.name, delay)
		go func() {
			if !sleepUntil(ctx, time.Now().Add(delay)) || h.stopping.Load() {
				return
			}
			if err := p.start(); err != nil {
				h.log.Error("chaos: restarting", "proc", p.name, "error", err)
			}
		}()
	case FaultStop:
		p := h.pickProc(f.target)
		if p == nil {
			return
		}
		// Past the session timeout: the group moves its partitions,
		// then the zombie wakes up with its in-flight work.
		pause := h.cfg.SessionTimeout + time.Duration(2000+r.IntN(2000))*time.Millisecond
		if !p.signal(ctx, syscall.SIGSTOP, false) {
			return
		}
		h.count(FaultStop)
		h.event("SIGSTOP %s for %s (session timeout %s)", p.name, pause.Round(100*time.Millisecond), h.cfg.SessionTimeout)
		go func() {
			sleepUntil(ctx, time.Now().Add(pause))
			if p.cont() {
				h.event("SIGCONT %s", p.name)
			}
		}()
	case FaultPGRestart:
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := h.pg.Restart(rctx, true)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				h.violation("harness: PostgreSQL restart failed: %v", err)
			}
			return
		}
		h.count(FaultPGRestart)
		h.event("PostgreSQL restarted in immediate mode (crash recovery) in %s", time.Since(start).Round(10*time.Millisecond))
	case FaultBrokerRestart:
		start := time.Now()
		h.bmu.Lock()
		h.hits += hitsOf(h.handles)
		h.handles = nil
		h.b.Close()
		err := h.startBroker(ctx)
		h.bmu.Unlock()
		if err != nil {
			if ctx.Err() == nil {
				h.violation("harness: broker restart failed: %v", err)
			}
			return
		}
		h.count(FaultBrokerRestart)
		h.event("broker restarted with its data kept in %s", time.Since(start).Round(10*time.Millisecond))
		h.bmu.Lock()
		if h.denied {
			h.deny()
		}
		h.bmu.Unlock()
	case "kafka":
		h.kafkaFault(r)
	case FaultDenied:
		h.bmu.Lock()
		h.denied = true
		h.deny()
		h.bmu.Unlock()
		h.count(FaultDenied)
		h.event("broker fault: every produce request to %s fails with %s until the faults end", AuditTopic, kerr.TopicAuthorizationFailed.Message)
	}
}

// deny installs the produce denial of AuditTopic on the current broker.
// The caller holds h.bmu.
func (h *harness) deny() {
	h.handles = append(h.handles, h.b.Cluster().Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: AuditTopic,
		Err: kerr.TopicAuthorizationFailed, Count: -1}))
}

// kafkaFault installs one broker fault: errors on produce, fetch or offset
// commit for a few requests, or a coordinator move.
func (h *harness) kafkaFault(r *rand.Rand) {
	topics := []string{credit.CommandsTopic, credit.EventsTopic}
	groups := []string{CreditGroup, NotifyGroup}
	h.bmu.Lock()
	defer h.bmu.Unlock()
	cl := h.b.Cluster()
	n := 3 + r.IntN(8)
	switch r.IntN(5) {
	case 0:
		topic := topics[r.IntN(2)]
		errs := []*kerr.Error{kerr.NotLeaderForPartition, kerr.RequestTimedOut, kerr.NotEnoughReplicas}
		e := errs[r.IntN(len(errs))]
		h.handles = append(h.handles, cl.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: e, Count: n}))
		h.count(FaultProduce)
		h.event("broker fault: next %d produce requests to %s fail with %s", n, topic, e.Message)
	case 1:
		topic := topics[r.IntN(2)]
		errs := []*kerr.Error{kerr.NotLeaderForPartition, kerr.UnknownServerError, kerr.KafkaStorageError}
		e := errs[r.IntN(len(errs))]
		h.handles = append(h.handles, cl.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Topic: topic, Err: e, Count: n}))
		h.count(FaultFetch)
		h.event("broker fault: next %d fetches of %s fail with %s", n, topic, e.Message)
	case 2:
		group := groups[r.IntN(2)]
		errs := []*kerr.Error{kerr.RequestTimedOut, kerr.NotCoordinator, kerr.CoordinatorLoadInProgress, kerr.UnknownServerError}
		e := errs[r.IntN(len(errs))]
		h.handles = append(h.handles, cl.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: e, Count: n}))
		h.count(FaultCommit)
		h.event("broker fault: next %d offset commits of %s fail with %s", n, group, e.Message)
	case 3:
		cl.RehashCoordinators()
		h.count(FaultCoordinator)
		h.event("broker fault: group coordinators moved")
	default:
		// kfake answers the clients' leader-epoch validation after this
		// as if the log had been truncated: franz-go reports "lost
		// records" and resets the partition to its start, a mass
		// redelivery the guard must absorb.
		cl.ShufflePartitionLeaders()
		h.count(FaultLeader)
		h.event("broker fault: partition leaders moved")
	}
}

// Sizes of the oversized records.
const (
	// UndecodableBytes is the value size of an undecodable record: with
	// its batch's overhead just under the broker's default
	// message.max.bytes (1,048,588), so the broker takes it, and its dead
	// letter (the value plus the dead-letter headers) is over the
	// outbox's limit: it must be truncated.
	UndecodableBytes = 1_048_450
	// PadBytes is the pad of an oversized valid command: the command fits,
	// the audit event its handler emits (the pad twice) does not.
	PadBytes = 600_000
)

// wl is the seeded workload: every record it sends, when.
type wl struct {
	cfg  Config
	cmds []credit.Command
	recs []timedRecord
	// swallow and padded are the order ids of the commands whose handler
	// swallows an error and of the oversized ones; undecodable is the
	// number of undecodable records sent.
	swallow, padded map[string]bool
	undecodable     int
}

// bad reports whether order must end dead-lettered.
func (w *wl) bad(order string) bool { return w.swallow[order] || w.padded[order] }

// swallowed returns the orders whose handler swallows an error, sorted.
func (w *wl) swallowed() []string {
	out := make([]string, 0, len(w.swallow))
	for o := range w.swallow {
		out = append(out, o)
	}
	slices.Sort(out)
	return out
}

// paddedCommand is a credit command with a pad (the services' Command
// ignores the field; the chaos credit service copies it into an event).
type paddedCommand struct {
	credit.Command
	Pad string `json:"pad"`
}

type timedRecord struct {
	at  time.Duration
	rec *kgo.Record
}

// newWorkload plans cfg.Copies records per command. The first copy goes to
// a seeded partition; each other copy goes to the same partition, to
// another partition, or, much later, anywhere (a producer-side duplicate
// sent after the original was long processed). Immediate copies are sent
// over the first 40% of the fault window, late ones between 55% and 80%.
func newWorkload(rng *rand.Rand, cfg Config) *wl {
	w := &wl{cfg: cfg, cmds: workload.Commands(cfg.Keys, 10), swallow: map[string]bool{}, padded: map[string]bool{}}
	perm := rng.Perm(len(w.cmds))
	for i := range max(0, cfg.SwallowKeys) {
		w.swallow[w.cmds[perm[i]].OrderID] = true
	}
	for i := range max(0, cfg.Oversized) {
		w.padded[w.cmds[perm[max(0, cfg.SwallowKeys)+i]].OrderID] = true
	}
	d := float64(cfg.Duration)
	early := func() time.Duration { return time.Duration(0.4 * d * rng.Float64()) }
	late := func() time.Duration { return time.Duration((0.55 + 0.25*rng.Float64()) * d) }
	P := cfg.Partitions
	for _, c := range w.cmds {
		var v []byte
		var err error
		if w.padded[c.OrderID] {
			v, err = json.Marshal(paddedCommand{Command: c, Pad: strings.Repeat("x", PadBytes)})
		} else {
			v, err = json.Marshal(c)
		}
		if err != nil {
			panic(err) // a struct of strings and ints always encodes
		}
		p0 := rng.IntN(P)
		rec := func(p int) *kgo.Record {
			return &kgo.Record{Topic: credit.CommandsTopic, Partition: int32(p), Key: []byte(c.OrderID), Value: v}
		}
		w.recs = append(w.recs, timedRecord{early(), rec(p0)})
		for range cfg.Copies - 1 {
			switch x := rng.Float64(); {
			case x < 0.3:
				w.recs = append(w.recs, timedRecord{early(), rec(p0)})
			case x < 0.65:
				w.recs = append(w.recs, timedRecord{early(), rec((p0 + 1 + rng.IntN(P-1)) % P)})
			default:
				w.recs = append(w.recs, timedRecord{late(), rec(rng.IntN(P))})
			}
		}
	}
	for i := range max(0, cfg.Oversized) {
		// Keyless, an unterminated JSON document: the handler cannot
		// decode it.
		v := []byte(fmt.Sprintf(`{"order_id":"undecodable-%d","pad":"`, i))
		v = append(v, strings.Repeat("x", UndecodableBytes-len(v))...)
		w.recs = append(w.recs, timedRecord{early(), &kgo.Record{Topic: credit.CommandsTopic, Partition: int32(rng.IntN(P)), Value: v}})
		w.undecodable++
	}
	slices.SortStableFunc(w.recs, func(a, b timedRecord) int { return int(a.at - b.at) })
	return w
}

// produce sends the planned records on time, every 100ms the ones due,
// resending any that fail until acknowledged (a resend after a lost ack is
// one more producer-side duplicate: the checker counts the log, not the
// plan).
func (w *wl) produce(ctx context.Context, h *harness) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(h.addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RecordDeliveryTimeout(20*time.Second), kgo.ProducerBatchMaxBytes(brokerMaxMessageBytes))
	if err != nil {
		return fmt.Errorf("creating producer: %w", err)
	}
	defer cl.Close()
	next, resent := 0, 0
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for next < len(w.recs) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		el := time.Since(h.start)
		var due []*kgo.Record
		for next < len(w.recs) && w.recs[next].at <= el {
			due = append(due, w.recs[next].rec)
			next++
		}
		for len(due) > 0 {
			var failed []*kgo.Record
			for _, r := range cl.ProduceSync(ctx, due...) {
				if r.Err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					failed = append(failed, &kgo.Record{Topic: r.Record.Topic, Partition: r.Record.Partition, Key: r.Record.Key, Value: r.Record.Value})
				}
			}
			if len(failed) > 0 {
				resent += len(failed)
				h.log.Warn("chaos: resending records", "n", len(failed))
				time.Sleep(200 * time.Millisecond)
			}
			due = failed
		}
	}
	h.event("workload sent: %d records for %d keys (%d resent after errors)", len(w.recs), len(w.cmds), resent)
	return nil
}
