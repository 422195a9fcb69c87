package consumer

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
	"github.com/exactly-go/exactly/internal/runtime/callctx"
	"github.com/exactly-go/exactly/internal/runtime/memo"
	"github.com/exactly-go/exactly/internal/runtime/workunit"
)

// Key concurrency (Config.KeyConcurrency > 1). The partition's worker
// goroutine is a dispatcher: it admits fetched records, in offset order,
// into a window of unfinished records, and gives each its lanes (its Kafka
// key, its dedupe key, its lock keys; "no key" when it cannot be keyed). A
// record runs only when no earlier unfinished record shares a lane with it,
// or when those that do run before it in the same transaction. Lanes are
// given only while they can order something (see dispatch.linked): while
// no record is held and none has a call, every unfinished record is ready
// or running, and each transaction takes the ready ones in offset order. The
// pre-transaction calls of handler.WithCall handlers run in goroutines the
// instance keeps between calls (callRunners), bounded per partition (KeyConcurrency) and per instance
// (MaxCallsInFlight); everything that is ready goes, in offset order, into
// one transaction at a time (apply.Executor.Run), so the partition still
// holds one database connection. A failed attempt holds only its lanes
// until its backoff ends. The offset marked for commit is the lowest
// unfinished record's.

// state is where a record of the window is.
type state uint8

const (
	stNew     state = iota // just admitted, in no state yet (its zero value)
	stCall                 // its pre-transaction call has not started
	stCalling              // its call runs
	stReady                // it can go into a transaction
	stHeld                 // a failed attempt; it waits until retryAt
	stRunning              // in the transaction in flight
	stDone                 // committed or dead-lettered
	stLookup               // has a call; its guard row is being looked up (see lookup)
)

// entry is one record of the window.
type entry struct {
	rec      *kgo.Record
	hrec     handler.Record
	prep     workunit.Prepared
	prepErr  error
	lanes    []uint64 // hashes of its lanes (see lanes), once linked
	state    state
	attempts int // failed attempts
	// linked: it has its lanes (see dispatch.linked); hasCall: it has a
	// pre-transaction call (counted in dispatch.withCall until it
	// finishes).
	linked, hasCall bool
	// suspect: its handler failed in a transaction (not only its call);
	// it runs again in a transaction of its own (see scan).
	suspect bool
	lastErr error     // the last failure
	retryAt time.Time // when a held record may run again
	// prev holds, for each lane, the record of that lane admitted before
	// it (none: nil); inBatch is the scan that put it in a batch.
	prev    []prevRef
	inBatch uint64
	// behind: when admitted, an earlier unfinished record shared a lane
	// with it (counted in dispatch.behind until it finishes).
	behind bool
	// seq numbers the records the dispatcher admitted: an entry is
	// recycled for a later record (see compact), so a reference to it
	// holds the seq it had then (prevRef).
	seq uint64
	// lastOf has bit i set while e is the last record admitted to lane
	// lanes[i] (d.last): retire then forgets it there without looking
	// the lane up (a record of more than 64 lanes looks the rest up).
	lastOf uint64
	memo   *memo.Memo // the results of its pre-transaction call (nil: it has none)
	// callStart is when its running call started; slow, that the call
	// ran past the slow-call threshold (logged, and listed as held);
	// listed, that a held row lists it while its call runs.
	callStart    time.Time
	slow, listed bool
	// lookLater: it was admitted behind an unfinished record of one of
	// its lanes, so its guard row is looked up when its turn comes (see
	// startCalls), not when admitted: an earlier copy of its key may
	// commit meanwhile.
	lookLater bool
	// laneBuf and prevBuf hold lanes and prev for a record of up to three
	// lanes (a Kafka key, a dedupe key, a lock key): no allocation of
	// their own.
	laneBuf [3]uint64
	prevBuf [3]prevRef
}

// prevRef is a record admitted to a lane before another. The record
// finished, and its entry may hold another record by now, once e.seq is
// no longer seq.
type prevRef struct {
	e   *entry
	seq uint64
}

// unfinished reports whether the record p refers to has not finished.
func (p prevRef) unfinished() bool {
	return p.e != nil && p.e.seq == p.seq && p.e.state != stDone
}

// txDone is the end of the transaction in flight.
type txDone struct {
	results []apply.Result
	herr    *apply.HandlerError
	err     error
}

// callDone is the end of one pre-transaction call.
type callDone struct {
	e    *entry
	err  error
	took time.Duration
}

// callGate is what a dispatcher's call goroutines check before they hand
// their end to the dispatcher: once close abandoned the calls still
// running, their ends are dropped and their goroutines exit.
type callGate struct {
	mu        sync.Mutex
	abandoned bool
}

