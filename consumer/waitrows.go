package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/runtime/pgarray"
	"github.com/exactly-go/exactly/internal/runtime/redact"
)

// What a partition waits on, in the database (the guard's held and paused
// tables, dedupe.Guard.HeldTable and PausedTable), for `exactly status` and
// `exactly inspect`, which read only the database. The rows are written
// only on the failure and pause paths, and never by the partition's worker
// itself: it hands each change to its partition's waitWriter, whose
// goroutine writes them, so a slow or dead database, or a lock on these
// tables, never holds the partition (nor, with key concurrency, any key).
//
// The writer's queue is a picture of the state to write, not a log of
// writes: the latest state of each held record (its row, or its deletion
// once it finished) and of the partition's paused row wins, so the queue
// holds at most one row per held record (the window bounds those, see
// Config.MaxOffsetGap) and one paused state. Finished records' offsets are
// kept until written, up to waitForgetMax; past that (a database stuck
// while many held records finish), they collapse into one deletion of
// every held row of the partition but those of the records still held.
// The writer takes the whole picture at once and writes it in at most four
// statements, in this order: the clearing of the partition's rows (when
// the worker starts), the deletion of finished records' rows (one
// statement for all of them), the held rows (one upsert for all of them),
// the paused row (upsert or delete). A state queued after a picture was
// taken goes into the next one, so no write is ever applied before one
// queued earlier for the same row (a held row's deletion never overtakes
// its insertion).
//
// Each statement runs on the pool outside any transaction, bounded by
// waitRowTimeout, best effort: one that fails is logged (at warn the first
// time per partition, at debug after; a clearing always at debug) and not
// retried; the next change of
// the same row writes it again. The rows can therefore lag behind the
// process, for a moment or, while the database fails, longer. A record
// that succeeds on its first attempt writes nothing. The writer clears
// the partition's rows first when its worker starts (so rows a killed
// process left are cleared by the next owner), before any row it writes;
// when the worker stops, what is still queued is superseded by one final
// clearing of the partition's rows (if the worker wrote any, or its first
// clearing is still queued), which waits for the statement in flight (a
// statement cancelled from the client may still run on the server after a
// clearing sent on another connection, and leave its row behind), so
// stopping takes at most two statements' bounds; the worker then waits for
// the writer's goroutine to end.
//
// Every waitReconcileEvery the writer also writes its whole state again:
// it deletes the partition's held rows but its own, upserts every row it
// holds and sets or deletes the paused row as it stands. A previous owner
// that lost the partition without knowing it (a zombie, stopped or cut off
// past its session timeout) may write after the new owner's first
// clearing, or clear the new owner's rows when it finally stops; without
// the reconciliation a row it left would be reported held, and need a
// human, until the partition changed owner again.

// waitRowTimeout bounds one statement writing the held or paused tables.
const waitRowTimeout = 2 * time.Second

// waitReconcileEvery is how often a writer writes its whole state again
// (see above).
const waitReconcileEvery = time.Minute

// waitForgetMax is the most finished held records' offsets queued for
// deletion one by one; past it they collapse into one deletion of every
// held row of the partition but those of the records still held.
const waitForgetMax = 4096

// Reasons of a paused row (the paused table's check constraint).
const (
	pausedHeldLimit = "held_limit"
	pausedOffsetGap = "offset_gap"
)

// heldWrite is the held row of a record to write: its state after its
// latest failed attempt.
type heldWrite struct {
	// scope and key are values, not pointers into the record's state: the
	// writer reads them on its own goroutine, after the dispatcher may
	// have reused that state for another record. Not valid (SQL null)
	// when the record could not be keyed.
	scope, key pgarray.NullString
	attempts   int
	lastError  string
	// retryAt is when the record runs again, on this process's clock: the
	// row's retry_at is the database's now() plus what is left of it when
	// the row is written.
	retryAt time.Time
}

// pausedOp is what to do with the partition's paused row.
type pausedOp uint8

const (
	pausedKeep   pausedOp = iota // nothing queued
	pausedSet                    // write it (reason, lowest)
	pausedDelete                 // delete it
)

