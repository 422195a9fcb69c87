package apply

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/callctx"
	"github.com/exactly-go/exactly/internal/runtime/deferred"
	"github.com/exactly-go/exactly/internal/runtime/memo"
	"github.com/exactly-go/exactly/internal/runtime/pgarray"
	"github.com/exactly-go/exactly/internal/runtime/sendbuf"
	"github.com/exactly-go/exactly/internal/runtime/workunit"
)

// Item is one record to process, with the number of this attempt (1 for the
// first).
type Item struct {
	Record  handler.Record
	Attempt int
	// Exhausted, when set, is the error of the record's last allowed
	// attempt, which could not dead-letter it (its handler overran the
	// batch deadline): the record is dead-lettered with it, without running
	// again.
	Exhausted error
	// Prepared, when set, is the record already decoded and keyed by
	// [Executor.Prepare] (with PrepErr its failure): Run uses it instead
	// of preparing the record again. A prepared record may run in several
	// Runs (its attempts): each run of its handler decodes afresh.
	Prepared *workunit.Prepared
	PrepErr  error
	// Memo, when set, holds the results of the record's pre-transaction
	// call (workunit.Prepared.Call): Run remembers them in the batch's
	// memo, where dedupe.Effects.Call finds them.
	Memo *memo.Memo
}

// Result is the outcome of one committed item.
type Result struct {
	Outcome dedupe.Outcome
	// Key is the deduplication key ("" when the record could not be keyed).
	Key string
	// Handler is the name of the handler the record was for (a router's
	// records each name the handler it chose).
	Handler string
	// Reason is why the record was dead-lettered.
	Reason error
}

// DeadLetterFunc is the public handler.DeadLetterFunc, named here for the
// executor's own code.
type DeadLetterFunc = handler.DeadLetterFunc

// Executor runs batches of one partition's records through one handler.
type Executor struct {
	Pool  *pgxpool.Pool
	Guard *dedupe.Guard
	// Handler is the handler (any form, or a router) the records run through.
	Handler handler.Any
	// MaxAttempts is how many times a failing handler runs before its record
	// is dead-lettered. Zero means never: the record holds its partition.
	MaxAttempts int
	// DeadLetter, when set, sends permanently failing records to the
	// dead-letter topic. When nil, they hold the partition and are retried.
	DeadLetter DeadLetterFunc
	// BeforeCommit and AfterCommit, when set, are called around COMMIT with
	// the batch (crash-point tests use them). BeforeCommit runs in every
	// pass that reaches the commit step, before the round trip that carries
	// the queued statements, the outbox rows, the counters and COMMIT; when
	// a queued statement is checked, that round trip leaves COMMIT out and
	// COMMIT follows alone once the checks passed. When a queued statement
	// fails in that round trip, or a check refuses a result, the batch
	// rolls back instead and is replayed, and BeforeCommit runs again.
	BeforeCommit func(ctx context.Context, items []Item)
	AfterCommit  func(ctx context.Context, items []Item, results []Result)
	// Wakes, when set, maps a sanitized outbox table name to the waker of
	// the relay that publishes it in this process: a batch that wrote rows
	// to that table (through any Outbox value) has it queue its
	// notification after COMMIT, or calls it after COMMIT (see
	// deferred.Buffer.Prefer and QueueNotifies).
	Wakes map[string]deferred.Waker
	// Effects, when set, is the effects table of the service's guard:
	// every record's context carries it (internal/runtime/callctx), where
	// a handler built with handler.NewWithCall records its call's result.
	Effects *dedupe.Effects
	// Telemetry, when set, traces every record (a "<topic> process" span
	// continuing the record's traceparent, with claim and handler child
	// spans) and records the outcome, latency and retry metrics.
	Telemetry *Telemetry

	// spare keeps the per-record arrays of ended runs (*scratch) for the
	// next: a worker runs batch after batch of about the same size.
	spare sync.Pool
	// attrs keeps the span attribute arrays of ended runs (*spanAttrs),
	// which every traced run needs, whatever its size.
	attrs sync.Pool
}

// scratch holds a run's per-record arrays, reused from run to run (see
// Executor.spare). Nothing in them outlives the run: Run returns results
// and errors that hold copies, never pointers into them.
type scratch struct {
	preps  []prepared
	seen   map[scopedKey]struct{}
	claims []dedupe.RecordClaim
	idx    []int
	outs   []dedupe.Outcome
	ctxs   []context.Context
	spans  []trace.Span
	// flushed is the last transaction's buffer, ended: the next run's
	// first transaction reuses its queues (deferred.Buffer.Reuse).
	flushed *deferred.Buffer
	// members and attempts are a set call's arguments (callSet).
	members  []any
	attempts []int
}

// getScratch returns a scratch whose preps has n zeroed elements.
func (e *Executor) getScratch(n int) *scratch {
	s, _ := e.spare.Get().(*scratch)
	if s == nil {
		s = &scratch{}
	}
	if cap(s.preps) < n {
		s.preps = make([]prepared, n)
	}
	s.preps = s.preps[:n]
	return s
}

