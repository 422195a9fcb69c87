package apply

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/hrun"
	"github.com/exactly-go/exactly/internal/runtime/txbuf"
)

// Outcome is how a record ended.
type Outcome string

// The outcomes of a record. Every record ends as exactly one of them.
const (
	Applied      Outcome = "applied"
	Duplicate    Outcome = "duplicate"
	DeadLettered Outcome = "dead_lettered"
)

// Item is one record to process, with the number of this attempt (1 for the
// first).
type Item struct {
	Record  handler.Record
	Attempt int
}

// Result is the outcome of one committed item.
type Result struct {
	Outcome Outcome
	// Key is the deduplication key ("" when the record could not be keyed).
	Key string
	// Reason is why the record was dead-lettered.
	Reason error
}

// DeadLetterFunc is the public handler.DeadLetterFunc, named here for the
// executor's own code.
type DeadLetterFunc = handler.DeadLetterFunc

// Executor runs batches of one partition's records through one handler.
type Executor struct {
	Pool   *pgxpool.Pool
	Guard  *dedupe.Guard
	Runner handler.Any
	// MaxAttempts is how many times a failing handler runs before its record
	// is dead-lettered. Zero means never: the record holds its partition.
	MaxAttempts int
	// DeadLetter, when set, sends permanently failing records to the
	// dead-letter topic. When nil, they hold the partition and are retried.
	DeadLetter DeadLetterFunc
	// BeforeCommit and AfterCommit, when set, are called around COMMIT with
	// the batch (crash-point tests use them).
	BeforeCommit func(ctx context.Context, items []Item)
	AfterCommit  func(ctx context.Context, items []Item, results []Result)
	// Telemetry, when set, traces every record (a "<topic> process" span
	// continuing the record's traceparent, with claim and handler child
	// spans) and records the outcome, latency and retry metrics.
	Telemetry *Telemetry
}

// HandlerError is a failure of the handler (or of decoding or keying) for
// the item at Index. It is not transient; the caller retries the record
// with backoff or, past its attempts, the executor dead-letters it.
type HandlerError struct {
	Index int
	Key   string
	Err   error
}

// Error says which record failed and why.
func (e *HandlerError) Error() string {
	return fmt.Sprintf("record %d of the batch (key %q): %v", e.Index, e.Key, e.Err)
}

// Unwrap returns the handler's error.
func (e *HandlerError) Unwrap() error { return e.Err }

// Permanent reports whether the failure cannot go away by retrying (the
// record cannot be decoded or keyed).
func (e *HandlerError) Permanent() bool {
	var de *handler.DecodeError
	var ke *handler.KeyError
	return errors.As(e.Err, &de) || errors.As(e.Err, &ke)
}

type prepared struct {
	hrun.Prepared
	prepErr error
	claimed bool // a guard row was inserted for it in this transaction
	outcome Outcome
	reason  error // why it was dead-lettered
}

