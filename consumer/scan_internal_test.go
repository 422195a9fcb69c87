package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
)

// scanWindow is a dispatcher whose window holds records of distinct keys
// at offsets 0, 1, …, ready to run; suspect lists the offsets whose handler
// failed in a transaction.
func scanWindow(n int, suspect ...int64) *dispatch {
	d := &dispatch{w: &worker{c: &Consumer{cfg: Config{KeyConcurrency: 64, BatchMaxRecords: 100}}}, batchCap: 100}
	for off := range int64(n) {
		e := &entry{rec: &kgo.Record{Offset: off}}
		for _, s := range suspect {
			e.suspect = e.suspect || s == off
		}
		d.set(e, stReady)
		d.win = append(d.win, e)
	}
	return d
}

func offsets(batch []*entry) []int64 {
	var out []int64
	for _, e := range batch {
		out = append(out, e.rec.Offset)
	}
	return out
}

// TestSuspectRecordRunsInATransactionOfItsOwn: a record whose handler
// failed in a transaction is never batched with other keys' records, so
// that failing again it rolls none of theirs back. First in the window it
// runs alone; behind others, they run first and it runs alone after.
func TestSuspectRecordRunsInATransactionOfItsOwn(t *testing.T) {
	d := scanWindow(4, 0)
	if got := offsets(d.scan()); len(got) != 1 || got[0] != 0 {
		t.Fatalf("suspect first: batch %v, want [0] alone", got)
	}

	d = scanWindow(4, 2)
	first := d.scan()
	if got := offsets(first); len(got) != 3 || got[0] != 0 || got[1] != 1 || got[2] != 3 {
		t.Fatalf("suspect at offset 2: first batch %v, want [0 1 3] (without it)", got)
	}
	for _, e := range first {
		d.set(e, stDone)
	}
	if got := offsets(d.scan()); len(got) != 1 || got[0] != 2 {
		t.Fatalf("suspect at offset 2: second batch %v, want [2] alone", got)
	}

	d = scanWindow(3)
	if got := offsets(d.scan()); len(got) != 3 {
		t.Fatalf("no suspect: batch %v, want all 3 records together", got)
	}
}

// TestRetireForgetsOnlyTheLastOfALane: a finished record leaves d.last
// only for the lanes it is still the last admitted record of, so a lane's
// later record keeps its predecessor, and once every record finished no
// lane is left (none kept alive by the map). A record of more than 64
// lanes (many lock keys) is tracked past its 64th lane too.
func TestRetireForgetsOnlyTheLastOfALane(t *testing.T) {
	d := &dispatch{last: map[uint64]*entry{}}
	a, b, c := &entry{}, &entry{}, &entry{}
	d.link(a, []uint64{1, 2})
	d.link(b, []uint64{2, 3})
	d.link(c, []uint64{1})
	if b.prev[0].e != a || b.prev[1].e != nil || c.prev[0].e != a {
		t.Fatalf("predecessors: b %v, c %v; want b after a on lane 2 only, c after a on lane 1", b.prev, c.prev)
	}
	lanesOf := func() map[uint64]*entry { return d.last }
	d.retire(a) // the last of no lane
	if got := lanesOf(); len(got) != 3 || got[1] != c || got[2] != b || got[3] != b {
		t.Fatalf("after a finished: %v, want lanes 1→c, 2→b, 3→b", got)
	}
	d.retire(c)
	if got := lanesOf(); len(got) != 2 || got[2] != b || got[3] != b {
		t.Fatalf("after c finished: %v, want lanes 2→b, 3→b", got)
	}
	n := &entry{}
	d.link(n, []uint64{1})
	if n.prev[0].e != nil {
		t.Errorf("a record after lane 1's records finished waits for %p, want none", n.prev[0].e)
	}
	d.retire(b)
	d.retire(n)
	if len(d.last) != 0 {
		t.Fatalf("lanes left after every record finished: %v", d.last)
	}

	many := make([]uint64, 70)
	for i := range many {
		many[i] = uint64(100 + i)
	}
	x, y := &entry{}, &entry{}
	d.link(x, many)
	d.link(y, []uint64{100, 169}) // x's 1st and 70th lanes
	if y.prev[0].e != x || y.prev[1].e != x {
		t.Fatalf("y's predecessors %v, want x on both lanes", y.prev)
	}
	d.retire(x)
	if len(d.last) != 2 || d.last[100] != y || d.last[169] != y {
		t.Fatalf("after x finished: %d lanes, want only y's 2", len(d.last))
	}
	d.retire(y)
	if len(d.last) != 0 {
		t.Fatalf("%d lanes left after x and y finished", len(d.last))
	}
}