// waitPicture is the state queued for the wait rows of one partition.
type waitPicture struct {
	// clear deletes every row of the partition before anything else.
	clear bool
	// held is the rows to write, by offset.
	held map[int64]heldWrite
	// forget is the offsets whose rows to delete (disjoint from held);
	// prune, set once it would grow past waitForgetMax, deletes instead
	// every held row of the partition but those of keep, the records held
	// when the picture is taken.
	forget map[int64]struct{}
	prune  bool
	keep   []int64
	// paused is what to do with the paused row; reason and lowest are
	// its values for pausedSet. keepSince, set by a reconciliation, leaves
	// an existing row's paused_since as it is.
	paused    pausedOp
	reason    string
	lowest    int64
	keepSince bool
	// reconcile asks take for the whole state (see waitReconcileEvery).
	reconcile bool
}

// waitWriter writes the wait rows of one partition worker in a goroutine
// of its own (see the comment above waitRowTimeout). Its queue methods
// never block on the database; close stops it.
type waitWriter struct {
	pool                      *pgxpool.Pool
	log                       *slog.Logger
	heldTable, pausedTable    string // sanitized identifiers
	group, topic, handlerName string
	partition                 int32

	mu      sync.Mutex
	pending waitPicture
	// live is the latest queued held row of each record held now, by
	// offset.
	live map[int64]heldWrite
	// pausedNow, pausedReason and pausedLowest are the paused row as the
	// latest pause or resume left it.
	pausedNow    bool
	pausedReason string
	pausedLowest int64
	// wrote: a held or paused row was queued since the writer started.
	wrote   bool
	closing bool

	wake chan struct{}
	// ctx bounds the statements other than clearings; the goroutine
	// cancels it when it ends.
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	// warned: a failed write was logged at warn. Only run touches it.
	warned bool
	// every is how often the state is written whole (waitReconcileEvery).
	every time.Duration
}

// newWaitWriter starts the writer of the wait rows of group's topic and
// partition, handled by handlerName, in the tables heldTable and
// pausedTable (sanitized identifiers); its first write clears the
// partition's rows. Its goroutine runs until close.
func newWaitWriter(pool *pgxpool.Pool, log *slog.Logger, heldTable, pausedTable, group, topic string, partition int32, handlerName string) *waitWriter {
	return newWaitWriterEvery(pool, log, heldTable, pausedTable, group, topic, partition, handlerName, waitReconcileEvery)
}

// newWaitWriterEvery is newWaitWriter writing its whole state every every.
func newWaitWriterEvery(pool *pgxpool.Pool, log *slog.Logger, heldTable, pausedTable, group, topic string, partition int32, handlerName string, every time.Duration) *waitWriter {
	ww := makeWaitWriter(pool, log, heldTable, pausedTable, group, topic, partition, handlerName, every)
	go ww.run()
	return ww
}

// makeWaitWriter is newWaitWriterEvery without starting its goroutine
// (run), its first clearing queued.
func makeWaitWriter(pool *pgxpool.Pool, log *slog.Logger, heldTable, pausedTable, group, topic string, partition int32, handlerName string, every time.Duration) *waitWriter {
	ctx, cancel := context.WithCancel(context.Background())
	ww := &waitWriter{
		pool: pool, log: log, heldTable: heldTable, pausedTable: pausedTable,
		group: group, topic: topic, partition: partition, handlerName: handlerName,
		pending: waitPicture{clear: true}, live: map[int64]heldWrite{},
		wake: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{}), every: every,
	}
	ww.wake <- struct{}{}
	return ww
}

// signal wakes the writer's goroutine; it never blocks.
func (ww *waitWriter) signal() {
	select {
	case ww.wake <- struct{}{}:
	default:
	}
}

// hold queues the held row of the record at offset, replacing any queued
// state of that row.
func (ww *waitWriter) hold(offset int64, row heldWrite) {
	ww.mu.Lock()
	defer ww.mu.Unlock()
	if ww.closing {
		return
	}
	if ww.pending.held == nil {
		ww.pending.held = map[int64]heldWrite{}
	}
	ww.pending.held[offset] = row
	delete(ww.pending.forget, offset)
	ww.live[offset] = row
	ww.wrote = true
	ww.signal()
}

// forget queues the deletion of the held rows of the records at offsets,
// which finished, replacing any queued state of those rows.
func (ww *waitWriter) forget(offsets []int64) {
	ww.mu.Lock()
	defer ww.mu.Unlock()
	if ww.closing {
		return
	}
	p := &ww.pending
	for _, o := range offsets {
		delete(ww.live, o)
		delete(p.held, o)
		if p.prune {
			continue // the prune deletes it: it is no longer live
		}
		if p.forget == nil {
			p.forget = map[int64]struct{}{}
		}
		p.forget[o] = struct{}{}
	}
	if len(p.forget) > waitForgetMax {
		p.prune, p.forget = true, nil
	}
	ww.signal()
}