// putScratch clears what s refers to (so that a pooled scratch keeps no
// record, context or span alive) and keeps it for the next run, with the
// run's last buffer (nil when the run began no transaction), whose
// transaction has ended, emptied for the next run to reuse its queues.
func (e *Executor) putScratch(s *scratch, last *deferred.Buffer) {
	if last != nil {
		last.Ended()
		s.flushed = last
	}
	clear(s.preps)
	clear(s.seen)
	clear(s.claims[:cap(s.claims)])
	clear(s.ctxs)
	clear(s.spans)
	s.preps, s.claims, s.idx = s.preps[:0], s.claims[:0], s.idx[:0]
	e.spare.Put(s)
}

// HandlerError is a failure of the handler (or of decoding or keying) for
// the item at Index. It is not transient; the caller retries the record
// with backoff or, past its attempts, the executor dead-letters it.
type HandlerError struct {
	Index int
	Key   string
	Scope string // the scope of Key ("" when the record could not be keyed)
	Err   error
}

// Error says which record failed and why.
func (e *HandlerError) Error() string {
	return fmt.Sprintf("record %d of the batch (key %q): %v", e.Index, e.Key, e.Err)
}

// Unwrap returns the handler's error.
func (e *HandlerError) Unwrap() error { return e.Err }

// Permanent reports whether the failure cannot go away by retrying (the
// record cannot be decoded or keyed, or the handler returned
// handler.Permanent).
func (e *HandlerError) Permanent() bool { return permanent(e.Err) }

func permanent(err error) bool {
	var de *handler.DecodeError
	var ke *handler.KeyError
	var pe *handler.PermanentError
	return errors.As(err, &de) || errors.As(err, &ke) || errors.As(err, &pe)
}

type prepared struct {
	// Prepared is the item's (Item.Prepared, not copied: the runtime's
	// record outlives the batch), or one the batch prepared.
	*workunit.Prepared
	prepErr error
	claim   dedupe.RecordClaim // the guard row claimed (or marked) for it
	claimed bool               // claim is made in the claim step
	outcome dedupe.Outcome
	reason  error // why it was dead-lettered
}

// batch is one Run: its records and the state of its transaction. Run
// takes it through begin (BEGIN, lock keys and claims: one round trip),
// handle (and the set-based calls) and commit (queued statements, outbox
// rows, counters and COMMIT: one round trip, two when a queued statement
// is checked); a failing
// handler rolls the transaction back, and the batch is replayed in a fresh
// one in which that record does not run again.
type batch struct {
	e     *Executor
	items []Item
	// owned are the prepared records of the items that came unprepared,
	// which the batch prepared itself: nothing outside the run refers to
	// them, and the run releases them when it ends (releaseOwned).
	owned []workunit.Prepared
	preps []prepared
	// memo holds the external call results of this run, across its
	// replays. One for the batch, not one per record: a set-based call
	// runs several records under the first one's context, and the memo's
	// keys name the effects table, scope and key anyway.
	memo memo.Memo
	bt   batchTrace
	conn *pgxpool.Conn // the connection of tx, released when it ends
	tx   pgx.Tx
	buf  *deferred.Buffer
	// slot holds buf for the records' contexts (deferred.WithSlot): one
	// context value per batch, not one per record and pass.
	slot deferred.Slot
	// pipe holds the statements sent in one round trip before COMMIT: the
	// pipelined handlers' (owner[j] is the record of statement j), then
	// the outbox rows and the outcome counters. The first pass's is pipe0;
	// a replay gets a fresh one, which no writer handed to a handler of
	// an earlier pass can reach. checks[j], when j < len(checks), is the
	// check of statement j (nil for none); checks stays empty in a pass
	// without checked statements, whose pipeline then carries COMMIT.
	pipe   *pgx.Batch
	pipe0  pgx.Batch
	owner  []int
	checks []func(pgconn.CommandTag) error
	// recName is the name of the recorders of handler recHandler's
	// records ("handler " + its name), built once for a run of its records.
	recHandler, recName string
	// rec is the write-only transaction of the pass's pipelined records,
	// one for the pass (aliased once to its buffer, recBuf), given to each
	// record in turn with its name and no checks.
	rec    *deferred.Recorder
	recBuf *deferred.Buffer
	// first holds BEGIN, the lock statement and the claim of a pass.
	first pgx.Batch
	// sets are the set-based records of this pass, by handler, in order.
	sets []setGroup
	// bisect makes the next pass bisect the failing set calls.
	bisect bool
	// setFailure is the failing set call of the normal pass that set
	// bisect: its handler and error.
	setFailure setFailure
	// prefix, when set, caps the records of the next passes: a write of
	// the batch's own (its outbox rows, COMMIT's deferred checks) failed
	// without naming its record, so shorter prefixes are tried until one
	// record's writes fail (see isolate).
	prefix int
	// failed holds the handler failures of this run, by index.
	failed map[int]error
	// unavailable is the error of the batch's first record, which its
	// codec could not decode for an outage (handler.UnavailableError):
	// Run returns it as a transient failure.
	unavailable error
	// scratch holds the per-record arrays of a batch of more than one
	// record (nil for one), from the executor's spares.
	scratch *scratch
	// one holds the record of a batch of one (the common case when records
	// arrive one at a time) in the batch's own allocation.
	one struct {
		prep  [1]prepared
		ctx   [1]context.Context
		span  [1]trace.Span
		claim [1]dedupe.RecordClaim
		idx   [1]int
		out   [1]dedupe.Outcome
	}
}