// TestRecycledEntryIsNoLongerAPredecessor: once a finished record's entry
// is compacted out of the window and reused for a later record, a record
// that was admitted behind the finished one no longer waits for it, though
// its entry now holds an unfinished record.
func TestRecycledEntryIsNoLongerAPredecessor(t *testing.T) {
	d := scanWindow(0)
	d.last = map[uint64]*entry{}
	a := d.newEntry(&kgo.Record{Offset: 0})
	d.link(a, []uint64{1})
	d.set(a, stReady)
	b := d.newEntry(&kgo.Record{Offset: 1})
	d.link(b, []uint64{1})
	d.set(b, stReady)
	d.win = []*entry{a, b}
	if d.clear(b, false) {
		t.Fatal("b runs while a, before it on its lane, has not finished")
	}
	d.set(a, stDone)
	d.retire(a)
	d.compact()
	if len(d.win) != 1 || d.win[0] != b {
		t.Fatalf("window after a finished: %d records, want b alone", len(d.win))
	}
	c := d.newEntry(&kgo.Record{Offset: 2})
	if c != a {
		t.Fatal("the next record did not reuse a's entry")
	}
	d.link(c, []uint64{2})
	d.set(c, stReady)
	if !d.clear(b, false) {
		t.Error("b waits for its lane's earlier record, which finished (its entry now holds the record at offset 2)")
	}
}

// TestWindowAdmitsWhatTheNextTransactionsNeedUntilARecordIsHeld: with
// nothing held, the dispatcher admits KeyConcurrency + 2 × BatchMaxRecords
// records and leaves the rest queued (fetched, not decoded); once a record
// is held, it admits as far as MaxOffsetGap allows, so that other keys'
// records behind the held one run.
func TestWindowAdmitsWhatTheNextTransactionsNeedUntilARecordIsHeld(t *testing.T) {
	d, w := keyedWindow(100, 300, func(off int64) string { return strconv.FormatInt(off, 10) })
	d.fill()
	if want := 4 + 2*10; len(d.win) != want || len(w.queue) != 300-want {
		t.Fatalf("nothing held: %d records admitted and %d queued, want %d admitted", len(d.win), len(w.queue), want)
	}
	d.fill()
	if len(d.win) != 24 {
		t.Fatalf("nothing held, filled again: %d records admitted, want still 24", len(d.win))
	}
	// The lowest record fails an attempt (as d.failed counts it).
	d.held++
	d.set(d.win[0], stHeld)
	d.fill()
	if len(d.win) != 100 || w.queue[0].Offset != 100 {
		t.Fatalf("a record held: %d records admitted, want 100 (MaxOffsetGap past the held one)", len(d.win))
	}
}

// TestRecordsBehindABusyKeyDoNotFillTheWindow: the records admitted behind
// an unfinished record of their key (a hot key's backlog behind a slow
// call) do not count against what the next transactions need, so the
// other keys' records after them are admitted and can run.
func TestRecordsBehindABusyKeyDoNotFillTheWindow(t *testing.T) {
	d, _ := keyedWindow(1000, 300, func(off int64) string {
		if off < 100 {
			return "hot"
		}
		return strconv.FormatInt(off, 10)
	}, handler.WithCall(func(context.Context, handler.Message[json.RawMessage]) error { return nil }),
		handler.NaturallyIdempotent()) // its records call without a lookup first
	d.fill()
	// The hot key's first record and 23 others count (4 + 2 × 10); its
	// 99 later records do not.
	if want := 100 + 23; len(d.win) != want {
		t.Fatalf("%d records admitted, want %d (the hot key's 100 and 23 of the keys after it)", len(d.win), want)
	}
	if d.behind != 99 {
		t.Errorf("%d records counted behind their key, want 99", d.behind)
	}
}

