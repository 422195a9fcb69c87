package consumer

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
	"github.com/exactly-go/exactly/internal/runtime/deferred"
)

// worker processes one partition's records in offset order and tracks the
// offset that is safe to commit: the one after the last record whose
// transaction committed (or which was dead-lettered in one).
type worker struct {
	c         *Consumer
	topic     string
	partition int32
	exec      *apply.Executor
	// outcomeRec is the record report hands the OnOutcome hook.
	outcomeRec handler.Record

	mu      sync.Mutex
	queue   []*kgo.Record
	wake    chan struct{}
	quit    chan struct{}
	stopped bool
	done    chan struct{}

	// mark is the next offset to commit; committedAt the last committed.
	mark        kgo.EpochOffset
	hasMark     bool
	committedAt int64

	// markers, when set, is a run of transaction markers a fetch ended
	// with: from the first marker's offset to the offset after the last.
	markers struct {
		from int64
		to   kgo.EpochOffset
		set  bool
	}

	// hwm is the partition's high watermark at the last fetch, base the
	// first offset fetched (the lag's reference before anything is
	// marked); both -1 until a fetch.
	hwm, base int64
	// held is the records backing off after a failed attempt.
	held int
	// waits writes the partition's held and paused rows (see
	// waitrows.go); pausedReason and pausedLowest are the reason ("" none)
	// and lowest unfinished offset of the paused row queued. Only the
	// worker's goroutine touches them.
	waits        *waitWriter
	pausedReason string
	pausedLowest int64
	// callShare: the partition's handler makes pre-transaction calls, and
	// the worker counts in the instance's call shares (callSlots.join).
	callShare bool
	// leftCalls: stopWorkers uncounted it from the call shares.
	leftCalls atomic.Bool
	// callsNow and callsWaiting are the partition's calls running and
	// its records waiting for a call slot, for the gauges.
	callsNow, callsWaiting atomic.Int64
}

func newWorker(c *Consumer, topic string, partition int32, h handler.Any) *worker {
	w := &worker{
		c: c, topic: topic, partition: partition,
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
		committedAt: -1, hwm: -1, base: -1,
	}
	w.exec = &apply.Executor{
		Pool: c.pool, Guard: c.guard, Handler: h,
		MaxAttempts: c.cfg.executorMaxAttempts(), DeadLetter: c.deadLetter,
		Telemetry: c.tel[h.Name()], Effects: c.effects,
	}
	if c.outbox != nil {
		// Rows added to the service's outbox table through any Outbox value
		// (outbox.Add's default one included) wake the service's relay.
		w.exec.Wakes = map[string]deferred.Waker{c.outbox.Table().Sanitize(): c.outbox}
	}
	if h := c.hooks.BeforeDBCommit; h != nil {
		w.exec.BeforeCommit = func(ctx context.Context, items []apply.Item) {
			h(ctx, CommitData{Topic: topic, Partition: partition, FirstOffset: items[0].Record.Offset, LastOffset: items[len(items)-1].Record.Offset})
		}
	}
	if h := c.hooks.AfterDBCommit; h != nil {
		w.exec.AfterCommit = func(ctx context.Context, items []apply.Item, _ []apply.Result) {
			h(ctx, CommitData{Topic: topic, Partition: partition, FirstOffset: items[0].Record.Offset, LastOffset: items[len(items)-1].Record.Offset})
		}
	}
	return w
}

// fetched records the high watermark of a fetch whose first record is at
// offset first.
func (w *worker) fetched(hwm, first int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.hwm = hwm
	if w.base < 0 {
		w.base = first
	}
}

// lag returns the records between the next offset to process and the high
// watermark, once a fetch happened.
func (w *worker) lag() (int64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hwm < 0 {
		return 0, false
	}
	next := w.base
	if w.hasMark {
		next = w.mark.Offset
	}
	return max(w.hwm-next, 0), true
}

func (w *worker) enqueue(recs []*kgo.Record) {
	w.mu.Lock()
	w.queue = append(w.queue, recs...)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// stop asks the worker to exit after the transaction in flight, if any.
// Backoff waits are interrupted.
func (w *worker) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.stopped = true
		close(w.quit)
	}
}