// Run processes items, consecutive records of one partition in offset order,
// in one transaction.
//
// It returns the results of the committed prefix of items. When that prefix
// is shorter than items, items[len(results)] failed with the returned
// *HandlerError, nothing after it was committed, and the caller retries from
// there after a backoff. A non-nil err (never a *HandlerError) means the
// transaction failed for an infrastructure reason (see IsTransient) or the
// context ended; nothing is known to have committed, and the caller retries
// the whole batch: guard claims make that safe.
func (e *Executor) Run(ctx context.Context, items []Item) (results []Result, herr *HandlerError, err error) {
	if len(items) == 0 {
		return nil, nil, nil
	}
	preps := make([]prepared, len(items))
	for i := range items {
		p, perr := e.Runner.Prepare(items[i].Record)
		preps[i] = prepared{Prepared: p, prepErr: perr}
	}
	// A key repeated within the batch ends it just before the repeat: the
	// repeat's outcome depends on how the first copy ends (applied, or
	// dead-lettered with its guard row released), so it goes in the next
	// batch, after this one committed. The caller goes on from there.
	if e.Runner.Guarded() {
		seen := make(map[string]struct{}, len(items))
		for i := range preps {
			if preps[i].prepErr != nil {
				continue
			}
			k := dedupe.NormalizeKey(preps[i].Key)
			if _, dup := seen[k]; dup {
				items, preps = items[:i], preps[:i]
				break
			}
			seen[k] = struct{}{}
		}
	}
	bt := e.startBatch(ctx, items)
	defer func() { bt.end(ctx, results, herr, err) }()
	keys := make([]string, 0, len(items))
	keyIdx := make([]int, 0, len(items))
	for i := range preps {
		bt.keyed(i, preps[i].Key)
		if preps[i].prepErr == nil && e.Runner.Guarded() {
			keys = append(keys, preps[i].Key)
			keyIdx = append(keyIdx, i)
		}
	}

	bt.txAt = time.Now()
	committed := false
	defer func() { bt.txDone(committed) }()
	// No savepoints: one per record would cost a round trip per record.
	// When a handler fails, the transaction is rolled back and the batch
	// replayed in a fresh one in which that handler does not run again: the
	// records before it are applied again (their first writes were rolled
	// back with it), and the failed record is dead-lettered or ends the
	// batch. So a failing record rolls back alone while the others commit,
	// and each handler runs once per attempt of its record.
	var failed map[int]error // handler failures of this call, by index
	deadLetters := func(i int) bool {
		return e.DeadLetter != nil && (preps[i].prepErr != nil || (e.MaxAttempts > 0 && items[i].Attempt >= e.MaxAttempts))
	}
	var tx pgx.Tx
	defer func() {
		if tx != nil {
			tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
		}
	}()
again:
	tx, err = e.Pool.Begin(ctx)
	if err != nil {
		tx = nil
		return nil, nil, fmt.Errorf("beginning transaction: %w", err)
	}
	// Writes that can wait for the end of the transaction (the outbox's
	// rows) are queued here and flushed together just before COMMIT.
	buf := txbuf.New(tx)
	bt.buf = buf

	if len(keys) > 0 {
		claimAt := time.Now()
		outs, err := e.Guard.ClaimBatch(ctx, tx, e.Runner.Scope(), keys)
		if err != nil {
			return nil, nil, fmt.Errorf("claiming %d guard rows: %w", len(keys), err)
		}
		bt.claimed(claimAt, time.Now(), keyIdx, outs)
		for j, o := range outs {
			p := &preps[keyIdx[j]]
			if o == dedupe.Applied {
				p.claimed = true
			} else {
				p.outcome = Duplicate
			}
		}
	}

	stop := len(items)
	for i := range items {
		p := &preps[i]
		if p.outcome == Duplicate {
			continue
		}
		failure := p.prepErr
		if failure == nil {
			failure = failed[i]
		}
		if failure == nil {
			failure = bt.handle(i, p, tx)
			if failure == nil {
				p.outcome = Applied
				continue
			}
			if ctx.Err() != nil {
				return nil, nil, fmt.Errorf("handler %s interrupted: %w", e.Runner.Name(), ctx.Err())
			}
			if handlerOutage(failure, tx) {
				return nil, nil, fmt.Errorf("handler %s hit a transient database error: %w", e.Runner.Name(), failure)
			}
			// Roll back the handler's writes with the whole transaction.
			if err := tx.Rollback(ctx); err != nil {
				return nil, nil, fmt.Errorf("rolling back after handler error (%v): %w", failure, err)
			}
			tx = nil
			if i == 0 && !deadLetters(i) {
				return nil, &HandlerError{Index: i, Key: p.Key, Err: failure}, nil
			}
			if failed == nil {
				failed = map[int]error{}
			}
			failed[i] = failure
			for j := range preps {
				preps[j].claimed = false
				preps[j].outcome = ""
			}
			goto again
		}
		if deadLetters(i) {
			if p.claimed {
				if err := e.Guard.Release(ctx, tx, e.Runner.Scope(), p.Key); err != nil {
					return nil, nil, fmt.Errorf("releasing guard row of dead-lettered record: %w", err)
				}
				p.claimed = false
			}
			if err := e.DeadLetter(txbuf.With(bt.ctxs[i], buf), tx, items[i].Record, e.Runner.Name(), items[i].Attempt, failure); err != nil {
				return nil, nil, fmt.Errorf("dead-lettering record %s: %w", items[i].Record.Coordinates(), err)
			}
			p.outcome = DeadLettered
			p.reason = failure
			continue
		}
		herr = &HandlerError{Index: i, Key: p.Key, Err: failure}
		stop = i
		break
	}

	// Records at and after a failure are not committed: give back their
	// guard rows so the retry claims them afresh.
	if stop < len(items) {
		var release []string
		for i := stop; i < len(items); i++ {
			if preps[i].claimed {
				release = append(release, preps[i].Key)
			}
		}
		if len(release) > 0 {
			if err := e.Guard.Release(ctx, tx, e.Runner.Scope(), release...); err != nil {
				return nil, nil, fmt.Errorf("releasing %d guard rows after a failed record: %w", len(release), err)
			}
		}
	}

	results = make([]Result, stop)
	for i := 0; i < stop; i++ {
		results[i] = Result{Outcome: preps[i].outcome, Key: preps[i].Key}
		if preps[i].outcome == DeadLettered {
			results[i].Reason = preps[i].reason
		}
	}
	if stop == 0 {
		return nil, herr, nil // nothing to commit; the deferred rollback ends tx
	}
	var counts dedupe.Counts
	for i := 0; i < stop; i++ {
		switch preps[i].outcome {
		case Applied:
			counts.Applied++
		case Duplicate:
			counts.Duplicate++
		case DeadLettered:
			counts.DeadLettered++
		}
	}
	if err := buf.Flush(ctx); err != nil {
		return nil, nil, fmt.Errorf("writing the batch's outbox rows: %w", err)
	}
	first := items[0].Record
	if err := e.Guard.Count(ctx, tx, e.Runner.Scope(), first.Topic, first.Partition, counts); err != nil {
		return nil, nil, fmt.Errorf("counting outcomes: %w", err)
	}
	if e.BeforeCommit != nil {
		e.BeforeCommit(ctx, items[:stop])
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, fmt.Errorf("committing %d records: %w", stop, err)
	}
	committed = true
	if e.AfterCommit != nil {
		e.AfterCommit(ctx, items[:stop], results)
	}
	return results, herr, nil
}

// Backoff returns the wait before attempt n+1 after n failures: exponential
// from base, capped at max.
func Backoff(n int, base, max time.Duration) time.Duration {
	d := base
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return d
}