// dispatch is the state of a key-concurrent partition worker; only its
// goroutine touches it.
type dispatch struct {
	w   *worker
	log *slog.Logger
	win []*entry // unfinished records (and done ones until compacted), in offset order
	// next is the offset after the last record admitted (its epoch with
	// it): the mark when the window is empty.
	next     kgo.EpochOffset
	admitted bool
	held     int // unfinished records with a failed attempt: they hold their lanes
	ready    int // records in stReady
	uncalled int // records in stCall
	finished int // records of win in stDone, compacted away lazily (see compact)
	// retryAt is the earliest end of a backoff of a record in stHeld
	// (zero: none).
	retryAt time.Time
	calls   int // calls running
	done    chan callDone
	// running is the batch of the transaction in flight (nil: none); its
	// end comes on txEnd. The transaction runs in its own goroutine, so
	// that calls start while it runs; there is one at a time.
	running []*entry
	// items and doneRecs are run's and settle's arrays, reused from batch to
	// batch (one transaction at a time).
	items    []apply.Item
	doneRecs []*kgo.Record
	// results holds the last transaction's results, whose array the next
	// one reuses (runTx): settle has read them by then.
	results []apply.Result
	txEnd   chan txDone
	// txStart hands txLoop the next transaction's items (nil until the
	// first transaction starts it).
	txStart chan []apply.Item
	// pauseUntil holds the partition after an outage, until its backoff
	// ends.
	pauseUntil time.Time
	// pending is the record fill took from the queue but could not
	// admit (a service its codec needs is down; see unavailable): it is
	// admitted first, once admitAt has passed; unavailableN counts its
	// tries, for the backoff.
	pending      *kgo.Record
	admitAt      time.Time
	unavailableN int
	callCtx      context.Context
	cancel       context.CancelFunc
	batchCap     int
	clean        int
	outage       int
	holding      bool // fetching paused by the window's bounds
	// linked: records get their lanes as they are admitted. Lanes order
	// records only while one can wait for an earlier one of its lane: a
	// held record (d.held), or a record with a pre-transaction call
	// (d.withCall), which waits for its call and holds back its lanes'
	// later records. Without either, every unfinished record is ready or
	// running, one transaction at a time takes the ready ones in offset
	// order, and no record can pass an earlier one: records are admitted
	// unlinked, and a backlog costs no lane bookkeeping. The first record
	// held or with a call links the window's unlinked unfinished records,
	// in offset order (linkWindow), which gives each the predecessors it
	// would have had; once neither is left (settle), admissions are
	// unlinked again.
	linked   bool
	withCall int // unfinished records with a pre-transaction call
	// last is the last record admitted of each lane, while it is
	// unfinished; gen numbers scans (entry.inBatch).
	last map[uint64]*entry
	seed maphash.Seed
	gen  uint64
	// seq numbers admitted records (entry.seq); free holds entries of
	// finished records compacted out of the window, for the next
	// records (at most maxFreeEntries).
	seq  uint64
	free []*entry
	// behind counts the unfinished records admitted behind an unfinished
	// record of one of their lanes (entry.behind): fill does not count
	// them against what the next transactions need.
	behind int
	toCall []*entry // records whose calls scan found startable
	// toLookUp are the admitted records with a call whose guard rows the
	// next lookup reads; lookingUp, the batch of the lookup in flight
	// (nil: none), which ends on lookedUp.
	toLookUp  []*entry
	lookingUp []*entry
	lookedUp  chan lookupDone
	// gate is shared with the call goroutines (see callGate); slowAt is
	// when the next running call passes the slow-call threshold (zero:
	// none runs).
	gate   *callGate
	slowAt time.Time
}

// lookupDone is the end of a lookup of guard rows: found[i] reports
// whether the guard row of the lookup's i-th record exists (nil: the
// lookup failed, and every record calls).
type lookupDone struct {
	found []bool
}

func newDispatch(w *worker, log *slog.Logger) *dispatch {
	// The calls' context carries the guard's effects table, where a
	// handler built with handler.NewWithCall remembers its results.
	ctx, cancel := context.WithCancel(callctx.With(context.Background(), w.c.effects))
	return &dispatch{
		w: w, log: log, done: make(chan callDone, w.c.cfg.KeyConcurrency), txEnd: make(chan txDone, 1),
		callCtx: ctx, cancel: cancel, batchCap: w.c.cfg.BatchMaxRecords,
		last: map[uint64]*entry{}, seed: maphash.MakeSeed(), lookedUp: make(chan lookupDone, 1),
		gate: &callGate{},
	}
}

// runKeyed is the worker's loop with key concurrency on.
func (w *worker) runKeyed() {
	defer close(w.done)
	d := newDispatch(w, w.c.log.With("topic", w.topic, "partition", w.partition, "handler", w.exec.Handler.Name()))
	defer d.close()
	for !w.stopping() {
		d.drainCalls()
		d.fill()
		d.checkSlow(time.Now())
		batch := d.scan()
		d.startCalls()
		if len(batch) > 0 {
			d.run(batch)
			continue
		}
		if !d.wait() {
			return
		}
	}
}

// exhausted reports whether e is to be dead-lettered without running
// again: its attempts are used up, or its call failed for good.
func (d *dispatch) exhausted(e *entry) bool {
	cfg := &d.w.c.cfg
	if d.w.c.deadLetter == nil || e.lastErr == nil {
		return false
	}
	return (cfg.MaxAttempts > 0 && e.attempts >= cfg.MaxAttempts) || handlerPermanent(e.lastErr)
}

// close ends the calls in flight (their results are dropped: the next
// owner calls again with the same idempotency key), releases the window's
// records and lifts the hold on fetching.
func (d *dispatch) close() {
	if d.running != nil {
		// Transactions run to completion: its records are settled (and
		// their offsets marked) before the revoke commits.
		d.ended(<-d.txEnd)
	}
	if d.txStart != nil {
		close(d.txStart) // txLoop returns
	}
	d.cancel()
	if d.lookingUp != nil {
		<-d.lookedUp // cancelled with callCtx
		d.lookingUp = nil
	}
	d.awaitCalls()
	var recs []*kgo.Record
	for _, e := range d.win {
		if e.state != stDone {
			recs = append(recs, e.rec)
		}
	}
	if d.pending != nil {
		recs = append(recs, d.pending) // taken from the queue, never admitted
		d.pending = nil
	}
	d.w.release(recs)
	d.win = nil
	d.w.setHeld(0)
	d.w.closeWaitRows()
	d.w.c.limit.hold(tp{d.w.topic, d.w.partition}, false)
}

// callStopMax bounds how long a revoke or shutdown waits for a
// partition's calls to return once their context is cancelled (and
// Config.CallTimeout, when shorter).
const callStopMax = 5 * time.Second