// dropQueued empties the queue of a stopped worker and returns what it held.
func (w *worker) dropQueued() (records, bytes int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.queue {
		bytes += len(r.Value) + len(r.Key)
	}
	records = len(w.queue)
	w.queue = nil
	return records, bytes
}

// take removes up to n records from the head of the queue, waiting for at
// least one. It returns nil when the worker is stopped.
func (w *worker) take(n int) []*kgo.Record {
	for {
		w.mu.Lock()
		if w.stopped {
			w.mu.Unlock()
			return nil
		}
		if len(w.queue) > 0 {
			if n > len(w.queue) {
				n = len(w.queue)
			}
			batch := make([]*kgo.Record, n)
			copy(batch, w.queue)
			clear(w.queue[:n])
			w.queue = w.queue[n:]
			if len(w.queue) == 0 {
				w.queue = nil
			}
			w.mu.Unlock()
			return batch
		}
		w.mu.Unlock()
		select {
		case <-w.wake:
		case <-w.quit:
		}
	}
}

func (w *worker) pending() (kgo.EpochOffset, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.hasMark || w.mark.Offset <= w.committedAt {
		return kgo.EpochOffset{}, false
	}
	return w.mark, true
}

func (w *worker) committed(eo kgo.EpochOffset) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if eo.Offset > w.committedAt {
		w.committedAt = eo.Offset
	}
}

func (w *worker) markDone(r *kgo.Record) {
	w.markAt(kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1})
}

// markAt makes eo the next offset to commit, when it is past the mark.
func (w *worker) markAt(eo kgo.EpochOffset) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.hasMark || eo.Offset > w.mark.Offset {
		w.mark, w.hasMark = eo, true
	}
	w.passMarkersLocked()
}

// passMarkers records a run of transaction markers, from offset from to
// the offset to after them, that a fetch ended with: once every record
// before from is done (the mark reached from), the mark moves past them.
// A run right after the one recorded extends it; a later one replaces it
// (records between them move the mark past the older run).
func (w *worker) passMarkers(from int64, to kgo.EpochOffset) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.markers.set && w.markers.to.Offset == from {
		w.markers.to = to
	} else {
		w.markers.from, w.markers.to, w.markers.set = from, to, true
	}
	w.passMarkersLocked()
}

// passMarkersLocked moves the mark past the recorded markers when every
// record before them is done: the mark (or, before any mark, the first
// offset fetched, below which everything was committed) is at or past
// their first offset.
func (w *worker) passMarkersLocked() {
	if !w.markers.set {
		return
	}
	next := w.base
	if w.hasMark {
		next = w.mark.Offset
	}
	if next < w.markers.from {
		return
	}
	if !w.hasMark || w.markers.to.Offset > w.mark.Offset {
		w.mark, w.hasMark = w.markers.to, true
	}
	w.markers.set = false
}

// setHeld records how many of the partition's records are held (backing
// off after a failed attempt), for the keys-held gauge.
func (w *worker) setHeld(n int) {
	w.mu.Lock()
	w.held = n
	w.mu.Unlock()
}

// heldRecords returns what setHeld recorded.
func (w *worker) heldRecords() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.held
}

// stopping reports whether stop was called.
func (w *worker) stopping() bool {
	select {
	case <-w.quit:
		return true
	default:
		return false
	}
}

// sleep waits d or until the worker is stopped; it reports whether the
// full wait elapsed.
func (w *worker) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.quit:
		return false
	}
}