// Run processes items, consecutive records of one partition in offset order,
// in one transaction.
//
// It returns the results of the committed prefix of items. When a
// *HandlerError is returned, items[herr.Index] failed (it is at or after
// len(results)); nothing after the results was committed, and the caller
// retries from there after a backoff, counting the attempt against
// items[herr.Index]. Fewer results than items without a *HandlerError
// (a key repeated in the batch, or deferred writes that failed and were
// traced to a later record) mean: run the rest now. A non-nil err (never a *HandlerError) means the
// transaction failed for an infrastructure reason (see IsTransient) or the
// context ended outside a handler; nothing is known to have committed, and
// the caller retries the whole batch: guard claims make that safe.
func (e *Executor) Run(ctx context.Context, items []Item) (results []Result, herr *HandlerError, err error) {
	return e.RunInto(ctx, items, nil)
}

// RunInto is Run writing the results into dst's array when it has room
// (dst's length does not matter): a caller running batch after batch
// hands back the previous results, which it no longer reads, so that no
// batch allocates them. It fails as Run does.
func (e *Executor) RunInto(ctx context.Context, items []Item, dst []Result) (results []Result, herr *HandlerError, err error) {
	if len(items) == 0 {
		return nil, nil, nil
	}
	b := e.prepare(items)
	defer b.releaseOwned() // registered first: runs after everything else
	if b.scratch != nil {
		defer func() { e.putScratch(b.scratch, b.buf) }() // runs after the trace has ended
	}
	if len(b.items) == 1 {
		b.bt.ctxs, b.bt.spans = b.one.ctx[:], b.one.span[:]
	}
	for i := range b.items {
		b.memo.CopyFrom(b.items[i].Memo)
	}
	// Every record's context holds the batch's memo (see batch.memo) and
	// the slot of the current pass's deferred writes.
	rctx := memo.With(ctx, &b.memo)
	if e.Effects != nil {
		rctx = callctx.With(rctx, e.Effects)
	}
	e.startBatch(&b.bt, deferred.WithSlot(rctx, &b.slot), b.items, b.preps)
	if b.scratch != nil {
		b.scratch.ctxs, b.scratch.spans = b.bt.ctxs, b.bt.spans // keep what startBatch grew
	}
	defer func() { b.bt.end(ctx, results, herr, err); b.bt.releaseAttrs() }()
	if b.unavailable != nil {
		// Counted and traced as a transient failure of the batch.
		return nil, nil, b.unavailable
	}
	b.contexts()

	b.bt.txAt = time.Now()
	committed := false
	defer func() { b.bt.txDone(committed) }()
	defer b.rollback(ctx)
	// No savepoints: one per record would cost a statement per record (see
	// docs/design.md). When a handler fails, the transaction is rolled back
	// and the batch replayed in a fresh one in which that handler does not
	// run again: the records before it are applied again (their first
	// writes were rolled back with it), and the failed record is
	// dead-lettered or ends the batch. Each handler runs once per attempt
	// of its record, plus once per replay.
	for {
		n, stop := b.limit()
		if b.prefix > 0 && b.prefix < n {
			n, stop = b.prefix, nil // the rest is run again by the caller
		}
		if n == 0 {
			return nil, stop, nil
		}
		replay, overrun, err := b.pass(ctx, n)
		switch {
		case err != nil:
			return nil, nil, err
		case overrun != nil:
			return nil, overrun, nil
		case replay:
			continue
		}
		committed = true
		return b.results(dst, n), stop, nil
	}
}

// prepare decodes and keys items. A key repeated within the batch ends it
// just before the repeat: the repeat's outcome depends on how the first
// copy ends (applied, or dead-lettered and taken over by the repeat), so
// it goes in the next batch, after this one committed.
func (e *Executor) prepare(items []Item) *batch {
	b := &batch{e: e, items: items}
	if len(items) == 1 {
		b.preps = b.one.prep[:]
	} else {
		b.scratch = e.getScratch(len(items))
		b.preps = b.scratch.preps
		b.bt.ctxs, b.bt.spans = b.scratch.ctxs, b.scratch.spans
	}
	var seen map[scopedKey]struct{}
	if e.Handler.Guarded() && len(items) > 1 { // a lone record repeats no key
		if b.scratch.seen == nil {
			b.scratch.seen = make(map[scopedKey]struct{}, len(items))
		}
		seen = b.scratch.seen
	}
	var own []workunit.Prepared // for the items that come unprepared
	for i := range items {
		p := &b.preps[i]
		if items[i].Prepared != nil {
			p.Prepared, p.prepErr = items[i].Prepared, items[i].PrepErr
		} else {
			if own == nil {
				own = make([]workunit.Prepared, len(items)-i)
				b.owned = own
			}
			p.Prepared = &own[0]
			own = own[1:]
			*p.Prepared, p.prepErr = e.Prepare(items[i].Record)
		}
		if handler.IsUnavailable(p.prepErr) {
			// A service the codec needs is down: an outage, not the
			// record's fault. The records before it run now; when it
			// is first, the batch fails as a transaction would (Run).
			n := max(i, 1)
			b.items, b.preps = items[:n], b.preps[:n]
			if i == 0 {
				b.unavailable = p.prepErr
			}
			break
		}
		if p.prepErr != nil || seen == nil || p.Unguarded {
			continue
		}
		k := scopedKey{p.Scope, dedupe.NormalizeKey(p.Key)}
		if _, dup := seen[k]; dup {
			b.items, b.preps = items[:i], b.preps[:i]
			break
		}
		seen[k] = struct{}{}
	}
	return b
}

