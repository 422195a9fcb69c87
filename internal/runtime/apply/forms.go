package apply

import (
	"context"
	"fmt"
	"hash/fnv"
	"runtime/debug"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/deferred"
)

// lockKeysSQL takes a transaction-level advisory lock on every key of $1,
// in the array's order (unnest scans it in order): the executor sends the
// batch's distinct key hashes sorted, so every batch takes its locks in one
// global order and none can wait for another that waits for it.
const lockKeysSQL = `select count(pg_advisory_xact_lock(k)) from unnest($1::bigint[]) as u(k)`

// LockKey returns the advisory lock of a declared lock key: the 64-bit
// FNV-1a hash of "exactly.lock", a NUL byte and key.
func LockKey(key string) int64 {
	h := fnv.New64a()
	h.Write([]byte("exactly.lock\x00")) //nolint:errcheck // a hash never fails
	h.Write([]byte(key))                //nolint:errcheck // a hash never fails
	return int64(h.Sum64())
}

// lockKeys returns the sorted distinct locks of the first n records' lock
// keys, or nil when they declare none.
func (b *batch) lockKeys(n int) []int64 {
	var locks []int64
	for i := range n {
		for _, k := range b.preps[i].LockKeys {
			locks = append(locks, LockKey(k))
		}
	}
	slices.Sort(locks)
	return slices.Compact(locks)
}

// QueuedError is the failure of a statement a pipelined handler queued,
// or of the check it queued the statement with (handler.Queue.QueueCheck):
// its record is failed with it (retried, or dead-lettered alone) and the
// batch's other records commit.
type QueuedError struct {
	// Handler is the name of the handler that queued the statement.
	Handler string
	// Statement is the statement's position among its record's (from 0).
	Statement int
	// SQL is the statement's text.
	SQL string
	// Checked is set when the statement ran and its check refused the
	// result: Err is then the check's error (a *handler.RowsAffectedError,
	// say), not the database's.
	Checked bool
	// Err is the database's error, or the check's.
	Err error
}

// Error names the handler and the statement, and says whether the
// statement or its check failed.
func (e *QueuedError) Error() string {
	what := "failed"
	if e.Checked {
		what = "failed its check"
	}
	return fmt.Sprintf("statement %d queued by handler %s (%.80q) %s: %v", e.Statement, e.Handler, e.SQL, what, e.Err)
}

// Unwrap returns the database's or the check's error.
func (e *QueuedError) Unwrap() error { return e.Err }

// queue runs record i's pipelined handler, which queues its statements on
// the pipeline; outbox.Add with its write-only transaction queues on the
// batch's buffer.
func (b *batch) queue(i int) error {
	p := &b.preps[i]
	if b.recHandler != p.Handler || b.recName == "" {
		b.recHandler, b.recName = p.Handler, "handler "+p.Handler
	}
	if b.recBuf != b.buf || b.rec.Batch != b.pipe {
		b.rec, b.recBuf = &deferred.Recorder{Batch: b.pipe}, b.buf
		b.buf.Alias(b.rec)
	}
	rec := b.rec
	rec.Name, rec.Checks = b.recName, rec.Checks[:0]
	before := b.pipe.Len()
	err := b.bt.handle(i, p, func(ctx context.Context) error { return p.Pipe.Pipe(ctx, rec, b.items[i].Attempt) })
	for range b.pipe.Len() - before {
		b.owner = append(b.owner, i)
	}
	if len(rec.Checks) > 0 {
		for len(b.checks) < b.pipe.Len() {
			b.checks = append(b.checks, nil)
		}
		for _, c := range rec.Checks {
			b.checks[c.Statement] = c.Fn
		}
	}
	return err
}

// check runs the check of statement j, if it has one, on its command tag,
// and fails the statement's record when the check refuses the result or
// panics: failed reports that it did (the batch is then replayed). A check
// that outlives ctx (the batch deadline), which was live when it started,
// is an attempt of its record as an overrunning handler is: overrun is
// then that record's error, and the transaction must be rolled back.
func (b *batch) check(ctx context.Context, j int, tag pgconn.CommandTag) (failed bool, overrun *HandlerError) {
	if j >= len(b.checks) || b.checks[j] == nil {
		return false, nil
	}
	live := ctx.Err() == nil
	err := runCheck(b.checks[j], tag)
	i := b.owner[j]
	if live && ctx.Err() != nil {
		return false, b.overrun(ctx, i, fmt.Sprintf("the check of statement %d queued by handler %s", j-b.firstOf(j), b.preps[i].Handler), err)
	}
	if err == nil {
		return false, nil
	}
	b.fail(i, &QueuedError{Handler: b.preps[i].Handler, Statement: j - b.firstOf(j), SQL: b.pipe.QueuedQueries[j].SQL, Checked: true, Err: err})
	return true, nil
}

// runCheck calls check with tag, returning a panic in it as a
// *handler.PanicError.
func runCheck(check func(pgconn.CommandTag) error, tag pgconn.CommandTag) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &handler.PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return check(tag)
}

// firstOf returns the position in the pipeline of the first statement of
// the record that owns statement j.
func (b *batch) firstOf(j int) int {
	for j > 0 && b.owner[j-1] == b.owner[j] {
		j--
	}
	return j
}

// setGroup is the records of one set-based handler in a pass.
type setGroup struct {
	handler any
	idx     []int
}