func (w *worker) run() {
	// Rows a previous owner left (a killed process) are cleared first (the
	// writer's first write).
	w.startWaitRows()
	if w.c.cfg.KeyConcurrency > 1 {
		w.runKeyed()
		return
	}
	defer close(w.done)
	defer w.closeWaitRows()
	// Transactions run to completion even when the consumer shuts down:
	// the context is detached from cancellation.
	ctx := context.Background()
	log := w.c.log.With("topic", w.topic, "partition", w.partition, "handler", w.exec.Handler.Name())
	attempts := map[int64]int{}  // failed attempts by offset
	lastErr := map[int64]error{} // the last failure, by offset
	// batchCap is the most records per transaction: the configured maximum,
	// halved after a deadlock or serialization failure (batches of
	// different partitions that lock the same keys, e.g. outbox keys, in
	// different orders) and doubled back after a run of clean batches.
	batchCap, clean := w.c.cfg.BatchMaxRecords, 0
	// items is the batch handed to the executor, reused: Run keeps none of
	// it once it returned (its hooks get items only while it runs).
	var items []apply.Item
	var resultBuf []apply.Result // the last batch's results, whose array the next reuses
	for {
		recs := w.take(w.c.cfg.BatchMaxRecords)
		if recs == nil {
			return
		}
		outage := 0
		for len(recs) > 0 {
			if w.stopping() {
				// Revoked or shutting down: what was not started is left
				// for the next owner, from the committed offset.
				w.release(recs)
				return
			}
			n := min(len(recs), batchCap)
			items = slices.Grow(items[:0], n)[:n]
			for i, r := range recs[:n] {
				items[i] = apply.Item{Record: toRecord(r), Attempt: attempts[r.Offset] + 1}
				if max := w.c.cfg.MaxAttempts; max > 0 && attempts[r.Offset] >= max && w.c.deadLetter != nil {
					// Its last attempt overran the deadline: dead-letter it.
					items[i].Exhausted = lastErr[r.Offset]
				}
			}
			// Bounded, so a hung connection or lock wait cannot hold a
			// revoke (and the group) for ever; the batch is then retried.
			runCtx, cancel := context.WithTimeout(ctx, w.c.cfg.RebalanceTimeout)
			results, herr, err := w.exec.RunInto(runCtx, items, resultBuf)
			cancel()
			if results != nil {
				resultBuf = results // reused by the next batch: read before it runs
			}
			clear(items) // let the records and errors go with their batch
			if err != nil && apply.IsContention(err) && n > 1 {
				batchCap, clean = max(n/2, 1), 0
				log.Info("transaction lost to contention; retrying at once with smaller batches",
					"first_offset", recs[0].Offset, "records", n, "batch_cap", batchCap, "error", err)
				w.retried(ctx, recs[0], err)
				continue
			}
			if err != nil {
				outage++
				d := backoff(outage, w.c.cfg.RetryBackoff, w.c.cfg.RetryBackoffMax)
				if schemaProblem(err) {
					log.Error("a table of exactly's is missing or behind: run migrate (Service.Migrate or `exactly migrate`); holding the partition and retrying the batch",
						"guard_table", w.c.guard.Table().Sanitize(), "first_offset", recs[0].Offset, "records", len(recs), "retry_in", d, "error", err)
				} else if handler.IsUnavailable(err) {
					log.Warn("a service the codec needs is unavailable; holding the partition and retrying when it is back",
						"first_offset", recs[0].Offset, "records", len(recs), "retry_in", d, "error", err)
				} else {
					log.Warn("transaction failed; retrying the batch when the database is back",
						"first_offset", recs[0].Offset, "records", len(recs), "retry_in", d, "error", err)
				}
				w.retried(ctx, recs[0], err)
				if !w.sleep(d) {
					w.release(recs)
					return
				}
				continue
			}
			outage = 0
			if clean++; clean >= 8 && batchCap < w.c.cfg.BatchMaxRecords {
				batchCap, clean = min(batchCap*2, w.c.cfg.BatchMaxRecords), 0
			}
			for _, r := range recs[:len(results)] {
				if attempts[r.Offset] > 0 {
					// Its held row's deletion is queued before its outcome
					// is reported.
					w.forgetHeld([]int64{r.Offset})
				}
				delete(attempts, r.Offset)
				delete(lastErr, r.Offset)
			}
			w.finished(ctx, recs[:len(results)], results)
			failed := recs[0]
			if herr != nil {
				failed = recs[herr.Index]
			}
			recs = recs[len(results):]
			if herr == nil {
				continue
			}
			lastErr[failed.Offset] = herr.Err
			attempts[failed.Offset]++
			tries := attempts[failed.Offset]
			d := backoff(tries, w.c.cfg.RetryBackoff, w.c.cfg.RetryBackoffMax)
			level := "will retry"
			if w.c.deadLetter == nil {
				level = "holding the partition; no dead-letter topic is configured, so the record is retried until it succeeds"
			} else if w.c.cfg.MaxAttempts == RetryForever && !herr.Permanent() {
				level = "holding the partition; EXACTLY_MAX_ATTEMPTS is -1 (RetryForever), so the record is retried until it succeeds"
			} else if herr.Permanent() {
				level = "will dead-letter"
			}
			log.Error("handler failed", "offset", failed.Offset, "key", herr.Key, "attempt", tries,
				"retry_in", d, "next", level, "error", herr.Err)
			w.retried(ctx, failed, herr)
			var scope, key string // unknown for a record that could not be keyed
			if herr.Key != "" {
				scope, key = herr.Scope, dedupe.NormalizeKey(herr.Key)
			}
			w.noteHeld(failed.Offset, scope, key, tries, herr.Err, d)
			w.setHeld(1)
			slept := w.sleep(d)
			w.setHeld(0)
			if !slept {
				w.release(recs)
				return
			}
		}
	}
}