// scopedKey is a guard row's identity: its scope and normalized key.
type scopedKey struct{ scope, key string }

// Prepare decodes and keys rec with the executor's handler, filling in the
// handler's scope and name where a router left them empty. It fails like
// handler.Any's Prepare: with a *handler.DecodeError or *handler.KeyError.
func (e *Executor) Prepare(rec handler.Record) (workunit.Prepared, error) {
	p, err := e.Handler.PrepareUnit(rec)
	if p.Scope == "" {
		p.Scope = e.Handler.Scope()
	}
	if p.Handler == "" {
		p.Handler = e.Handler.Name()
	}
	return p, err
}

// contexts gives every record its guard claim (with the trace it
// carries).
func (b *batch) contexts() {
	for i := range b.preps {
		p, rec := &b.preps[i], &b.items[i].Record
		b.bt.keyed(i, p.Key)
		p.claim = dedupe.RecordClaim{Scope: p.Scope, Key: p.Key, Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Handler: p.Handler}
		if sc := trace.SpanContextFromContext(b.bt.ctxs[i]); sc.HasTraceID() {
			p.claim.TraceID = sc.TraceID().String()
		}
		switch {
		case p.prepErr != nil:
			// No usable key: a dead letter is marked by the coordinates.
			p.claim.Key, p.claim.Scope = dedupe.DeadLetterKey(rec.Topic, rec.Partition, rec.Offset), b.e.Handler.Scope()
			p.claimed = true
		default:
			p.claimed = !p.Unguarded // per record: a router's handlers differ
		}
	}
}

// failure returns the known failure of record i: it could not be prepared,
// its handler failed earlier in this run, or its attempts are exhausted.
func (b *batch) failure(i int) error {
	switch {
	case b.preps[i].prepErr != nil:
		return b.preps[i].prepErr
	case b.failed[i] != nil:
		return b.failed[i]
	case b.e.DeadLetter != nil:
		return b.items[i].Exhausted
	}
	return nil
}

// deadLetters reports whether record i, failing with failure, is
// dead-lettered now rather than retried.
func (b *batch) deadLetters(i int, failure error) bool {
	e := b.e
	if e.DeadLetter == nil {
		return false
	}
	return b.preps[i].prepErr != nil || b.items[i].Exhausted != nil || permanent(failure) ||
		(e.MaxAttempts > 0 && b.items[i].Attempt >= e.MaxAttempts)
}

// attempts is the number of handler runs of record i to report with its
// dead letter: 0 when no handler could run.
func (b *batch) attempts(i int) int {
	switch {
	case b.preps[i].prepErr != nil:
		return 0
	case b.failed[i] == nil && b.items[i].Exhausted != nil:
		return b.items[i].Attempt - 1
	default:
		return b.items[i].Attempt
	}
}

// limit returns how many records go into the next transaction: those before
// the first known failure that is not dead-lettered, which it returns as
// the batch's handler error.
func (b *batch) limit() (int, *HandlerError) {
	for i := range b.items {
		if f := b.failure(i); f != nil && !b.deadLetters(i, f) {
			return i, &HandlerError{Index: i, Key: b.preps[i].Key, Scope: b.preps[i].Scope, Err: f}
		}
	}
	return len(b.items), nil
}

// pass runs the first n records in one transaction. replay reports that a
// handler failed (recorded in b.failed) and the transaction was rolled
// back; overrun, that a handler did not finish within ctx's deadline.
func (b *batch) pass(ctx context.Context, n int) (replay bool, overrun *HandlerError, err error) {
	if err := b.begin(ctx, n); err != nil {
		return false, nil, err
	}
	for i := range n {
		replay, overrun, err = b.handle(ctx, i)
		if replay || overrun != nil || err != nil {
			b.rollback(ctx)
			return replay, overrun, err
		}
	}
	replay, overrun, err = b.runSets(ctx)
	if replay || overrun != nil || err != nil {
		b.rollback(ctx)
		return replay, overrun, err
	}
	replay, overrun, err = b.commit(ctx, n)
	if replay || overrun != nil || err != nil {
		b.rollback(ctx)
	}
	return replay, overrun, err
}