// awaitCalls waits for the calls in flight, whose context close has
// cancelled, at most min(Config.CallTimeout, callStopMax): a call that
// honours its context returns at once. The calls still running then are
// abandoned: their results are dropped (the next owner of the partition
// calls again, with the same idempotency key), their slots are freed, and
// their goroutines exit when the calls end.
func (d *dispatch) awaitCalls() {
	if d.calls == 0 {
		return
	}
	t := time.NewTimer(min(d.w.c.cfg.CallTimeout, callStopMax))
	defer t.Stop()
	for d.calls > 0 {
		select {
		case <-d.done:
			d.calls--
			d.w.callsNow.Add(-1)
			d.w.c.calls.release()
			continue
		case <-t.C:
		}
		d.gate.mu.Lock()
		for {
			select {
			case <-d.done:
				d.calls--
				d.w.callsNow.Add(-1)
				d.w.c.calls.release()
				continue
			default:
			}
			break
		}
		d.gate.abandoned = true
		d.gate.mu.Unlock()
		if d.calls == 0 {
			return
		}
		d.log.Warn("pre-transaction calls did not return after their context was cancelled; abandoning them (their results are dropped, the next owner calls again with the same idempotency key): the WithCall function must honour ctx",
			"calls", d.calls, "waited", min(d.w.c.cfg.CallTimeout, callStopMax))
		d.w.c.runners.abandon(d.calls)
		for ; d.calls > 0; d.calls-- {
			d.w.callsNow.Add(-1)
			d.w.c.calls.release()
		}
	}
}

// set moves e to st, counting the ready records.
func (d *dispatch) set(e *entry, st state) {
	if e.state == stReady && st != stReady {
		d.ready--
	}
	if st == stReady && e.state != stReady {
		d.ready++
	}
	if e.state == stCall && st != stCall {
		d.uncalled--
	}
	if st == stCall && e.state != stCall {
		d.uncalled++
	}
	if st == stDone && e.state != stDone {
		d.finished++
	}
	e.state = st
}

// compact drops the done records from the window: those in front of its
// lowest unfinished record at once (so that the window starts with it),
// the others once they are half of it. Compacting the whole window after
// every transaction would cost a walk of up to MaxOffsetGap records per
// record at batch 1. The entries dropped are kept for later records
// (recycle): a done record has been retired (settle).
func (d *dispatch) compact() {
	i := 0
	for i < len(d.win) && d.win[i].state == stDone {
		d.recycle(d.win[i])
		d.win[i] = nil
		i++
	}
	d.finished -= i
	d.win = d.win[i:]
	if d.finished > 0 && 2*d.finished >= len(d.win) {
		d.win = slices.DeleteFunc(d.win, func(e *entry) bool {
			if e.state == stDone {
				d.recycle(e)
				return true
			}
			return false
		})
		d.finished = 0
	}
}

// lowest returns the lowest unfinished offset, or -1.
func (d *dispatch) lowest() int64 {
	for _, e := range d.win {
		if e.state != stDone {
			return e.rec.Offset
		}
	}
	return -1
}

// bounded reports whether the window may admit no record at offset next
// or later: it would reach MaxOffsetGap past low, its lowest unfinished
// record (-1: none), or KeyConcurrency records are held.
func (d *dispatch) bounded(low, next int64) bool {
	cfg := &d.w.c.cfg
	return d.held >= cfg.KeyConcurrency || (low >= 0 && next-low >= int64(cfg.MaxOffsetGap))
}

// fill admits queued records into the window while its bounds allow, and
// pauses fetching (visibly) while they do not. While no record is held, it
// admits only as far as the next transactions and calls need (ahead): the
// records behind them wait in the queue, fetched but neither decoded nor
// tracked. Records admitted behind an unfinished record of their lane (a
// busy key's backlog, a slow call's successors) do not count, so they
// never keep other keys' records out. Once a record is held, it admits as
// far as the bounds allow, so that the records of other keys behind the
// held one's run.
func (d *dispatch) fill() {
	w := d.w
	low := d.lowest()
	first := len(d.win)
	ahead := d.w.c.cfg.KeyConcurrency + 2*d.w.c.cfg.BatchMaxRecords
	for d.held > 0 || len(d.win)-d.finished-d.behind < ahead {
		r := d.pending
		if r != nil {
			if time.Now().Before(d.admitAt) {
				break
			}
			if low < 0 {
				low = r.Offset
			}
			if d.bounded(low, r.Offset) {
				break
			}
			d.pending = nil
		} else {
			w.mu.Lock()
			if len(w.queue) == 0 {
				w.mu.Unlock()
				break
			}
			r = w.queue[0]
			if low < 0 {
				low = r.Offset
			}
			if d.bounded(low, r.Offset) {
				w.mu.Unlock()
				break
			}
			w.queue[0] = nil
			w.queue = w.queue[1:]
			w.mu.Unlock()
		}
		if !d.admit(r) {
			break
		}
	}
	d.lookup(d.win[first:])
	d.setHolding(d.admitted && d.bounded(low, d.next.Offset))
}

// setHolding pauses or resumes fetching for the window's bounds, logging
// each change.
func (d *dispatch) setHolding(on bool) {
	if on == d.holding {
		if on && d.held > 0 {
			// Still paused, but its lowest record may have changed: the
			// records before a held one committed, and it now stops the
			// partition at the offset gap (or the other way round).
			d.syncPaused()
		}
		return
	}
	d.holding = on
	d.w.c.limit.hold(tp{d.w.topic, d.w.partition}, on)
	// A window that is merely full (a backlog runs ahead of its slowest
	// records) pauses and resumes with nearly every transaction: at debug.
	// A pause that held records cause is logged by syncPaused.
	if on {
		d.log.Debug("window full: fetching paused", "lowest_unfinished", d.lowest(), "held", d.held)
	} else {
		d.log.Debug("window has room: fetching resumed", "lowest_unfinished", d.lowest(), "held", d.held)
	}
	d.syncPaused()
}

// maxFreeEntries bounds the entries a dispatcher keeps for reuse.
const maxFreeEntries = 1024

// newEntry returns an entry for r: a finished record's (see compact), or
// a new one.
func (d *dispatch) newEntry(r *kgo.Record) *entry {
	d.seq++
	if n := len(d.free); n > 0 {
		e := d.free[n-1]
		d.free[n-1] = nil
		d.free = d.free[:n-1]
		*e = entry{rec: r, hrec: toRecord(r), seq: d.seq}
		return e
	}
	return &entry{rec: r, hrec: toRecord(r), seq: d.seq}
}