// pause queues the partition's paused row (reason, lowest unfinished
// offset), replacing any queued state of it.
func (ww *waitWriter) pause(reason string, lowest int64) {
	ww.mu.Lock()
	defer ww.mu.Unlock()
	if ww.closing {
		return
	}
	ww.pending.paused, ww.pending.reason, ww.pending.lowest, ww.pending.keepSince = pausedSet, reason, lowest, false
	ww.pausedNow, ww.pausedReason, ww.pausedLowest = true, reason, lowest
	ww.wrote = true
	ww.signal()
}

// move queues the partition's paused row with lowest, its new lowest
// unfinished offset, for the same pause: its reason and paused_since stay
// (unless the pause itself is still queued, whose paused_since is then the
// time it is written).
func (ww *waitWriter) move(lowest int64) {
	ww.mu.Lock()
	defer ww.mu.Unlock()
	if ww.closing || !ww.pausedNow {
		return
	}
	p := &ww.pending
	keep := p.paused == pausedKeep || (p.paused == pausedSet && p.keepSince)
	p.paused, p.reason, p.lowest, p.keepSince = pausedSet, ww.pausedReason, lowest, keep
	ww.pausedLowest = lowest
	ww.signal()
}

// resume queues the deletion of the partition's paused row, replacing any
// queued state of it.
func (ww *waitWriter) resume() {
	ww.mu.Lock()
	defer ww.mu.Unlock()
	if ww.closing {
		return
	}
	ww.pending.paused, ww.pending.reason, ww.pending.keepSince = pausedDelete, "", false
	ww.pausedNow = false
	ww.signal()
}

// close stops the writer: the statement in flight runs to its end (or its
// bound), what is queued is superseded by one clearing of the
// partition's rows (when the writer queued any row, or its first clearing
// is still queued), and close returns once the goroutine ended: after at
// most two statements' bounds (waitRowTimeout).
func (ww *waitWriter) close() {
	ww.mu.Lock()
	if !ww.closing {
		ww.closing = true
		ww.signal()
	}
	ww.mu.Unlock()
	<-ww.done
}

// take returns the queued picture and empties the queue; wrote and
// closing are the writer's at that moment.
func (ww *waitWriter) take() (p waitPicture, wrote, closing bool) {
	ww.mu.Lock()
	defer ww.mu.Unlock()
	p, ww.pending = ww.pending, waitPicture{}
	if p.reconcile {
		// The whole state: every row held now, every other held row of
		// the partition deleted, the paused row as it stands (its
		// paused_since kept unless a pause is queued).
		p.prune, p.forget = true, nil
		if p.held == nil {
			p.held = make(map[int64]heldWrite, len(ww.live))
		}
		maps.Copy(p.held, ww.live)
		switch {
		case p.paused != pausedKeep:
		case ww.pausedNow:
			p.paused, p.reason, p.lowest, p.keepSince = pausedSet, ww.pausedReason, ww.pausedLowest, true
		default:
			p.paused = pausedDelete
		}
	}
	if p.prune {
		p.keep = slices.Sorted(maps.Keys(ww.live))
	}
	return p, ww.wrote, ww.closing
}

// run is the writer's goroutine: it writes each picture queued until the
// writer closes, then clears the partition's rows if it wrote any.
func (ww *waitWriter) run() {
	defer close(ww.done)
	defer ww.cancel()
	tick := time.NewTicker(ww.every)
	defer tick.Stop()
	for {
		select {
		case <-ww.wake:
		case <-tick.C:
			ww.mu.Lock()
			ww.pending.reconcile = true
			ww.mu.Unlock()
		}
		p, wrote, closing := ww.take()
		if closing {
			if wrote || p.clear {
				ww.clearRows()
			}
			return
		}
		ww.write(p)
	}
}