// begin starts the transaction and its buffer of deferred writes (the
// outbox's rows, flushed together just before COMMIT), takes the batch's
// lock keys and claims the guard rows of the first n records: BEGIN, the
// lock statement and the claim go in one round trip.
func (b *batch) begin(ctx context.Context, n int) error {
	for i := range b.preps {
		b.preps[i].outcome, b.preps[i].reason = "", nil
	}
	b.owner, b.checks, b.sets = b.owner[:0], b.checks[:0], b.sets[:0]
	if b.pipe == nil {
		b.pipe = &b.pipe0
	} else {
		b.pipe = &pgx.Batch{}
	}
	if slices.ContainsFunc(b.preps[:n], func(p prepared) bool { return p.Pipe != nil }) {
		// Statement 0 of the pipeline bounds its statements by the
		// batch's deadline (commit sets its argument); it is no record's.
		b.pipe.Queue(statementTimeoutSQL, "0")
		b.owner = append(b.owner, -1)
	}
	conn, err := b.e.Pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	// The batch's claims and outbox rows send their arrays grown once.
	pgarray.Use(conn.Conn())
	b.first = pgx.Batch{}
	first := &b.first
	// READ COMMITTED whatever default_transaction_isolation says: a claim
	// across a rotation of the guard's generations needs a snapshot taken
	// after its wait for the rotation (docs/design.md, "The guard's
	// generations").
	first.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if locks := b.lockKeys(n); len(locks) > 0 {
		first.Queue(lockKeysSQL, locks)
	}
	claims, idx := b.claims(n)
	var outs []dedupe.Outcome
	if n == 1 {
		b.one.out = [1]dedupe.Outcome{}
		outs = b.one.out[:len(claims)]
	} else {
		outs = slices.Grow(b.scratch.outs[:0], len(claims))[:len(claims)]
		clear(outs)
		b.scratch.outs = outs
	}
	// A lone claim inserts its row alone, and claims again with the
	// takeover only when the key exists (a duplicate or a takeover: one
	// more round trip): for PostgreSQL the insert costs half the statement
	// with the takeover clause.
	var inserted bool
	lone := len(claims) == 1
	if lone {
		err = b.e.Guard.QueueClaimNew(first, claims[0], &inserted)
	} else {
		err = b.e.Guard.QueueClaimRecords(first, claims, outs)
	}
	if err != nil {
		conn.Release()
		return fmt.Errorf("claiming %d guard rows: %w", len(claims), err)
	}
	start := time.Now()
	sendbuf.Reserve(conn.Conn().PgConn(), sendbuf.Size(first))
	br := conn.SendBatch(ctx, first)
	b.conn, b.tx = conn, br.Tx()
	if err := br.Close(); err != nil {
		b.rollback(ctx)
		return fmt.Errorf("beginning transaction and claiming %d guard rows: %w", len(claims), err)
	}
	if lone {
		outs[0] = dedupe.Applied
		if !inserted {
			o, err := b.e.Guard.ClaimRecords(ctx, b.tx, claims)
			if err != nil {
				b.rollback(ctx)
				return fmt.Errorf("claiming the guard row of a key that exists: %w", err)
			}
			outs[0] = o[0]
		}
	}
	prev := b.buf // the previous pass's, ended
	if prev == nil && b.scratch != nil {
		prev = b.scratch.flushed // the previous run's, ended
	}
	b.buf = deferred.NewSized(b.tx, n)
	b.buf.Reuse(prev) // its outbox queues are taken again, emptied
	for table, w := range b.e.Wakes {
		b.buf.Prefer(table, w)
	}
	b.slot.Buffer = b.buf
	if len(claims) > 0 {
		b.bt.claimed(start, time.Now(), idx, outs)
	}
	for j, o := range outs {
		if o == dedupe.Duplicate {
			b.preps[idx[j]].outcome = dedupe.Duplicate
		}
	}
	return nil
}

// releaseOwned hands the prepared records the batch made itself back to
// their handlers (workunit.Prepared.Release) once the run is over.
func (b *batch) releaseOwned() {
	for i := range b.owned {
		if r := b.owned[i].Release; r != nil {
			r.Release()
		}
	}
	clear(b.owned)
}

// rollback ends the transaction, if one is open, and releases its
// connection.
func (b *batch) rollback(ctx context.Context) {
	if b.tx != nil {
		b.tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the connection is discarded on failure
		b.tx = nil
	}
	if b.conn != nil {
		b.conn.Release()
		b.conn = nil
	}
}

// claims returns the guard claims of the first n records and their
// indexes.
func (b *batch) claims(n int) ([]dedupe.RecordClaim, []int) {
	claims, idx := b.one.claim[:0], b.one.idx[:0]
	if n > 1 {
		claims, idx = b.scratch.claims[:0], b.scratch.idx[:0]
	}
	for i := range n {
		if b.preps[i].claimed {
			claims = append(claims, b.preps[i].claim)
			idx = append(idx, i)
		}
	}
	if n > 1 {
		b.scratch.claims, b.scratch.idx = claims, idx // keep what append grew
	}
	return claims, idx
}