// recycle keeps e, a finished and retired record compacted out of the
// window, for a later record: nothing refers to it any more but its
// successors' prevRefs, which its next seq makes finished. Its prepared
// record goes back to its handler (workunit.Prepared.Release): the
// transaction that ran it has ended and cleared its items. Its Kafka
// record goes back to franz-go (kgo.Record.Recycle).
func (d *dispatch) recycle(e *entry) {
	if e.prep.Release != nil {
		e.prep.Release.Release()
		e.prep = workunit.Prepared{}
	}
	// Its transaction committed, its outcome was reported and its bytes
	// released (settle): franz-go may lend its memory to a later fetch
	// (fetchPools).
	e.rec.Recycle()
	e.rec, e.hrec = nil, handler.Record{}
	if len(d.free) < maxFreeEntries {
		d.free = append(d.free, e)
	}
}

// admit prepares r and appends it to the window. It reports false, and
// keeps r as d.pending, when r's codec could not reach a service it needs
// (see unavailable).
func (d *dispatch) admit(r *kgo.Record) bool {
	e := d.newEntry(r)
	e.prep, e.prepErr = d.w.exec.Prepare(e.hrec)
	if handler.IsUnavailable(e.prepErr) {
		d.unavailable(e)
		return false
	}
	d.unavailableN = 0
	if e.prepErr == nil && e.prep.Call != nil {
		e.memo = &memo.Memo{}
		e.hasCall = true
		d.withCall++
		d.linkWindow() // before e joins it: e waits for its lanes' records
	}
	if d.linked {
		d.linkEntry(e)
	}
	switch {
	case e.prepErr == nil && e.prep.Call != nil && !e.prep.Unguarded && e.behind:
		// An earlier record of its lanes (a copy of its key, say) has
		// not finished: its guard row is read when its turn comes.
		e.lookLater = true
		d.set(e, stCall)
	case e.prepErr == nil && e.prep.Call != nil && !e.prep.Unguarded:
		d.set(e, stLookup)
	case e.prepErr == nil && e.prep.Call != nil:
		d.set(e, stCall)
	default:
		d.set(e, stReady)
	}
	d.win = append(d.win, e)
	d.next, d.admitted = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1}, true
	return true
}

// unavailable handles a record whose codec could not reach a service it
// needs (a schema registry; handler.UnavailableError): an outage, not the
// record's fault, and its key is unknown. It is not admitted: it and every
// later record wait (d.pending) while the window's records go on, and it is
// prepared again after a backoff, as a batch is retried in a database
// outage; it is logged and reported to the retry hook like one.
func (d *dispatch) unavailable(e *entry) {
	d.unavailableN++
	delay := backoff(d.unavailableN, d.w.c.cfg.RetryBackoff, d.w.c.cfg.RetryBackoffMax)
	d.pending, d.admitAt = e.rec, time.Now().Add(delay)
	d.log.Warn("a service the codec needs is unavailable; holding the partition from this record and retrying when it is back",
		"offset", e.rec.Offset, "retry_in", delay, "error", e.prepErr)
	d.w.exec.CountUnavailable(context.Background(), e.prepErr)
	d.w.retried(context.Background(), e.rec, e.prepErr)
	*e = entry{}
	if len(d.free) < maxFreeEntries {
		d.free = append(d.free, e)
	}
}

// linkEntry gives e, just admitted or unfinished and unlinked, its lanes
// and its predecessors in them, and counts it behind when one of them has
// not finished.
func (d *dispatch) linkEntry(e *entry) {
	e.linked = true
	d.link(e, lanes(d.seed, e.laneBuf[:0], e.rec.Key, e.prep, e.prepErr))
	if slices.ContainsFunc(e.prev, prevRef.unfinished) {
		e.behind = true
		d.behind++
	}
}

// linkWindow starts giving records their lanes (see dispatch.linked): it
// links the window's unfinished records admitted unlinked, in offset
// order, as if they had been linked when admitted. The predecessors they
// had then but not now have finished, which clear reads alike.
func (d *dispatch) linkWindow() {
	if d.linked {
		return
	}
	d.linked = true
	for _, e := range d.win {
		if e.state != stDone && !e.linked {
			d.linkEntry(e)
		}
	}
}