func (w *worker) retried(ctx context.Context, r *kgo.Record, err error) {
	if h := w.c.hooks.OnRetry; h != nil {
		h(ctx, RetryData{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Err: err})
	}
}

// finished marks the committed records' offsets and reports their outcomes.
func (w *worker) finished(ctx context.Context, recs []*kgo.Record, results []apply.Result) {
	if len(recs) == 0 {
		return
	}
	w.report(ctx, recs, results)
	// Marked only now: a committed offset implies every outcome before it
	// was reported.
	w.markDone(recs[len(recs)-1])
	w.release(recs)
}

// report logs the committed records' outcomes and calls the OnOutcome hook.
func (w *worker) report(ctx context.Context, recs []*kgo.Record, results []apply.Result) {
	debug := w.c.log.Enabled(ctx, slog.LevelDebug)
	for i, res := range results {
		if res.Outcome == dedupe.DeadLettered {
			w.c.log.Warn("record dead-lettered", "topic", recs[i].Topic, "partition", recs[i].Partition,
				"offset", recs[i].Offset, "key", res.Key, "outcome", res.Outcome.String(),
				"handler", w.exec.Handler.Name(), "reason", errText(res.Reason))
		} else if debug {
			w.c.log.Debug("record processed", "topic", recs[i].Topic, "partition", recs[i].Partition,
				"offset", recs[i].Offset, "key", res.Key, "outcome", res.Outcome.String(),
				"handler", w.exec.Handler.Name())
		}
	}
	// Hooks run after the logs, so whoever awaits an outcome sees its log.
	if h := w.c.hooks.OnOutcome; h != nil {
		// One record for every call: the hook may not keep it past the
		// call (see OutcomeData).
		for i, r := range recs {
			w.outcomeRec = toRecord(r)
			h(ctx, OutcomeData{Record: &w.outcomeRec, Handler: results[i].Handler, Key: results[i].Key, Outcome: results[i].Outcome})
		}
		w.outcomeRec = handler.Record{}
	}
}

func (w *worker) release(recs []*kgo.Record) {
	var bytes int
	for _, r := range recs {
		bytes += len(r.Value) + len(r.Key)
	}
	w.c.limit.sub(tp{w.topic, w.partition}, len(recs), bytes)
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	var pe *handler.PanicError
	if errors.As(err, &pe) {
		return pe.Error()
	}
	return err.Error()
}

func toRecord(r *kgo.Record) handler.Record {
	rec := handler.Record{
		Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
		Key: r.Key, Value: r.Value, Timestamp: r.Timestamp,
	}
	if len(r.Headers) > 0 {
		rec.Headers = make([]handler.Header, len(r.Headers))
		for i, h := range r.Headers {
			rec.Headers[i] = handler.Header{Key: h.Key, Value: h.Value}
		}
	}
	return rec
}

// schemaProblem reports whether err, failing one of the executor's own
// statements (the claim, the outbox rows, the outcome counters), says a
// table, column or schema does not exist: a table exactly writes was
// dropped or is behind its migrations.
func schemaProblem(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703" || pgErr.Code == "3F000")
}