// handle runs record i's handler, or dead-letters the record when it is
// known to fail for good.
func (b *batch) handle(ctx context.Context, i int) (replay bool, overrun *HandlerError, err error) {
	p := &b.preps[i]
	if p.outcome == dedupe.Duplicate {
		return false, nil, nil
	}
	failure := b.failure(i)
	if failure != nil {
		return false, nil, b.deadLetter(ctx, i, failure)
	}
	switch {
	case p.Set != nil:
		// Run with the rest of its set after the loop (runSets).
		b.addToSet(i)
		return false, nil, nil
	case p.Pipe != nil:
		failure = b.queue(i)
	default:
		failure = b.bt.handle(i, p, func(ctx context.Context) error { return p.Run.Run(ctx, b.tx, b.items[i].Attempt) })
	}
	name := p.Handler
	if ctx.Err() != nil {
		// The handler overran the batch deadline: an attempt of its
		// record, not an outage.
		return false, b.overrun(ctx, i, "handler "+name, failure), nil
	}
	if failure != nil && handlerOutage(failure, b.tx) {
		return false, nil, fmt.Errorf("handler %s hit a transient database error: %w", name, failure)
	}
	if failure == nil {
		if p.Pipe != nil {
			// Its statements run in the pipeline (flush).
			p.outcome = dedupe.Applied
			return false, nil, nil
		}
		if failure = txState(b.tx, name); failure == nil {
			p.outcome = dedupe.Applied
			return false, nil, nil
		}
	}
	b.fail(i, failure)
	return true, nil, nil
}

// overrun returns the error of record i whose handler, set call or check
// (what, named in the error) did not finish within ctx's deadline: an
// attempt of the record, not an outage. failure is what it returned, if
// anything.
func (b *batch) overrun(ctx context.Context, i int, what string, failure error) *HandlerError {
	cause := fmt.Errorf("%s did not finish within the batch deadline: %w", what, context.Cause(ctx))
	if failure != nil {
		cause = fmt.Errorf("%w (it returned: %v)", cause, failure)
	}
	return &HandlerError{Index: i, Key: b.preps[i].Key, Scope: b.preps[i].Scope, Err: cause}
}

// txState reports how tx stands after handler name returned nil: nil when
// the transaction is open and usable, an *AbortedTxError otherwise. No
// round trip: it is the status the server sent with its last reply.
func txState(tx pgx.Tx, name string) error {
	switch tx.Conn().PgConn().TxStatus() {
	case 'T':
		return nil
	case 'E':
		return &handler.AbortedTxError{Handler: name}
	default:
		return &handler.AbortedTxError{Handler: name, Ended: true}
	}
}

// fail records failure as record i's failure in this run.
func (b *batch) fail(i int, failure error) {
	if b.failed == nil {
		b.failed = map[int]error{}
	}
	b.failed[i] = failure
}

// deadLetter writes record i's dead letter and marks its guard row
// dead-lettered, both in the batch's transaction.
func (b *batch) deadLetter(ctx context.Context, i int, failure error) error {
	p, rec := &b.preps[i], b.items[i].Record
	if err := b.e.Guard.MarkDeadLettered(ctx, b.tx, p.claim); err != nil {
		return fmt.Errorf("marking dead-lettered record %s: %w", rec.Coordinates(), err)
	}
	// The sink gets a copy it may keep: the record's own memory is lent to
	// later fetches once the consumer is done with it.
	if err := b.e.DeadLetter(b.bt.ctxs[i], b.tx, rec.Clone(), p.Handler, b.attempts(i), failure); err != nil {
		return fmt.Errorf("dead-lettering record %s: %w", rec.Coordinates(), err)
	}
	p.outcome, p.reason = dedupe.DeadLettered, failure
	return nil
}