// addToSet adds record i to its handler's set call.
func (b *batch) addToSet(i int) {
	g := b.preps[i].Set.Group
	k := slices.IndexFunc(b.sets, func(s setGroup) bool { return s.handler == g })
	if k < 0 {
		b.sets = append(b.sets, setGroup{handler: g})
		k = len(b.sets) - 1
	}
	b.sets[k].idx = append(b.sets[k].idx, i)
	b.preps[i].outcome = dedupe.Applied
}

// setFailure is a set call that failed in a normal pass.
type setFailure struct {
	handler any
	err     error
}

// runSets calls every set-based handler once with its records. When one
// fails, replay is set and the next pass bisects: it calls the handler on
// halves under savepoints until the records that fail alone are found,
// records them as failed, and replays again without them. When none fails
// alone, or the bisecting call on the whole set succeeds (a flaky or
// state-dependent handler), the first record of the set fails with the
// error, so that every failing pass charges an attempt and the batch
// cannot replay until its deadline.
func (b *batch) runSets(ctx context.Context) (replay bool, overrun *HandlerError, err error) {
	bisect, normal := b.bisect, b.setFailure
	b.bisect, b.setFailure = false, setFailure{}
	for _, g := range b.sets {
		if !bisect {
			failure := b.callSet(ctx, b.tx, g.idx)
			if o := b.overran(ctx, g.idx, failure); o != nil {
				return false, o, nil
			}
			if failure != nil && handlerOutage(failure, b.tx) {
				return false, nil, fmt.Errorf("handler %s hit a transient database error: %w", b.preps[g.idx[0]].Handler, failure)
			}
			if failure != nil {
				b.bisect, b.setFailure = true, setFailure{handler: g.handler, err: failure}
				return true, nil, nil
			}
			continue
		}
		found, first, err := b.bisectSet(ctx, g.idx)
		if err != nil {
			return false, nil, err
		}
		if o := b.overran(ctx, g.idx, nil); o != nil {
			return false, o, nil
		}
		i := g.idx[0]
		switch {
		case found:
		case first != nil:
			b.fail(i, fmt.Errorf("set handler %s failed on %d records together but on none alone; failing the first: %w",
				b.preps[i].Handler, len(g.idx), first))
		case g.handler == normal.handler:
			b.fail(i, fmt.Errorf("set handler %s failed on %d records, then succeeded on them when called again; failing the first with its error: %w",
				b.preps[i].Handler, len(g.idx), normal.err))
		}
	}
	// A bisecting pass only finds the failures: its writes, including the
	// outbox rows of the calls that failed, are rolled back.
	return bisect, nil, nil
}

// overran returns the handler error of a set call that outlived ctx, or
// nil; the set's first record is charged.
func (b *batch) overran(ctx context.Context, idx []int, failure error) *HandlerError {
	if ctx.Err() == nil {
		return nil
	}
	return b.overrun(ctx, idx[0], "set handler "+b.preps[idx[0]].Handler, failure)
}

// callSet calls the set handler of records idx with their messages in tx.
// A message that cannot be decoded again fails the call, and bisecting
// then fails its record alone.
func (b *batch) callSet(ctx context.Context, tx pgx.Tx, idx []int) error {
	var members []any
	var attempts []int
	if b.scratch != nil {
		// RunSet reads them during the call only (workunit.SetMember):
		// the next call, and the next run, reuse them.
		s := b.scratch
		s.members, s.attempts = slices.Grow(s.members[:0], len(idx))[:len(idx)], slices.Grow(s.attempts[:0], len(idx))[:len(idx)]
		members, attempts = s.members, s.attempts
		defer clear(members) // no record's state kept with a pooled scratch
	} else {
		members, attempts = make([]any, len(idx)), make([]int, len(idx))
	}
	for k, i := range idx {
		members[k], attempts[k] = b.preps[i].Set.Member, b.items[i].Attempt
	}
	p := &b.preps[idx[0]]
	err := b.bt.handle(idx[0], p, func(ctx context.Context) error { return p.Set.RunSet(ctx, tx, members, attempts) })
	if err == nil {
		err = txState(tx, p.Handler)
	}
	return err
}

// bisectSet calls the set handler on idx under a savepoint and, when the
// call fails, on each half, recording the records that fail alone.
// first is the error of the call on all of idx.
func (b *batch) bisectSet(ctx context.Context, idx []int) (found bool, first error, err error) {
	sp, err := b.tx.Begin(ctx)
	if err != nil {
		return false, nil, fmt.Errorf("bisecting set handler %s: opening a savepoint: %w", b.preps[idx[0]].Handler, err)
	}
	failure := b.callSet(ctx, sp, idx)
	if failure == nil {
		if err := sp.Commit(ctx); err != nil {
			return false, nil, fmt.Errorf("bisecting set handler %s: releasing a savepoint: %w", b.preps[idx[0]].Handler, err)
		}
		return false, nil, nil
	}
	if handlerOutage(failure, b.tx) {
		return false, nil, fmt.Errorf("handler %s hit a transient database error: %w", b.preps[idx[0]].Handler, failure)
	}
	if err := sp.Rollback(ctx); err != nil {
		return false, nil, fmt.Errorf("bisecting set handler %s: rolling back to a savepoint: %w", b.preps[idx[0]].Handler, err)
	}
	if ctx.Err() != nil {
		return false, failure, nil
	}
	if len(idx) == 1 {
		b.fail(idx[0], failure)
		return true, failure, nil
	}
	h := len(idx) / 2
	l, _, err := b.bisectSet(ctx, idx[:h])
	if err != nil {
		return false, nil, err
	}
	r, _, err := b.bisectSet(ctx, idx[h:])
	if err != nil {
		return false, nil, err
	}
	return l || r, failure, nil
}