// write writes p's statements in order, stopping early when the writer
// closes (its final clearing supersedes the rest).
func (ww *waitWriter) write(p waitPicture) {
	if p.clear {
		ww.clearRows()
	}
	if p.prune {
		ww.exec(ww.ctx, "finished held records", `delete from `+ww.heldTable+` where consumer_group = $1 and topic = $2 and partition = $3 and record_offset <> all($4::bigint[])`,
			ww.group, ww.topic, ww.partition, p.keep)
	} else if len(p.forget) > 0 {
		ww.exec(ww.ctx, "finished held records", `delete from `+ww.heldTable+` where consumer_group = $1 and topic = $2 and partition = $3 and record_offset = any($4::bigint[])`,
			ww.group, ww.topic, ww.partition, slices.Sorted(maps.Keys(p.forget)))
	}
	if len(p.held) > 0 && !ww.isClosing() {
		n := len(p.held)
		offsets, scopes, keys := make([]int64, 0, n), make(pgarray.NullText, 0, n), make(pgarray.NullText, 0, n)
		attempts, errs, retryIn := make([]int32, 0, n), make([]string, 0, n), make([]int64, 0, n)
		for _, o := range slices.Sorted(maps.Keys(p.held)) {
			h := p.held[o]
			offsets, scopes, keys = append(offsets, o), append(scopes, h.scope), append(keys, h.key)
			attempts, errs = append(attempts, int32(h.attempts)), append(errs, h.lastError)
			retryIn = append(retryIn, max(time.Until(h.retryAt), 0).Microseconds())
		}
		ww.exec(ww.ctx, "held records", `insert into `+ww.heldTable+` as h (consumer_group, topic, partition, record_offset, scope, key, handler, attempts, last_error, retry_at)
select $1, $2, $3, r.o, r.s, r.k, $4, r.a, r.e, now() + r.us * interval '1 microsecond'
from unnest($5::bigint[], $6::text[], $7::text[], $8::integer[], $9::text[], $10::bigint[]) as r(o, s, k, a, e, us)
on conflict (consumer_group, topic, partition, record_offset) do update
set scope = excluded.scope, key = excluded.key, handler = excluded.handler, attempts = excluded.attempts,
    last_error = excluded.last_error, retry_at = excluded.retry_at`,
			ww.group, ww.topic, ww.partition, ww.handlerName, offsets, scopes, keys, attempts, errs, retryIn)
	}
	switch {
	case ww.isClosing():
	case p.paused == pausedSet:
		ww.exec(ww.ctx, "paused partition", `insert into `+ww.pausedTable+` as p (consumer_group, topic, partition, reason, lowest_unfinished, handler)
values ($1, $2, $3, $4, $5, $6)
on conflict (consumer_group, topic, partition) do update
set reason = excluded.reason, lowest_unfinished = excluded.lowest_unfinished, handler = excluded.handler,
    paused_since = case when $7::boolean then p.paused_since else now() end`,
			ww.group, ww.topic, ww.partition, p.reason, p.lowest, ww.handlerName, p.keepSince)
	case p.paused == pausedDelete:
		ww.exec(ww.ctx, "resumed partition", `delete from `+ww.pausedTable+` where consumer_group = $1 and topic = $2 and partition = $3`,
			ww.group, ww.topic, ww.partition)
	}
}

// isClosing reports whether close was called: the rest of a picture is
// then left to the final clearing.
func (ww *waitWriter) isClosing() bool {
	ww.mu.Lock()
	defer ww.mu.Unlock()
	return ww.closing
}

// clearRows deletes every held and paused row of the partition (its
// group's), in one statement that closing the writer does not cancel.
func (ww *waitWriter) clearRows() {
	ww.exec(context.Background(), clearingWhat, `with h as (delete from `+ww.heldTable+` where consumer_group = $1 and topic = $2 and partition = $3)
delete from `+ww.pausedTable+` where consumer_group = $1 and topic = $2 and partition = $3`,
		ww.group, ww.topic, ww.partition)
}

// clearingWhat names clearRows' statement in exec's log.
const clearingWhat = "clearing the partition's rows"

// exec runs one statement of the wait rows, bounded by waitRowTimeout
// within parent, best effort: a failure is logged, unless closing the
// writer cancelled it: at warn the partition's first failure to write a
// row that waits, at debug the others and every clearing's.
func (ww *waitWriter) exec(parent context.Context, what, sql string, args ...any) {
	ctx, cancel := context.WithTimeout(parent, waitRowTimeout)
	defer cancel()
	_, err := ww.pool.Exec(ctx, sql, args...)
	if err == nil || (errors.Is(err, context.Canceled) && parent.Err() != nil) {
		return
	}
	err = fmt.Errorf("writing the %s: %w", what, err)
	level := slog.LevelDebug
	// A clearing records nothing that waits (a previous owner's rows go
	// at the next reconciliation): its failure, at the start of many
	// partitions on a crowded server, is no news worth a warning each.
	if !ww.warned && what != clearingWhat {
		ww.warned, level = true, slog.LevelWarn
	}
	ww.log.Log(ctx, level, "could not record what the partition waits on for exactly status (best effort; processing goes on)",
		"topic", ww.topic, "partition", ww.partition, "what", what, "error", err)
}