// commit sends, in one round trip, the pipelined handlers' statements,
// the deferred writes (the outbox's rows), the outcome counters of the
// first n records and COMMIT: the server runs them in order and skips the
// rest, COMMIT included, after the first failure. When a queued statement
// is checked, COMMIT is left out of that pipeline (the server would commit
// before the checks could refuse a result) and sent alone once every check
// has passed: one more round trip. replay reports that a record's writes
// failed, or a check refused one: the record is failed (b.failed), or the
// batch is to be tried with fewer records (b.prefix); the transaction
// must be rolled back. overrun is the attempt of a record whose check did
// not finish within ctx's deadline (see check).
func (b *batch) commit(ctx context.Context, n int) (replay bool, overrun *HandlerError, err error) {
	records := b.pipe.Len()
	if _, err := b.buf.FlushInto(ctx, b.pipe); err != nil {
		return false, nil, fmt.Errorf("writing the batch's outbox rows: %w", err)
	}
	counters := b.pipe.Len()
	first := b.items[0].Record
	for _, c := range b.counts(n) {
		b.e.Guard.QueueCount(b.pipe, c.scope, first.Topic, first.Partition, c.Counts)
	}
	last := b.pipe.Len()
	checked := len(b.checks) > 0
	doing := "writing the batch's queued statements, outbox rows and outcome counters of %d records before COMMIT: %w"
	if !checked {
		b.pipe.Queue("commit")
		doing = "writing the batch's queued statements, outbox rows and outcome counters, and committing %d records: %w"
	}
	if len(b.owner) > 0 && b.owner[0] < 0 {
		b.pipe.QueuedQueries[0].Arguments = []any{statementTimeout(ctx)}
	}
	if b.e.BeforeCommit != nil {
		b.e.BeforeCommit(ctx, b.items[:n])
	}
	statements := b.pipe.Len() // the transaction's, COMMIT included
	if !checked {
		// The outboxes' notifications ride after COMMIT: no round trip
		// or pooled connection of their own.
		b.buf.QueueNotifies(b.pipe)
	}
	sendbuf.Reserve(b.tx.Conn().PgConn(), sendbuf.Size(b.pipe))
	br := b.tx.SendBatch(ctx, b.pipe)
	for j := range statements {
		tag, err := br.Exec()
		if err == nil && j == last {
			err = commitTag(tag)
		}
		if err == nil {
			failed, overrun := b.check(ctx, j, tag)
			if overrun != nil {
				br.Close() //nolint:errcheck // the transaction is rolled back
				return false, overrun, nil
			}
			if !failed {
				continue
			}
		}
		br.Close() //nolint:errcheck // err is the batch's first error, or a check failed
		switch {
		case err == nil:
			// The check of statement j refused its result (b.check
			// failed its record).
			return true, nil, nil
		case handlerOutage(err, b.tx):
			return false, nil, fmt.Errorf(doing, n, err)
		case j == last:
			replay, err := b.commitFailed(n, err)
			return replay, nil, err
		case j >= counters:
			return false, nil, fmt.Errorf("writing the outcome counters of %d records: %w", n, err)
		case j >= records && rowsRejected(err):
			replay, err := b.isolate(n, b.pipe.QueuedQueries[j].SQL, err)
			return replay, nil, err
		case j >= records:
			// The outbox table missing, locked past lock_timeout, not
			// writable by the role: no record's doing.
			return false, nil, fmt.Errorf("writing the outbox rows of %d records: %w", n, err)
		}
		i := b.owner[j]
		if i < 0 {
			return false, nil, fmt.Errorf("bounding the batch's queued statements by its deadline: %w", err)
		}
		b.fail(i, &QueuedError{Handler: b.preps[i].Handler, Statement: j - b.firstOf(j), SQL: b.pipe.QueuedQueries[j].SQL, Err: err})
		return true, nil, nil
	}
	if statements < b.pipe.Len() {
		// COMMIT succeeded: what fails after it is a notification, which
		// does not fail the batch; its wakers then notify on their own.
		failed := false
		for range b.pipe.Len() - statements {
			if _, err := br.Exec(); err != nil {
				failed = true
			}
		}
		if err := br.Close(); err != nil || failed {
			b.buf.NotifiesFailed()
		}
	} else if err := br.Close(); err != nil {
		return false, nil, fmt.Errorf(doing, n, err)
	}
	if checked {
		// Every check passed: COMMIT, alone.
		tag, err := b.tx.Exec(ctx, "commit")
		if err == nil {
			err = commitTag(tag)
		}
		if err != nil {
			replay, err := b.commitFailed(n, err)
			return replay, nil, err
		}
	}
	// The transaction ended with COMMIT: the connection is idle again
	// (the pool checks), and tx is never used again.
	conn := b.conn
	b.tx, b.conn = nil, nil
	conn.Release()
	b.buf.Committed(b.e.Pool) // wakes the relays of the outboxes written
	if b.e.AfterCommit != nil {
		b.e.AfterCommit(ctx, b.items[:n], b.results(nil, n))
	}
	return false, nil, nil
}

// statementTimeoutSQL bounds each later statement of the transaction by
// $1 milliseconds, unless the session already has a statement_timeout
// (the user's setting then stands). The server then fails a queued
// statement that runs too long with SQLSTATE 57014 before the batch's
// deadline cancels the pipeline: the failure names its statement, so it is
// an attempt of that statement's record, as a tx-form handler's slow
// statement is, and not a lost pipeline that only an outage would explain
// (the server sends a pipeline's results only at its end, so the client
// cannot tell which statement it was waiting for).
const statementTimeoutSQL = `select set_config('statement_timeout', $1, true) where current_setting('statement_timeout') = '0'`

// statementTimeout returns statementTimeoutSQL's argument for a pipeline
// sent now under ctx: nine tenths of what is left of its deadline, in
// milliseconds, leaving the server's timeout time to fire first; "0" (no
// limit) without a deadline or with too little of it left.
func statementTimeout(ctx context.Context) string {
	deadline, ok := ctx.Deadline()
	if !ok {
		return "0"
	}
	left := time.Until(deadline)
	if ms := (left - left/10).Milliseconds(); ms >= 10 {
		return strconv.FormatInt(ms, 10)
	}
	return "0"
}