// keyedWindow is a dispatcher (KeyConcurrency 4, BatchMaxRecords 10,
// MaxOffsetGap gap) for a handler built with opts whose queue holds n
// records at offsets 0, 1, …, with the Kafka keys keyOf gives.
func keyedWindow(gap, n int, keyOf func(off int64) string, opts ...handler.Option) (*dispatch, *worker) {
	h := handler.New("jobs", handler.FromCoordinates[json.RawMessage](),
		func(context.Context, pgx.Tx, handler.Message[json.RawMessage]) error { return nil }, opts...)
	cfg := Config{KeyConcurrency: 4, BatchMaxRecords: 10, MaxOffsetGap: gap, RetryBackoff: time.Hour, RetryBackoffMax: time.Hour}
	log := slog.New(slog.DiscardHandler)
	w := &worker{c: &Consumer{cfg: cfg, limit: newInflight(0, 0), log: log}, topic: "jobs", exec: &apply.Executor{Handler: h},
		waits: &waitWriter{live: map[int64]heldWrite{}, wake: make(chan struct{}, 1)}} // held rows kept, not written
	for off := range int64(n) {
		w.queue = append(w.queue, &kgo.Record{Topic: "jobs", Offset: off, Key: []byte(keyOf(off)), Value: []byte(`{}`)})
	}
	return newDispatch(w, log), w
}

// TestAFailureLinksTheWindowInOffsetOrder: while nothing is held and no
// record has a call, records are admitted without lanes (every one is
// ready, and transactions take them in offset order); the first failure
// gives the unfinished records their lanes in offset order, so the failed
// record's later records wait for it while other keys' records run, and
// once it has settled records are admitted without lanes again.
func TestAFailureLinksTheWindowInOffsetOrder(t *testing.T) {
	d, _ := keyedWindow(1000, 30, func(off int64) string {
		if off%3 == 0 {
			return "a" // offsets 0, 3, 6, …
		}
		return "k" + strconv.FormatInt(off, 10)
	})
	d.fill()
	if d.linked || len(d.last) != 0 || slices.ContainsFunc(d.win, func(e *entry) bool { return e.linked }) {
		t.Fatalf("nothing held, no calls: linked %v with %d lanes, want no lanes given", d.linked, len(d.last))
	}
	first := d.scan()
	if got := offsets(first); len(got) != 10 || got[0] != 0 || got[9] != 9 {
		t.Fatalf("first batch %v, want offsets 0–9 in order", got)
	}
	d.running = first
	for _, e := range first {
		d.set(e, stRunning)
	}
	// Offset 3's handler fails: 0–2 commit, 3 is held, 4–9 roll back.
	d.ended(txDone{results: make([]apply.Result, 3), herr: &apply.HandlerError{Index: 3, Err: errors.New("boom")}})
	if !d.linked {
		t.Fatal("a record is held, and the window is still unlinked")
	}
	var six, seven *entry
	for _, e := range d.win {
		switch e.rec.Offset {
		case 6:
			six = e
		case 7:
			seven = e
		}
		if e.state != stDone && !e.linked {
			t.Errorf("offset %d unfinished and without lanes after the failure", e.rec.Offset)
		}
	}
	if d.clear(six, false) {
		t.Error("offset 6 (key a) may run while offset 3 (key a) is held")
	}
	if !d.clear(seven, false) {
		t.Error("offset 7 (its own key) waits though nothing before it shares its lanes")
	}
	second := offsets(d.scan())
	if slices.Contains(second, 3) || slices.Contains(second, 6) || !slices.Contains(second, 4) || !slices.Contains(second, 7) {
		t.Fatalf("batch while 3 is held: %v, want other keys' records (4, 7, …) without 3 or 6", second)
	}
	// Offset 3 commits on its retry (the others wait their turn).
	held := d.win[slices.IndexFunc(d.win, func(e *entry) bool { return e.rec.Offset == 3 })]
	d.set(held, stRunning)
	d.running = []*entry{held}
	d.ended(txDone{results: make([]apply.Result, 1)})
	if d.held != 0 || d.linked {
		t.Fatalf("after the held record committed: held %d, linked %v; want 0 and unlinked", d.held, d.linked)
	}
	if !d.clear(six, false) {
		t.Error("offset 6 still waits after offset 3 committed")
	}
}