// waitText is err's text as a held row keeps it: redacted of the
// configuration's secrets and of connection strings, valid UTF-8 without
// NUL bytes (which PostgreSQL text refuses), and bounded as log values are.
func (w *worker) waitText(err error) string {
	s := redact.Text(redact.Scrub(errText(err), w.c.cfg.Secrets()...))
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
	return redact.Bound(s)
}

// noteHeld queues the held row of the record at offset, held after its
// attempts'th failed attempt, err, until retryIn from now. key is the
// record's normalized dedupe key in scope, "" when unknown (a record that
// could not be keyed: the row's scope and key are then null).
func (w *worker) noteHeld(offset int64, scope, key string, attempts int, err error, retryIn time.Duration) {
	keyed := key != ""
	w.waits.hold(offset, heldWrite{scope: pgarray.NullString{S: scope, Valid: keyed}, key: pgarray.NullString{S: key, Valid: keyed},
		attempts: attempts, lastError: w.waitText(err), retryAt: time.Now().Add(retryIn)})
}

// forgetHeld queues the deletion of the held rows of the records at
// offsets, which finished (committed or dead-lettered).
func (w *worker) forgetHeld(offsets []int64) {
	w.waits.forget(offsets)
}

// syncPaused queues the partition's paused row when its fetching is
// paused because of held records (KeyConcurrency of them, or its lowest
// unfinished record held at the offset gap), and its deletion when that
// stops; while the reason stays, a new lowest unfinished offset moves the
// row (its paused_since kept). A pause of a partition whose lowest record
// merely runs (a backlog filling the window) is flow control and writes
// nothing. Each change of reason is logged: a warning when held records
// pause the partition, info when it resumes. It is called where that can
// change: pause and resume, a failed attempt while paused, a held record
// finishing, and every fill of a window that stays paused with records
// held (its lowest record may have changed).
func (d *dispatch) syncPaused() {
	w := d.w
	reason := ""
	if d.holding && d.held > 0 {
		switch {
		case d.held >= w.c.cfg.KeyConcurrency:
			reason = pausedHeldLimit
		case d.lowestHeld():
			reason = pausedOffsetGap
		}
	}
	lowest := d.lowest()
	if reason == w.pausedReason {
		if reason != "" && lowest != w.pausedLowest {
			// Paused for the same reason, behind another record.
			w.pausedLowest = lowest
			w.waits.move(lowest)
		}
		return
	}
	if reason != "" {
		d.log.Warn("partition paused: key concurrency works as far ahead of its lowest unfinished record as it may, and held records stop it",
			"reason", reason, "lowest_unfinished", d.lowest(), "held", d.held, "max_offset_gap", w.c.cfg.MaxOffsetGap,
			"key_concurrency", w.c.cfg.KeyConcurrency)
	} else {
		d.log.Info("partition resumed", "lowest_unfinished", d.lowest(), "held", d.held)
	}
	w.pausedReason, w.pausedLowest = reason, lowest
	if reason == "" {
		w.waits.resume()
		return
	}
	w.waits.pause(reason, lowest)
}

// lowestHeld reports whether the window's lowest unfinished record failed
// an attempt.
func (d *dispatch) lowestHeld() bool {
	for _, e := range d.win {
		if e.state != stDone {
			return e.attempts > 0
		}
	}
	return false
}

// startWaitRows starts the worker's writer of wait rows, whose first
// write clears the partition's rows (a previous owner's).
func (w *worker) startWaitRows() {
	w.waits = newWaitWriter(w.c.pool, w.c.log, w.c.guard.HeldTable().Sanitize(), w.c.guard.PausedTable().Sanitize(),
		w.c.cfg.Group, w.topic, w.partition, w.exec.Handler.Name())
	w.pausedReason = ""
}

// closeWaitRows stops the worker's writer of wait rows, which clears the
// partition's rows if it wrote any, and waits for it to end.
func (w *worker) closeWaitRows() {
	w.waits.close()
}