// commitTag returns an error unless tag is COMMIT's own (a transaction
// that was aborted answers COMMIT with ROLLBACK).
func commitTag(tag pgconn.CommandTag) error {
	if tag.String() != "COMMIT" {
		return fmt.Errorf("the server answered %q", tag.String())
	}
	return nil
}

// commitFailed handles the failure of COMMIT for the first n records: a
// deferred constraint or trigger that rejected rows is traced to its
// record (isolate); anything else fails the transaction.
func (b *batch) commitFailed(n int, err error) (replay bool, _ error) {
	if rowsRejected(err) {
		return b.isolate(n, "commit", err)
	}
	return false, fmt.Errorf("committing %d records: %w", n, err)
}

// rowsRejected reports whether err, failing the batch's deferred writes
// (its outbox rows, or COMMIT's deferred checks), is a verdict on the rows
// written: their data (SQLSTATE class 22), a constraint (23), a trigger
// (27, or a PL/pgSQL raise, P0), a view's check option (44), or a value
// too large for an index (54000). Any other error (a table missing, a lock
// or statement timeout, a privilege revoked) is no record's doing: the
// batch then fails as a transaction, retried until the cause is gone,
// rather than failing and finally dead-lettering healthy records.
func rowsRejected(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch c := pgErr.Code; {
	case strings.HasPrefix(c, "22"), strings.HasPrefix(c, "23"), strings.HasPrefix(c, "27"),
		strings.HasPrefix(c, "44"), strings.HasPrefix(c, "P0"), c == "54000":
		return true
	}
	return false
}

// DeferredWriteError is the failure of a record's writes that run at the
// end of its batch, when the database rejected the rows themselves (their
// data, a constraint or a trigger, on the outbox table say; see
// rowsRejected), not an outage: its outbox rows, flushed with the batch's
// in one statement just before COMMIT, or a deferred constraint or trigger
// checked by COMMIT. Those writes do not say whose rows
// failed, so the executor replays shorter prefixes of the batch until one
// record's writes fail alone; that record is failed with this error
// (retried, then dead-lettered without the rejected rows) and the others
// commit.
type DeferredWriteError struct {
	// Handler is the name of the record's handler.
	Handler string
	// SQL is the failing statement's text ("commit" for a check deferred
	// to COMMIT).
	SQL string
	// Err is the database's error.
	Err error
}

// Error names the handler and the statement.
func (e *DeferredWriteError) Error() string {
	return fmt.Sprintf("the writes handler %s deferred to the end of the batch failed in %.120q: %v", e.Handler, e.SQL, e.Err)
}

// Unwrap returns the database's error.
func (e *DeferredWriteError) Unwrap() error { return e.Err }

// isolate handles the failure, not an outage, of the batch's deferred
// writes (statement sql), run for its first n records: replay reports
// that the batch is to be tried again, with the first n/2 records, or,
// for n = 1, without its first record, failed with the error. A first
// record whose handler did not run (a duplicate, or dead-lettered) wrote
// nothing that can fail but its dead letter: the failure is then returned
// as the transaction's, since no record can be blamed.
func (b *batch) isolate(n int, sql string, failure error) (replay bool, err error) {
	if n > 1 {
		b.prefix = n / 2
		return true, nil
	}
	p := &b.preps[0]
	if p.outcome != dedupe.Applied {
		return false, fmt.Errorf("writing the batch's outbox rows (%.120q) for record %s, which is %s: %w",
			sql, b.items[0].Record.Coordinates(), p.outcome, failure)
	}
	b.fail(0, &DeferredWriteError{Handler: p.Handler, SQL: sql, Err: failure})
	// Its next attempt records the results it remembers at once, reading
	// back the one that stands: an effect row of its, queued with the
	// deferred writes, may be what failed (another result recorded first).
	b.items[0].Memo.SetStrict()
	return true, nil
}

// scopeCounts are the outcome counts of one scope.
type scopeCounts struct {
	scope string
	dedupe.Counts
}

// counts returns the outcome counts of the first n records, by scope in
// order of appearance.
func (b *batch) counts(n int) []scopeCounts {
	var out []scopeCounts
	for i := range n {
		p := &b.preps[i]
		k := slices.IndexFunc(out, func(c scopeCounts) bool { return c.scope == p.Scope })
		if k < 0 {
			out = append(out, scopeCounts{scope: p.Scope})
			k = len(out) - 1
		}
		switch p.outcome {
		case dedupe.Applied:
			// A claimed record's guard row counts its own applied
			// delivery (dedupe.Guard.Count): a batch of applied records
			// writes no counter row.
			if !p.claimed {
				out[k].Applied++
			}
		case dedupe.Duplicate:
			out[k].Duplicate++
		case dedupe.DeadLettered:
			out[k].DeadLettered++
		}
	}
	return out
}

// results returns the outcomes of the first n records, in dst's array
// when it has room.
func (b *batch) results(dst []Result, n int) []Result {
	out := slices.Grow(dst[:0], n)[:n]
	for i := range n {
		p := &b.preps[i]
		out[i] = Result{Outcome: p.outcome, Key: p.Key, Handler: p.Handler, Reason: p.reason}
	}
	return out
}