// The paused row names held records only when they stop the partition: a
// window full while its lowest record is not held (it waits for a call, or
// runs) is flow control, even with another record held (no reason); once
// the records before the held one commit and it is the lowest at the
// offset gap, the partition is paused by it (offset_gap at its offset),
// though fetching stayed paused throughout.
func TestPausedReasonFollowsTheLowestRecord(t *testing.T) {
	d, w := keyedWindow(10, 30, func(off int64) string { return "k" + strconv.FormatInt(off, 10) })
	d.fill()
	if !d.holding || len(d.win) != 10 {
		t.Fatalf("window of %d records, holding %v; want 10 and fetching paused at the offset gap", len(d.win), d.holding)
	}
	// Offset 5's call fails: it is held; offset 0, the lowest, is not.
	d.failed(d.win[5], errors.New("call failed"), true)
	if w.pausedReason != "" {
		t.Errorf("paused reason %q with the lowest record (0) not held, want none: a full window is flow control", w.pausedReason)
	}
	// Offsets 0–4 commit: 5, held, is the lowest, and the window, refilled
	// up to the offset gap, is full again.
	d.running = slices.Clone(d.win[:5])
	for _, e := range d.running {
		d.set(e, stRunning)
	}
	d.ended(txDone{results: make([]apply.Result, 5)})
	d.fill()
	if !d.holding {
		t.Fatal("fetching resumed with the window full at the offset gap")
	}
	if w.pausedReason != pausedOffsetGap || w.waits.pending.paused != pausedSet || w.waits.pending.lowest != 5 {
		t.Errorf("paused reason %q (queued row: op %d, lowest %d) with the held record (5) lowest at the offset gap, want %q at 5",
			w.pausedReason, w.waits.pending.paused, w.waits.pending.lowest, pausedOffsetGap)
	}
	// Offset 6 fails too, then 5 commits: 6, held, is the lowest, and the
	// row moves to it.
	six := d.win[slices.IndexFunc(d.win, func(e *entry) bool { return e.rec.Offset == 6 })]
	d.failed(six, errors.New("call failed"), true)
	five := d.win[0]
	d.running = []*entry{five}
	d.set(five, stRunning)
	d.ended(txDone{results: make([]apply.Result, 1)})
	d.fill()
	if w.pausedReason != pausedOffsetGap || w.waits.pending.paused != pausedSet || w.waits.pending.lowest != 6 {
		t.Errorf("paused reason %q (queued row: op %d, lowest %d) once offset 5 committed and 6 is held and lowest, want %q at 6",
			w.pausedReason, w.waits.pending.paused, w.waits.pending.lowest, pausedOffsetGap)
	}
}

// The records counted behind an unfinished record of their lane (a held
// record's key backlog) stop counting as they finish: once they all have,
// the count is 0 again, and the window admits only as far as the next
// transactions need (KeyConcurrency + 2·BatchMaxRecords records), not as
// far again as the backlog once was.
func TestBehindCountEndsWithTheBacklog(t *testing.T) {
	d, w := keyedWindow(100, 400, func(off int64) string {
		if off%3 == 0 {
			return "a" // offsets 0, 3, 6, …
		}
		return "k" + strconv.FormatInt(off, 10)
	})
	ahead := w.c.cfg.KeyConcurrency + 2*w.c.cfg.BatchMaxRecords
	run := func(batch []*entry, results int, herr *apply.HandlerError) {
		d.running = batch
		for _, e := range batch {
			d.set(e, stRunning)
		}
		d.ended(txDone{results: make([]apply.Result, results), herr: herr})
	}
	d.fill()
	first := d.scan()
	// Offset 3's handler fails: 0–2 commit, 3 is held, and key a's later
	// records wait behind it.
	run(first, 3, &apply.HandlerError{Index: 3, Err: errors.New("boom")})
	d.fill()
	if d.behind == 0 {
		t.Fatal("no record counted behind the held record of key a")
	}
	held := d.win[slices.IndexFunc(d.win, func(e *entry) bool { return e.rec.Offset == 3 })]
	d.unhold(held) // its backoff ends
	for range 100 {
		if !slices.ContainsFunc(d.win, func(e *entry) bool { return e.state != stDone && e.behind }) {
			break
		}
		d.fill()
		batch := d.scan()
		if len(batch) == 0 {
			t.Fatal("nothing to run while records wait behind others")
		}
		run(batch, len(batch), nil)
	}
	if d.behind != 0 {
		t.Errorf("%d records counted behind once every record admitted behind another finished, want 0", d.behind)
	}
	d.fill()
	if n := len(d.win) - d.finished; n > ahead {
		t.Errorf("%d unfinished records admitted with nothing held, want at most %d", n, ahead)
	}
}