// lanes appends to buf the lanes of a record: its Kafka key, its dedupe
// key and its lock keys; a record that could not be keyed also joins the
// "no key" lane, so such records keep their order among themselves. A
// lane is a 64-bit hash of its name (seeded per partition worker): two
// names with one hash share a lane, which costs concurrency, never order.
func lanes(seed maphash.Seed, buf []uint64, kafkaKey []byte, p workunit.Prepared, prepErr error) []uint64 {
	var h maphash.Hash
	lane := func(kind byte, parts ...string) uint64 {
		h.SetSeed(seed)
		h.WriteByte(kind)
		for _, s := range parts {
			h.WriteString(s)
			h.WriteByte(0)
		}
		return h.Sum64()
	}
	out := buf
	if len(kafkaKey) > 0 {
		h.SetSeed(seed)
		h.WriteByte('k')
		h.Write(kafkaKey)
		out = append(out, h.Sum64())
	}
	// A lane appears once: a record must not wait behind itself.
	add := func(l uint64) {
		if !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	if prepErr != nil {
		add(lane('n'))
		return out
	}
	add(lane('d', p.Scope, dedupe.NormalizeKey(p.Key)))
	for _, lk := range p.LockKeys {
		add(lane('l', lk))
	}
	return out
}

// clear reports whether every earlier record of e's lanes finished or,
// with in, is in the batch scan is forming.
func (d *dispatch) clear(e *entry, in bool) bool {
	for _, p := range e.prev {
		if !p.unfinished() || (in && p.e.inBatch == d.gen) {
			continue
		}
		return false
	}
	return true
}

// link gives e its lanes and makes it their last admitted record: e.prev
// holds, per lane, the record admitted to it before e (none: it finished
// before), and that record stops being the lane's last (see retire).
func (d *dispatch) link(e *entry, lanes []uint64) {
	e.lanes = lanes
	e.prev = e.prevBuf[:0]
	if len(lanes) > len(e.prevBuf) {
		e.prev = make([]prevRef, 0, len(lanes))
	}
	e.prev = e.prev[:len(lanes)]
	for i, l := range lanes {
		p := d.last[l]
		if j := slices.Index(p.laneList(), l); j >= 0 && j < 64 {
			p.lastOf &^= 1 << j // e is the lane's last now
		}
		e.prev[i] = prevRef{}
		if p != nil {
			e.prev[i] = prevRef{e: p, seq: p.seq}
		}
		if i < 64 {
			e.lastOf |= 1 << i
		}
		d.last[l] = e
	}
}

// laneList returns e's lanes (none for nil).
func (e *entry) laneList() []uint64 {
	if e == nil {
		return nil
	}
	return e.lanes
}

// retire forgets done record e as its lanes' predecessor.
func (d *dispatch) retire(e *entry) {
	for i, l := range e.lanes {
		if i < 64 && e.lastOf&(1<<i) != 0 || i >= 64 && d.last[l] == e {
			delete(d.last, l)
		}
	}
	e.lastOf = 0
	e.prev = nil
}

// scan walks the window in offset order: it returns the records to run in
// the next transaction (ready, and behind no earlier unfinished record of
// their lanes outside it), up to the batch cap, and collects in toCall the
// records whose calls may start (no earlier unfinished record shares a
// lane), up to the partition's call budget. It stops once neither can
// grow. A suspect record (its handler failed in a transaction) runs in a
// transaction of its own.
func (d *dispatch) scan() []*entry {
	d.gen++
	now := time.Now()
	d.unholdExpired(now)
	form := d.running == nil && !now.Before(d.pauseUntil)
	// At least one candidate, so that a worker without a free slot
	// waits in line for one (startCall); none to look for when no record
	// waits for its call.
	room := 0
	if d.uncalled > 0 {
		room = min(d.w.c.cfg.KeyConcurrency-d.calls, max(d.w.c.calls.available(d.calls), 1))
	}
	var batch []*entry
	seen := 0 // ready records passed
	for _, e := range d.win {
		if !(form && len(batch) < d.batchCap && seen < d.ready) && len(d.toCall) >= room {
			break
		}
		if e.state == stDone {
			continue
		}
		if e.state == stReady {
			seen++
		}
		switch {
		case form && e.state == stReady && len(batch) < d.batchCap && d.clear(e, true):
			if e.suspect {
				// A record whose handler failed runs alone: failing
				// again, it rolls back no other key's records (nor runs
				// their handlers, in a pipelined or set-based pass,
				// again). It waits for the next transaction if others
				// are in this one.
				if len(batch) > 0 {
					continue
				}
				form = false
			}
			e.inBatch = d.gen
			batch = append(batch, e)
		case e.state == stCall && len(d.toCall) < room && d.clear(e, false):
			d.toCall = append(d.toCall, e)
		}
	}
	return batch
}

// unholdExpired ends the backoffs that are over, when one is.
func (d *dispatch) unholdExpired(now time.Time) {
	if d.retryAt.IsZero() || now.Before(d.retryAt) {
		return
	}
	d.retryAt = time.Time{}
	for _, e := range d.win {
		switch {
		case e.state != stHeld:
		case !now.Before(e.retryAt):
			d.unhold(e)
		case d.retryAt.IsZero() || e.retryAt.Before(d.retryAt):
			d.retryAt = e.retryAt
		}
	}
}

// unhold ends e's backoff: it runs again (its call again, if the call was
// what failed).
func (d *dispatch) unhold(e *entry) {
	st := stReady
	if e.prep.Call != nil && !e.prep.Called() && !d.exhausted(e) {
		st = stCall
	}
	d.set(e, st)
}

// startCalls starts the calls scan found startable, as far as the
// instance's budget allows.
//
// A record whose guard row is to be read when its turn comes (lookLater)
// is queued for a lookup instead, taking no slot: a copy of its key that
// committed before it makes it a duplicate, which calls nothing.
func (d *dispatch) startCalls() {
	if len(d.toCall) == 0 {
		d.w.c.calls.kick(d.w.wake)
		if d.uncalled == 0 {
			d.w.callsWaiting.Store(0)
		}
		return
	}
	looked := false
starts:
	for _, e := range d.toCall {
		switch {
		case e.state != stCall:
		case e.lookLater:
			e.lookLater = false
			d.set(e, stLookup)
			d.toLookUp = append(d.toLookUp, e)
			looked = true
		case !d.startCall(e):
			break starts
		}
	}
	// Records whose call has not started while no slot is left to the
	// partition wait for one.
	if d.uncalled > 0 && d.w.c.calls.available(d.calls) == 0 {
		d.w.callsWaiting.Store(int64(d.uncalled))
	} else {
		d.w.callsWaiting.Store(0)
	}
	clear(d.toCall)
	d.toCall = d.toCall[:0]
	if looked {
		d.lookup(nil)
	}
}

// lookup queues the records just admitted that have a pre-transaction
// call for a read of their guard rows, outside any transaction, and starts
// that read unless one is in flight: records whose row exists are
// duplicates, made ready without calling (their transaction finds the row
// and runs no handler). The read runs in a goroutine of its own, so the
// dispatcher goes on starting calls and transactions meanwhile (on a busy
// pool it waits for a connection), and the records admitted during one
// read are read together by the next. A failed read skips nothing: the
// records call, and the transaction's claim decides.
func (d *dispatch) lookup(admitted []*entry) {
	for _, e := range admitted {
		if e.state == stLookup {
			d.toLookUp = append(d.toLookUp, e)
		}
	}
	if d.lookingUp != nil || len(d.toLookUp) == 0 {
		return
	}
	batch := d.toLookUp
	d.lookingUp, d.toLookUp = batch, nil
	guard, pool, ctx := d.w.c.guard, d.w.c.pool, d.callCtx
	timeout := min(lookupTimeout, d.w.c.cfg.CallTimeout)
	go func() {
		found := make([]bool, len(batch))
		byScope := map[string][]int{}
		for i, e := range batch {
			byScope[e.prep.Scope] = append(byScope[e.prep.Scope], i)
		}
		lctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		for scope, idx := range byScope {
			keys := make([]string, len(idx))
			for k, i := range idx {
				keys[k] = batch[i].prep.Key
			}
			got, err := guard.Claimed(lctx, pool, scope, keys)
			if err != nil {
				d.lookedUp <- lookupDone{}
				return
			}
			for k, i := range idx {
				found[i] = got[k]
			}
		}
		d.lookedUp <- lookupDone{found: found}
	}()
}

// lookupTimeout bounds a read of guard rows before calls (and so does
// Config.CallTimeout, when shorter): past it, the records call (the
// provider dedupes by the idempotency key, and the transaction's claim
// decides).
const lookupTimeout = 5 * time.Second

// lookupEnded settles the lookup in flight: records found are ready
// without calling, the others wait for their call; the records admitted
// meanwhile are read next.
func (d *dispatch) lookupEnded(r lookupDone) {
	batch := d.lookingUp
	d.lookingUp = nil
	if r.found == nil {
		d.log.Debug("looking up guard rows before calls failed; calling", "records", len(batch))
	}
	for i, e := range batch {
		if r.found != nil && r.found[i] {
			d.set(e, stReady)
			d.w.c.callMetrics.Skipped(e.prep.Handler)
		} else {
			d.set(e, stCall)
		}
	}
	d.lookup(nil)
}

// startCall starts e's pre-transaction call when the instance's call
// budget allows; it reports whether it did.
//
// The call's context ends at Config.CallTimeout: the error of a call that
// returns then (its context's) is a failed attempt, which says so.
func (d *dispatch) startCall(e *entry) bool {
	if !d.w.c.calls.acquire(d.w.wake, d.calls) {
		return false
	}
	d.calls++
	d.w.callsNow.Add(1)
	d.set(e, stCalling)
	now := time.Now()
	e.callStart = now
	if at := now.Add(d.slowAfter()); d.slowAt.IsZero() || at.Before(d.slowAt) {
		d.slowAt = at
	}
	ctx, call, attempt, done, gate := memo.With(d.callCtx, e.memo), e.prep.Call, e.attempts+1, d.done, d.gate
	timeout := d.w.c.cfg.CallTimeout
	d.w.c.runners.run(func() bool {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		err := call(cctx, attempt)
		if err != nil && errors.Is(cctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			err = fmt.Errorf("the pre-transaction call did not return within Config.CallTimeout (EXACTLY_CALL_TIMEOUT, %v): %w", timeout, err)
		}
		cancel()
		gate.mu.Lock()
		defer gate.mu.Unlock()
		if gate.abandoned {
			return false
		}
		done <- callDone{e: e, err: err, took: time.Since(now)}
		return true
	})
	return true
}

// slowAfter is how long a call runs before it is reported slow: half of
// Config.CallTimeout.
func (d *dispatch) slowAfter() time.Duration { return d.w.c.cfg.CallTimeout / 2 }

// checkSlow reports each call that ran past the slow-call threshold: once,
// at WARN, and as a held row (`exactly status`, `exactly inspect`) while it
// runs. It then sets slowAt to the next call's threshold.
func (d *dispatch) checkSlow(now time.Time) {
	if d.slowAt.IsZero() || now.Before(d.slowAt) {
		return
	}
	d.slowAt = time.Time{}
	after := d.slowAfter()
	for _, e := range d.win {
		if e.state != stCalling || e.slow {
			continue
		}
		at := e.callStart.Add(after)
		if now.Before(at) {
			if d.slowAt.IsZero() || at.Before(d.slowAt) {
				d.slowAt = at
			}
			continue
		}
		e.slow = true
		ran := now.Sub(e.callStart).Round(time.Millisecond)
		d.log.Warn("pre-transaction call still running; it holds its key (and a call slot) until it returns or its deadline passes",
			"offset", e.rec.Offset, "key", e.prep.Key, "attempt", e.attempts+1, "running_for", ran, "call_timeout", d.w.c.cfg.CallTimeout)
		if e.attempts == 0 {
			// A held record has its row already, which says why.
			e.listed = true
			d.w.noteHeld(e.rec.Offset, e.prep.Scope, dedupe.NormalizeKey(e.prep.Key), 0,
				fmt.Errorf("call running for more than %v (Config.CallTimeout %v)", ran, d.w.c.cfg.CallTimeout), e.callStart.Add(d.w.c.cfg.CallTimeout).Sub(now))
		}
	}
}

// drainCalls takes the ends of calls, and of a lookup, that are done.
func (d *dispatch) drainCalls() {
	for {
		select {
		case c := <-d.done:
			d.callEnded(c)
		case r := <-d.lookedUp:
			d.lookupEnded(r)
		default:
			return
		}
	}
}

func (d *dispatch) callEnded(c callDone) {
	d.calls--
	d.w.callsNow.Add(-1)
	d.w.c.calls.release()
	d.w.c.callMetrics.Took(c.e.prep.Handler, c.took, c.err)
	c.e.slow = false
	if c.err == nil {
		if c.e.listed && c.e.attempts == 0 {
			d.w.forgetHeld([]int64{c.e.rec.Offset})
		}
		c.e.listed = false
		d.set(c.e, stReady)
		return
	}
	c.e.listed = false
	d.failed(c.e, c.err, true)
}

// handlerPermanent reports whether err says retrying cannot help.
func handlerPermanent(err error) bool {
	return (&apply.HandlerError{Err: err}).Permanent()
}

// failed counts a failed attempt of e (of its call, fromCall) and holds
// it for its backoff; an attempt that leaves it exhausted (a permanent
// error, or its last attempt) is logged as what it is, fires no OnRetry,
// and is dead-lettered by the next transaction.
func (d *dispatch) failed(e *entry, err error, fromCall bool) {
	e.attempts++
	e.lastErr = err
	if e.attempts == 1 {
		d.held++
		d.w.setHeld(d.held)
	}
	d.linkWindow() // e holds its lanes' later records from now on
	d.set(e, stHeld)
	cfg := &d.w.c.cfg
	delay := backoff(e.attempts, cfg.RetryBackoff, cfg.RetryBackoffMax)
	if d.exhausted(e) {
		delay = 0 // dead-lettered by the next transaction
	}
	e.retryAt = time.Now().Add(delay)
	if d.retryAt.IsZero() || e.retryAt.Before(d.retryAt) {
		d.retryAt = e.retryAt
	}
	what := "handler failed"
	if fromCall {
		what = "pre-transaction call failed"
	}
	switch {
	case d.exhausted(e) && handlerPermanent(err):
		// Not a retry: the next transaction dead-letters it.
		d.log.Error(what+" with a permanent error; dead-lettering the record", "offset", e.rec.Offset, "key", e.prep.Key,
			"attempt", e.attempts, "error", err)
	case d.exhausted(e):
		d.log.Error(what+"; its attempts are used up, dead-lettering the record", "offset", e.rec.Offset, "key", e.prep.Key,
			"attempt", e.attempts, "error", err)
	default:
		d.log.Error(what+"; holding its key", "offset", e.rec.Offset, "key", e.prep.Key,
			"attempt", e.attempts, "retry_in", delay, "error", err)
		if fromCall {
			// A handler's failure is counted by its transaction.
			d.w.exec.Telemetry.CallRetried(context.Background(), e.prep.Handler)
		}
		d.w.retried(context.Background(), e.rec, err)
	}
	var scope, key string // unknown for a record that could not be keyed
	if e.prepErr == nil {
		scope, key = e.prep.Scope, dedupe.NormalizeKey(e.prep.Key)
	}
	d.w.noteHeld(e.rec.Offset, scope, key, e.attempts, err, delay)
	if d.holding {
		d.syncPaused()
	}
}

// wait blocks until something can change: records arrive, a call ends, a
// held record's backoff ends, a call slot frees, or the worker stops. It
// reports false when the worker stops.
func (d *dispatch) wait() bool {
	var timer <-chan time.Time
	at, ok := d.retryAt, !d.retryAt.IsZero()
	if d.pauseUntil.After(time.Now()) && (!ok || d.pauseUntil.Before(at)) {
		at, ok = d.pauseUntil, true
	}
	if !d.slowAt.IsZero() && (!ok || d.slowAt.Before(at)) {
		at, ok = d.slowAt, true
	}
	if d.pending != nil && d.admitAt.After(time.Now()) && (!ok || d.admitAt.Before(at)) {
		at, ok = d.admitAt, true
	}
	if ok {
		t := time.NewTimer(time.Until(at))
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-d.w.quit:
		return false
	case c := <-d.done:
		d.callEnded(c)
	case r := <-d.txEnd:
		d.ended(r)
	case r := <-d.lookedUp:
		d.lookupEnded(r)
	case <-d.w.wake:
	case <-timer:
	}
	return true
}

// run starts batch's transaction on the partition's transaction goroutine
// (txLoop); its end comes on txEnd (see ended).
func (d *dispatch) run(batch []*entry) {
	items := slices.Grow(d.items[:0], len(batch))[:len(batch)]
	d.items = items
	for i, e := range batch {
		d.set(e, stRunning)
		items[i] = apply.Item{Record: e.hrec, Attempt: e.attempts + 1, Prepared: &e.prep, PrepErr: e.prepErr, Memo: e.memo}
		if d.exhausted(e) {
			// Its last attempt overran the deadline, or its call failed
			// for good: dead-letter it without running it again.
			items[i].Exhausted = e.lastErr
		}
	}
	d.running = batch
	if len(items) == 1 && d.calls == 0 && d.uncalled == 0 && d.lookingUp == nil {
		// A lone record and nothing to overlap it with (no call
		// running or waiting to start): the dispatcher runs it itself,
		// sparing two goroutine hand-offs per transaction, which is
		// what a record costs most at batch 1.
		d.ended(d.runTx(items))
		return
	}
	if d.txStart == nil {
		d.txStart = make(chan []apply.Item, 1)
		go d.txLoop(d.txStart)
	}
	d.txStart <- items
}

// runTx runs one transaction of items, bounded by the rebalance timeout
// so that a hung connection or lock wait cannot hold a revoke for ever
// (the batch is then retried).
func (d *dispatch) runTx(items []apply.Item) txDone {
	ctx, cancel := context.WithTimeout(context.Background(), d.w.c.cfg.RebalanceTimeout)
	defer cancel()
	results, herr, err := d.w.exec.RunInto(ctx, items, d.results)
	return txDone{results: results, herr: herr, err: err}
}

// txLoop runs the transactions run hands it, one at a time, each ending
// on txEnd, until start is closed (see close). One goroutine for the
// partition's transactions, not one per transaction: its stack, grown by
// pgx's calls, stays grown.
func (d *dispatch) txLoop(start <-chan []apply.Item) {
	for items := range start {
		d.txEnd <- d.runTx(items)
	}
}

// ended settles the transaction in flight.
func (d *dispatch) ended(r txDone) {
	batch := d.running
	d.running = nil
	if r.results != nil {
		d.results = r.results
	}
	// Once settled, the results let their errors and keys go.
	defer clear(d.results)
	clear(d.items) // Run has returned: let the records and errors go with their batch
	for _, e := range batch {
		d.set(e, stReady) // unless settled below
	}
	if r.err != nil {
		d.runFailed(batch, r.err)
		return
	}
	cfg := &d.w.c.cfg
	d.outage = 0
	if d.clean++; d.clean >= 8 && d.batchCap < cfg.BatchMaxRecords {
		d.batchCap, d.clean = min(d.batchCap*2, cfg.BatchMaxRecords), 0
	}
	d.settle(context.Background(), batch, r.results, r.herr)
}

// runFailed handles a transaction that failed for an infrastructure
// reason: contention halves the batch cap and retries at once; an outage
// holds the partition's transactions for a backoff, as without key
// concurrency.
func (d *dispatch) runFailed(batch []*entry, err error) {
	w := d.w
	cfg := &w.c.cfg
	ctx := context.Background()
	if apply.IsContention(err) && len(batch) > 1 {
		d.batchCap, d.clean = max(len(batch)/2, 1), 0
		d.log.Info("transaction lost to contention; retrying at once with smaller batches",
			"first_offset", batch[0].rec.Offset, "records", len(batch), "batch_cap", d.batchCap, "error", err)
		w.retried(ctx, batch[0].rec, err)
		return
	}
	d.outage++
	delay := backoff(d.outage, cfg.RetryBackoff, cfg.RetryBackoffMax)
	if schemaProblem(err) {
		d.log.Error("a table of exactly's is missing or behind: run migrate (Service.Migrate or `exactly migrate`); holding the partition and retrying the batch",
			"guard_table", w.c.guard.Table().Sanitize(), "first_offset", batch[0].rec.Offset, "records", len(batch), "retry_in", delay, "error", err)
	} else {
		d.log.Warn("transaction failed; retrying the batch when the database is back",
			"first_offset", batch[0].rec.Offset, "records", len(batch), "retry_in", delay, "error", err)
	}
	w.retried(ctx, batch[0].rec, err)
	d.pauseUntil = time.Now().Add(delay)
}

// settle reports and retires the committed records of batch, holds the
// one that failed, and marks the lowest unfinished offset.
func (d *dispatch) settle(ctx context.Context, batch []*entry, results []apply.Result, herr *apply.HandlerError) {
	done := slices.Grow(d.doneRecs[:0], len(results))[:len(results)]
	d.doneRecs = done
	defer clear(done)
	var wasHeld []int64 // nil unless a record had failed before
	for i := range results {
		done[i] = batch[i].rec
		d.set(batch[i], stDone)
		d.retire(batch[i])
		if batch[i].behind {
			d.behind--
		}
		if batch[i].hasCall {
			d.withCall--
		}
		if batch[i].attempts > 0 {
			d.held--
			wasHeld = append(wasHeld, batch[i].rec.Offset)
		}
	}
	d.w.setHeld(d.held)
	if wasHeld != nil {
		d.w.forgetHeld(wasHeld)
		d.syncPaused()
	}
	d.w.report(ctx, done, results)
	if herr != nil {
		batch[herr.Index].suspect = true
		d.failed(batch[herr.Index], herr.Err, false)
	}
	if d.held == 0 && d.withCall == 0 {
		d.linked = false // nothing can wait for an earlier record now
	}
	d.w.release(done) // before compact recycles the records it reads
	d.compact()
	mark := d.next
	if len(d.win) > 0 {
		mark = kgo.EpochOffset{Epoch: d.win[0].rec.LeaderEpoch, Offset: d.win[0].rec.Offset}
	}
	if len(done) > 0 {
		d.w.markAt(mark)
	}
}

// callSlots is the instance's budget of pre-transaction calls
// (Config.MaxCallsInFlight), shared by its partitions' workers. A worker
// that finds no slot for a call it could start waits in line; a freed slot
// wakes the first in line, and a worker woken with nothing to call passes
// the slot on (kick), so that a slot never sits free while a worker waits.
//
// A partition takes at most its share of the slots: max divided by the
// partitions that make calls (join), rounded up, at least 1. Calls that
// hang on one partition then hold its share only, and the others' calls go
// on.
type callSlots struct {
	mu      sync.Mutex
	max     int
	free    int
	parts   int // partitions whose handlers make calls (join)
	waiters []chan struct{}
}

func newCallSlots(n int) *callSlots {
	return &callSlots{max: n, free: n}
}

// join counts a partition whose handler makes calls; leave uncounts it.
func (s *callSlots) join() {
	s.mu.Lock()
	s.parts++
	s.mu.Unlock()
}

func (s *callSlots) leave() {
	s.mu.Lock()
	s.parts--
	s.mu.Unlock()
}

// shareLocked is a partition's share of the slots.
func (s *callSlots) shareLocked() int {
	if s.parts <= 1 {
		return s.max
	}
	return max(1, (s.max+s.parts-1)/s.parts)
}

// acquire takes a slot for a partition whose calls hold held slots, or
// reports false: at its share, without waiting in line (one of its own
// calls ends first, and wakes its worker), or with no slot free, with wake
// put in line.
func (s *callSlots) acquire(wake chan struct{}, held int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if held >= s.shareLocked() {
		s.leaveLocked(wake)
		return false
	}
	if s.free > 0 {
		s.free--
		s.leaveLocked(wake)
		return true
	}
	if !slices.Contains(s.waiters, wake) {
		s.waiters = append(s.waiters, wake)
	}
	return false
}

// available returns the slots a partition whose calls hold held slots
// may take now.
func (s *callSlots) available(held int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(0, min(s.free, s.shareLocked()-held))
}

// release returns a slot and wakes the first worker in line.
func (s *callSlots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free++
	s.wakeLocked()
}

// kick, called by a worker (its wake) that has no call to start, leaves
// the line and passes a free slot on to the next worker in it.
func (s *callSlots) kick(wake chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leaveLocked(wake)
	if s.free > 0 {
		s.wakeLocked()
	}
}

func (s *callSlots) leaveLocked(wake chan struct{}) {
	if i := slices.Index(s.waiters, wake); i >= 0 {
		s.waiters = slices.Delete(s.waiters, i, i+1)
	}
}

func (s *callSlots) wakeLocked() {
	if len(s.waiters) == 0 {
		return
	}
	w := s.waiters[0]
	s.waiters = slices.Delete(s.waiters, 0, 1)
	select {
	case w <- struct{}{}:
	default:
	}
}
