package dedupe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/runtime/memo"
)

// Effects are the helpers for effects outside the database: calls to
// payment providers, mail services, webhooks, which a PostgreSQL transaction
// cannot roll back. They keep one row per (scope, key) in the effects table
// that belongs to a guard (the guard table's name with the suffix
// "_effects", created by the guard's Migrate) and offer the two techniques
// of section 3 of Making Background Jobs Idempotent, in order of preference:
//
//   - [Effects.Call], for APIs that accept an idempotency key: the key is
//     the job's key, so a repeated call returns the original result, and
//     the result is recorded in the handler's transaction.
//   - [Effects.CallReconciled], for APIs without one: a "started" row
//     committed before the call, a "done" row with the result in the
//     handler's transaction, and a user-supplied reconcile function that
//     asks the external system, on a redelivery that finds "started",
//     whether the effect already happened.
//
// Build Effects with [NewEffects]; it is immutable and safe for concurrent
// use. Both helpers are meant to run inside a handler, after the record's
// guard row was claimed in the same transaction (the consumer does that), so
// that concurrent deliveries of one key wait for each other instead of
// calling at the same time.
type Effects struct {
	guard  *Guard
	quoted string

	lookupSQL, recordSQL, settleSQL, laterSQL, lockSQL, startSQL, resultSQL, staleSQL, pruneSQL string
}

// EffectsTable returns the identifier of the external-effects table that
// belongs to g: the guard table's name with the suffix "_effects", in the
// same schema.
func (g *Guard) EffectsTable() pgx.Identifier {
	if g.schema == "" {
		return pgx.Identifier{g.name + "_effects"}
	}
	return pgx.Identifier{g.schema, g.name + "_effects"}
}

// NewEffects returns the effect helpers of g's effects table (nil g means
// New(), the default guard). The table is created by g.Migrate. NewEffects
// never fails.
func NewEffects(g *Guard) *Effects {
	if g == nil {
		g = New()
	}
	e := &Effects{guard: g, quoted: g.EffectsTable().Sanitize()}
	t := e.quoted
	e.lookupSQL = `select state, result, attempts, started_at, done_at from ` + t + ` where scope = $1 and key = $2`
	// Record a result ("done") unless one is already recorded; the
	// statement returns nothing when a committed (or this same) transaction
	// recorded it first.
	e.recordSQL = `insert into ` + t + ` as e (scope, key, state, result, done_at) values ($1, $2, 'done', $3, now())
on conflict (scope, key) do update set state = 'done', result = excluded.result, done_at = excluded.done_at
where e.state <> 'done'
returning true`
	// Record a result unless one is already recorded, and return the
	// result that stands, in one statement: the inserted (or updated) one,
	// or the "done" one the statement's snapshot sees. It returns nothing
	// only when a transaction that committed after the snapshot recorded
	// it first (record then reads it).
	e.settleSQL = `with rec as (` + e.recordSQL[:len(e.recordSQL)-len("true")] + `e.result)
select result from rec
union all
select result from ` + t + ` where scope = $1 and key = $2 and state = 'done' and not exists (select from rec)`
	e.laterSQL = laterSQL(t)
	// A transaction-scoped advisory lock in the two-key space (the outbox
	// and the pruner use the one-key space): concurrent CallReconciled of
	// one key wait for each other even without a guard row.
	e.lockSQL = `select pg_advisory_xact_lock(hashtext($1), hashtext($2))`
	e.startSQL = `insert into ` + t + ` as e (scope, key, state, attempts, started_at) values ($1, $2, 'started', 1, now())
on conflict (scope, key) do update set attempts = e.attempts + 1, started_at = excluded.started_at
where e.state = 'started'
returning true`
	e.resultSQL = `select result from ` + t + ` where scope = $1 and key = $2 and state = 'done'`
	e.staleSQL = `select scope, key, state, result, attempts, started_at, done_at from ` + t + `
where state = 'started' and started_at < now() - $1::bigint * interval '1 microsecond'
order by started_at limit $2`
	e.pruneSQL = `delete from ` + t + ` where ctid = any(array(select ctid from ` + t + `
where done_at < now() - $1::bigint * interval '1 microsecond' limit $2))`
	return e
}

// Table returns the effects table's identifier.
func (e *Effects) Table() pgx.Identifier { return e.guard.EffectsTable() }

// CallFunc performs an external effect. For [Effects.Call] it must pass
// idempotencyKey to the external system as its idempotency key (for
// example the Idempotency-Key header of a payment API); for
// [Effects.CallReconciled] it should leave the key somewhere the reconcile
// function can find it (a reference, a metadata field). The key is the
// caller's key normalized by [NormalizeKey]. It returns the result to record
// (any bytes: an id, a JSON document); an error records nothing.
type CallFunc func(ctx context.Context, idempotencyKey string) (result []byte, err error)

// ReconcileFunc asks the external system whether the effect named by key
// (normalized by [NormalizeKey], as it was passed to the CallFunc) already
// happened, and if so returns the result the call would have returned. An
// error means "cannot tell now": nothing is called, and the error is
// returned (the record is retried).
type ReconcileFunc func(ctx context.Context, key string) (result []byte, happened bool, err error)

// Beginner begins transactions that commit independently of the handler's
// transaction: *pgxpool.Pool and *pgx.Conn satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// State is the state of an effect row.
type State string

// States of an effect row.
const (
	// Started means CallReconciled committed its intent to call and the
	// result is not recorded: the effect may or may not have happened.
	Started State = "started"
	// Done means the result is recorded (committed with the handler's
	// writes, or visible to the transaction that wrote it).
	Done State = "done"
)

// Effect is one row of the effects table.
type Effect struct {
	Scope, Key string
	State      State
	// Result is the recorded result (nil while Started).
	Result []byte
	// Attempts counts the calls CallReconciled started for the key; it is 0
	// for results recorded by Call, which does not count its calls.
	Attempts int
	// StartedAt is when CallReconciled last committed "started" (zero for
	// Call); DoneAt when the result was recorded (zero while Started).
	StartedAt, DoneAt time.Time
}

// Step names where an [EffectError] happened.
type Step string

// Steps of Call and CallReconciled.
const (
	StepLookup    Step = "lookup"    // reading the effect row
	StepStart     Step = "start"     // committing "started" (CallReconciled)
	StepCall      Step = "call"      // the CallFunc
	StepReconcile Step = "reconcile" // the ReconcileFunc
	StepRecord    Step = "record"    // writing the result in the handler's transaction
	StepDecode    Step = "decode"    // decoding a result (CallJSON, CallReconciledJSON)
	StepEncode    Step = "encode"    // encoding a result (CallJSON, CallReconciledJSON)
)

// EffectError is a failure of Call or CallReconciled at Step for (Scope,
// Key). Err is the cause: the CallFunc's or ReconcileFunc's own error
// (reachable with errors.Is and errors.As, so an API's typed errors and
// net.Error timeouts keep their meaning), or the database error.
type EffectError struct {
	Scope, Key string
	Step       Step
	Err        error
}

// Error names the step, the scope and the key.
func (e *EffectError) Error() string {
	return fmt.Sprintf("dedupe: effect %q in scope %q: %s: %v", e.Key, e.Scope, e.Step, e.Err)
}

// Unwrap returns the cause.
func (e *EffectError) Unwrap() error { return e.Err }

// ErrNilFunc is returned (wrapped) when Call or CallReconciled gets a nil
// CallFunc or ReconcileFunc, or CallReconciled a nil Beginner.
var ErrNilFunc = errors.New("dedupe: nil function")

func (e *Effects) check(op, scope, key string) error {
	if key == "" {
		return fmt.Errorf("dedupe: %s in scope %q: %w", op, scope, ErrEmptyKey)
	}
	if err := checkScope(scope); err != nil {
		return fmt.Errorf("dedupe: %s: %w", op, err)
	}
	return nil
}

// lookup reads the row of (scope, nkey) through q.
func (e *Effects) lookup(ctx context.Context, q Querier, scope, nkey string) (Effect, bool, error) {
	ef := Effect{Scope: scope, Key: nkey}
	var state string
	var started, done *time.Time
	err := q.QueryRow(ctx, e.lookupSQL, scope, nkey).Scan(&state, &ef.Result, &ef.Attempts, &started, &done)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Effect{}, false, nil
	case err != nil:
		return Effect{}, false, err
	}
	ef.State = State(state)
	if started != nil {
		ef.StartedAt = *started
	}
	if done != nil {
		ef.DoneAt = *done
	}
	return ef, true, nil
}

// record writes result as done for (scope, nkey) in tx, and returns the
// result that is recorded: result itself, or the one a committed
// transaction recorded first.
func (e *Effects) record(ctx context.Context, tx pgx.Tx, scope, nkey string, result []byte) ([]byte, error) {
	if result == nil {
		result = []byte{}
	}
	var ok bool
	err := tx.QueryRow(ctx, e.recordSQL, scope, nkey, result).Scan(&ok)
	if err == nil {
		return result, nil
	}
	return e.recordedFirst(ctx, tx, scope, nkey, err)
}

// settle is lookup plus record in one round trip, for a result known
// before the lookup (remembered by the record's run): it writes result as
// done for (scope, nkey) in tx unless a result is recorded already, and
// returns the result that is recorded: result itself, or the one recorded
// first (visible to tx, or committed by a concurrent transaction while the
// statement waited for it).
func (e *Effects) settle(ctx context.Context, tx pgx.Tx, scope, nkey string, result []byte) ([]byte, error) {
	if result == nil {
		result = []byte{}
	}
	var recorded []byte
	err := tx.QueryRow(ctx, e.settleSQL, scope, nkey, result).Scan(&recorded)
	if err == nil {
		return recorded, nil
	}
	return e.recordedFirst(ctx, tx, scope, nkey, err)
}

// recordedFirst reads the result a committed transaction recorded first
// when recording through tx returned no row (err is pgx.ErrNoRows); any
// other err is returned.
func (e *Effects) recordedFirst(ctx context.Context, tx pgx.Tx, scope, nkey string, err error) ([]byte, error) {
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, err
	}
	var recorded []byte
	if err := tx.QueryRow(ctx, e.resultSQL, scope, nkey).Scan(&recorded); err != nil {
		return nil, fmt.Errorf("reading the result recorded first: %w", err)
	}
	return recorded, nil
}

// Call performs an external effect through an API that accepts an
// idempotency key, at most once per (scope, key) as far as the API's
// deduplication reaches, and records its result in tx, the handler's
// transaction.
//
// If a result for (scope, key) is recorded and visible to tx (committed
// earlier, or written by tx itself), Call returns it without calling.
// Otherwise it calls call(ctx, NormalizeKey(key)) and records the result in
// tx, so the handler can store it (a charge id) with its own writes: all of
// them commit or roll back with the guard row.
//
// Why this is safe: the key names the business operation, so every
// delivery of the operation passes the same idempotency key. If the worker
// dies or tx rolls back after the call, the next delivery calls again with
// that key and the provider returns the original result instead of acting
// twice: the provider dedups repeated calls, and the guard row plus the
// recorded result dedup ours. This holds only for as long as the provider
// remembers keys (Stripe: 24 hours): a redelivery later than that acts
// again, so keep the redelivery horizon (retries plus dead-letter replays)
// shorter, or prefer CallReconciled. The call must send the same parameters
// every time; providers reject a reused key with different parameters.
//
// Inside a consumer, a result is also remembered for the record's run:
// when a later record of the batch fails and the batch is replayed in a
// fresh transaction, Call records the remembered result again instead of
// calling (CallReconciled does the same, without reconciling). A
// remembered result (this one, or [Effects.Precall]'s) costs no round trip
// of its own: Call returns it and queues its row with the batch's deferred
// writes, which the consumer sends with COMMIT (one statement per batch
// and effects table), so [Effects.Lookup] in tx does not see it before
// then. A result recorded first still wins: if another one is recorded
// for the key, that statement fails, the record's attempt fails with an
// error naming the scope and key, and its next attempt records at once
// (lookup and record in one statement) and returns the recorded result.
// Outside a consumer's batch, a remembered result costs that one
// statement.
//
// Rollback: if tx rolls back (the handler fails, the process dies before
// COMMIT), the recorded result disappears with it and nothing else was
// written; the effect may have happened at the provider, which is what the
// idempotency key is for. Call holds no lock across the call beyond what
// the caller's tx holds (in a consumer: the guard row).
//
// Call fails with an [*EffectError] (Step StepCall wrapping call's error,
// StepLookup or StepRecord wrapping the database error, after which tx is
// aborted), or wrapping ErrEmptyKey, ErrInvalidScope or ErrNilFunc.
func (e *Effects) Call(ctx context.Context, tx pgx.Tx, scope, key string, call CallFunc) ([]byte, error) {
	if err := e.check("call", scope, key); err != nil {
		return nil, err
	}
	if call == nil {
		return nil, fmt.Errorf("dedupe: call %q in scope %q: %w", key, scope, ErrNilFunc)
	}
	nkey := NormalizeKey(key)
	m, mkey := memo.From(ctx), e.memoKey(scope, nkey)
	if result, called := m.Get(mkey); called {
		// Called before the transaction (Precall) or in an earlier run of
		// the record: recorded with the batch's deferred writes inside a
		// consumer's batch, else looked up and recorded in one statement.
		if buf := laterBuffer(ctx, tx, m); buf != nil {
			return e.recordLater(buf, scope, nkey, result), nil
		}
		recorded, err := e.settle(ctx, tx, scope, nkey, result)
		if err != nil {
			return nil, &EffectError{Scope: scope, Key: key, Step: StepRecord, Err: err}
		}
		return recorded, nil
	}
	ef, found, err := e.lookup(ctx, tx, scope, nkey)
	if err != nil {
		return nil, &EffectError{Scope: scope, Key: key, Step: StepLookup, Err: err}
	}
	if found && ef.State == Done {
		return ef.Result, nil
	}
	result, err := call(ctx, nkey)
	if err != nil {
		return nil, &EffectError{Scope: scope, Key: key, Step: StepCall, Err: err}
	}
	m.Put(mkey, result)
	recorded, err := e.record(ctx, tx, scope, nkey, result)
	if err != nil {
		return nil, &EffectError{Scope: scope, Key: key, Step: StepRecord, Err: err}
	}
	return recorded, nil
}

// Precall is the part of [Effects.Call] that runs outside the handler's
// transaction: the pre-transaction call of a handler built with
// handler.WithCall. It calls call(ctx, NormalizeKey(key)) unless the
// record's run already has a result for (scope, key) in this effects table
// (an earlier attempt's call succeeded), and remembers the result for the
// record's transaction, where the handler's Call (or CallJSON) with the same
// scope and key records it instead of calling. It returns the result.
//
// Precall reads nothing from the database and holds no connection while
// it calls: the consumer skipped the records whose guard row exists, and
// a result recorded by an earlier delivery still wins inside the
// transaction (Call returns the recorded result, not the remembered one).
// Outside a consumer's pre-transaction phase nothing remembers the
// result; Precall then only calls.
//
// If the worker dies between the call and COMMIT, the remembered result is
// lost with it and nothing was recorded: the next delivery calls again
// with the same idempotency key, and the provider returns the original
// result, as after a rollback of Call. For APIs without idempotency keys
// there is no pre-transaction form: [Effects.CallReconciled] must commit
// "started" before it calls, inside the handler.
//
// Precall fails with an [*EffectError] (Step StepCall wrapping call's
// error), or wrapping ErrEmptyKey, ErrInvalidScope or ErrNilFunc.
func (e *Effects) Precall(ctx context.Context, scope, key string, call CallFunc) ([]byte, error) {
	if err := e.check("precall", scope, key); err != nil {
		return nil, err
	}
	if call == nil {
		return nil, fmt.Errorf("dedupe: precall %q in scope %q: %w", key, scope, ErrNilFunc)
	}
	nkey := NormalizeKey(key)
	m, mkey := memo.From(ctx), e.memoKey(scope, nkey)
	if result, called := m.Get(mkey); called {
		return result, nil
	}
	result, err := call(ctx, nkey)
	if err != nil {
		return nil, &EffectError{Scope: scope, Key: key, Step: StepCall, Err: err}
	}
	m.Put(mkey, result)
	return result, nil
}

// PrecallJSON is [Effects.Precall] for a typed result, encoded with
// encoding/json as [CallJSON] records it: the handler's CallJSON with the
// same scope and key then records it. It fails like Precall, plus an
// [*EffectError] with Step StepEncode or StepDecode.
func PrecallJSON[R any](ctx context.Context, e *Effects, scope, key string, call func(ctx context.Context, idempotencyKey string) (R, error)) (R, error) {
	if call == nil {
		var zero R
		return zero, fmt.Errorf("dedupe: precall %q in scope %q: %w", key, scope, ErrNilFunc)
	}
	return callAsJSON(scope, key, call, func(f CallFunc) ([]byte, error) { return e.Precall(ctx, scope, key, f) })
}

// memoKey names (scope, nkey) of this effects table in the consumer's
// per-record memo of call results (see "External calls inside a replayed
// batch" in docs/design.md): when a later record of the batch fails and the
// batch is replayed in a fresh transaction, the result of a call made in the
// rolled-back one is recorded again instead of calling a second time.
func (e *Effects) memoKey(scope, nkey string) string {
	return e.quoted + "\x00" + scope + "\x00" + nkey
}

// CallReconciled performs an external effect through an API without
// idempotency keys, with the started/done state machine of section 3 of
// Making Background Jobs Idempotent kept in the effects table:
//
//  1. In tx it takes a transaction-scoped advisory lock on (scope, key), so
//     concurrent calls of one key wait for each other, and reads the row.
//     A recorded result ("done") is returned without calling.
//  2. If the row is "started" (an earlier attempt may have called), it asks
//     reconcile(ctx, NormalizeKey(key)) whether the effect happened. If it
//     did, the returned result is recorded in tx and returned; nothing is
//     called. If reconcile fails, so does CallReconciled, calling nothing.
//  3. Otherwise it commits "started" in its OWN transaction on db (never
//     tx: the intent must survive tx's rollback and a crash), then calls
//     call(ctx, NormalizeKey(key)), then records "done" with the result in
//     tx.
//
// Rollback: if tx rolls back (or the process dies before COMMIT), the
// "done" row goes with it and the committed "started" row stays, so the
// next delivery reconciles before calling again. An error from call leaves
// "started" too: a call that failed may still have acted (a timeout after
// the request was sent). Nothing in tx is written before the result is
// known except the advisory lock.
//
// The window that remains. A crash before the call is covered ("started"
// is committed first, reconcile says no, the call happens once), and so is
// a crash after the call (reconcile finds the effect). What is not covered
// is a reconcile that answers wrongly: an external system that is
// eventually consistent (the effect is not yet visible to its read API), a
// request still in flight or queued when reconcile asks (a timed-out call
// the system executes later), or a lookup that cannot find the effect
// (reconcile must search by something call left there, such as the key as
// a reference). Each of those leads to a second call. Make reconcile read
// from the system of record, and let enough time pass (the consumer's
// retry backoff) before the redelivery. Prefer APIs with idempotency keys
// ([Effects.Call]) whenever there is one.
//
// Started but abandoned: if the record is never processed again after
// "started" committed (it was dead-lettered and never replayed, its topic
// was deleted, the handler changed to stop calling), the row stays
// "started" and nobody knows whether the effect happened. [Effects.Stale]
// lists such rows for an operator to reconcile by hand; Prune never
// deletes them.
//
// db must not be the connection of tx; a pool works if it has a spare
// connection while tx holds one (size the pool above the number of
// partitions processed at once, or pass a dedicated small pool). The
// handler's transaction should be READ COMMITTED (the default): under
// REPEATABLE READ it cannot see the "started" row committed after its
// snapshot, and recording "done" fails with a serialization error, which
// the consumer retries.
//
// CallReconciled fails with an [*EffectError] (Step StepReconcile or
// StepCall wrapping the function's error, StepLookup, StepStart or
// StepRecord wrapping the database error; tx is aborted after StepLookup or
// StepRecord), or wrapping ErrEmptyKey, ErrInvalidScope or ErrNilFunc.
func (e *Effects) CallReconciled(ctx context.Context, db Beginner, tx pgx.Tx, scope, key string, call CallFunc, reconcile ReconcileFunc) ([]byte, error) {
	if err := e.check("call reconciled", scope, key); err != nil {
		return nil, err
	}
	if call == nil || reconcile == nil || db == nil {
		return nil, fmt.Errorf("dedupe: call reconciled %q in scope %q: %w", key, scope, ErrNilFunc)
	}
	nkey := NormalizeKey(key)
	fail := func(step Step, err error) ([]byte, error) {
		return nil, &EffectError{Scope: scope, Key: key, Step: step, Err: err}
	}
	if _, err := tx.Exec(ctx, e.lockSQL, e.quoted+" "+scope, nkey); err != nil {
		return fail(StepLookup, fmt.Errorf("locking the key: %w", err))
	}
	ef, found, err := e.lookup(ctx, tx, scope, nkey)
	if err != nil {
		return fail(StepLookup, err)
	}
	if found && ef.State == Done {
		return ef.Result, nil
	}
	m, mkey := memo.From(ctx), e.memoKey(scope, nkey)
	if result, called := m.Get(mkey); called {
		// Called by an earlier run of this record in this batch, whose
		// transaction was rolled back with a later record's failure.
		recorded, err := e.record(ctx, tx, scope, nkey, result)
		if err != nil {
			return fail(StepRecord, err)
		}
		return recorded, nil
	}
	if found && ef.State == Started {
		result, happened, err := reconcile(ctx, nkey)
		if err != nil {
			return fail(StepReconcile, err)
		}
		if happened {
			recorded, err := e.record(ctx, tx, scope, nkey, result)
			if err != nil {
				return fail(StepRecord, err)
			}
			return recorded, nil
		}
	}
	recorded, done, err := e.start(ctx, db, scope, nkey)
	if err != nil {
		return fail(StepStart, err)
	}
	if done {
		// Recorded meanwhile by a transaction that did not hold the lock
		// (Call on the same key): that result stands.
		return recorded, nil
	}
	result, err := call(ctx, nkey)
	if err != nil {
		return fail(StepCall, err)
	}
	m.Put(mkey, result)
	if recorded, err = e.record(ctx, tx, scope, nkey, result); err != nil {
		return fail(StepRecord, err)
	}
	return recorded, nil
}

// start commits "started" for (scope, nkey) in its own transaction on db.
// done reports that a result was recorded and committed already; it is then
// returned.
func (e *Effects) start(ctx context.Context, db Beginner, scope, nkey string) (recorded []byte, done bool, err error) {
	stx, err := db.Begin(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("beginning the transaction that records the start: %w", err)
	}
	defer stx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	var ok bool
	err = stx.QueryRow(ctx, e.startSQL, scope, nkey).Scan(&ok)
	if errors.Is(err, pgx.ErrNoRows) {
		if err := stx.QueryRow(ctx, e.resultSQL, scope, nkey).Scan(&recorded); err != nil {
			return nil, false, fmt.Errorf("reading the recorded result: %w", err)
		}
		return recorded, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	if err := stx.Commit(ctx); err != nil {
		return nil, false, fmt.Errorf("committing the start: %w", err)
	}
	return nil, false, nil
}

// CallJSON is [Effects.Call] for a typed result, stored as JSON: call's
// result is encoded with encoding/json when recorded, and a recorded result
// is decoded into R. Rollback and errors are those of Call, plus an
// [*EffectError] with Step StepEncode or StepDecode.
func CallJSON[R any](ctx context.Context, e *Effects, tx pgx.Tx, scope, key string, call func(ctx context.Context, idempotencyKey string) (R, error)) (R, error) {
	if call == nil {
		var zero R
		return zero, fmt.Errorf("dedupe: call %q in scope %q: %w", key, scope, ErrNilFunc)
	}
	return callAsJSON(scope, key, call, func(f CallFunc) ([]byte, error) { return e.Call(ctx, tx, scope, key, f) })
}

// callAsJSON runs run with call's result encoded as JSON and decodes what
// run returns into R: the typed form shared by CallJSON and PrecallJSON. An
// encoding failure is returned as the *EffectError with Step StepEncode,
// not wrapped in the StepCall error run reports it as.
func callAsJSON[R any](scope, key string, call func(ctx context.Context, idempotencyKey string) (R, error), run func(CallFunc) ([]byte, error)) (R, error) {
	var zero R
	raw, err := run(func(ctx context.Context, k string) ([]byte, error) {
		r, err := call(ctx, k)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(r)
		if err != nil {
			return nil, &EffectError{Scope: scope, Key: key, Step: StepEncode, Err: err}
		}
		return b, nil
	})
	if err != nil {
		var ee *EffectError
		if errors.As(err, &ee) && ee.Step == StepCall {
			var inner *EffectError
			if errors.As(ee.Err, &inner) && inner.Step == StepEncode {
				return zero, inner
			}
		}
		return zero, err
	}
	return decodeJSON[R](scope, key, raw)
}

// CallReconciledJSON is [Effects.CallReconciled] for a typed result, stored
// as JSON (see CallJSON). Rollback, the remaining window and errors are
// those of CallReconciled, plus an [*EffectError] with Step StepEncode or
// StepDecode.
func CallReconciledJSON[R any](ctx context.Context, e *Effects, db Beginner, tx pgx.Tx, scope, key string,
	call func(ctx context.Context, key string) (R, error),
	reconcile func(ctx context.Context, key string) (R, bool, error),
) (R, error) {
	var zero R
	if call == nil || reconcile == nil {
		return zero, fmt.Errorf("dedupe: call reconciled %q in scope %q: %w", key, scope, ErrNilFunc)
	}
	encode := func(r R) ([]byte, error) {
		b, err := json.Marshal(r)
		if err != nil {
			return nil, &EffectError{Scope: scope, Key: key, Step: StepEncode, Err: err}
		}
		return b, nil
	}
	raw, err := e.CallReconciled(ctx, db, tx, scope, key,
		func(ctx context.Context, k string) ([]byte, error) {
			r, err := call(ctx, k)
			if err != nil {
				return nil, err
			}
			return encode(r)
		},
		func(ctx context.Context, k string) ([]byte, bool, error) {
			r, happened, err := reconcile(ctx, k)
			if err != nil || !happened {
				return nil, happened, err
			}
			b, err := encode(r)
			return b, true, err
		})
	if err != nil {
		var ee *EffectError
		if errors.As(err, &ee) {
			var inner *EffectError
			if errors.As(ee.Err, &inner) && inner.Step == StepEncode {
				return zero, inner
			}
		}
		return zero, err
	}
	return decodeJSON[R](scope, key, raw)
}

func decodeJSON[R any](scope, key string, raw []byte) (R, error) {
	var r R
	if err := json.Unmarshal(raw, &r); err != nil {
		return r, &EffectError{Scope: scope, Key: key, Step: StepDecode, Err: err}
	}
	return r, nil
}

// Lookup returns the effect row of (scope, key) as q sees it (a transaction
// sees its own uncommitted "done"); found is false when there is none. The
// key is normalized with NormalizeKey. Lookup fails wrapping ErrEmptyKey,
// ErrInvalidScope or the database error.
func (e *Effects) Lookup(ctx context.Context, q Querier, scope, key string) (ef Effect, found bool, err error) {
	if err := e.check("lookup effect", scope, key); err != nil {
		return Effect{}, false, err
	}
	ef, found, err = e.lookup(ctx, q, scope, NormalizeKey(key))
	if err != nil {
		return Effect{}, false, fmt.Errorf("dedupe: lookup effect %q in scope %q: %w", key, scope, err)
	}
	return ef, found, nil
}

// Stale returns up to limit effects (oldest first) that have been "started"
// for longer than olderThan without a recorded result: calls whose outcome
// is unknown because their record was not processed again (dead-lettered,
// abandoned) or keeps failing. An operator reconciles them by hand. limit
// <= 0 means DefaultPruneBatchSize. Stale fails wrapping ErrInvalidConfig
// for a negative olderThan, or the database error.
func (e *Effects) Stale(ctx context.Context, q Querier, olderThan time.Duration, limit int) ([]Effect, error) {
	if olderThan < 0 {
		return nil, fmt.Errorf("dedupe: stale effects in %s: negative age %v: %w", e.quoted, olderThan, ErrInvalidConfig)
	}
	if limit <= 0 {
		limit = DefaultPruneBatchSize
	}
	rows, err := q.Query(ctx, e.staleSQL, olderThan.Microseconds(), limit)
	if err != nil {
		return nil, fmt.Errorf("dedupe: stale effects in %s: %w", e.quoted, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Effect, error) {
		var ef Effect
		var state string
		var started, done *time.Time
		if err := r.Scan(&ef.Scope, &ef.Key, &state, &ef.Result, &ef.Attempts, &started, &done); err != nil {
			return Effect{}, err
		}
		ef.State = State(state)
		if started != nil {
			ef.StartedAt = *started
		}
		if done != nil {
			ef.DoneAt = *done
		}
		return ef, nil
	})
	if err != nil {
		return nil, fmt.Errorf("dedupe: stale effects in %s: %w", e.quoted, err)
	}
	return out, nil
}

// Prune deletes effect rows whose result was recorded more than olderThan
// ago, in batches of at most batchSize rows (<= 0 means
// DefaultPruneBatchSize), until a batch deletes fewer. It never deletes
// "started" rows (see Stale). Use at least the guard's retention: a
// redelivery after the guard row is pruned but while the effect row is
// kept still returns the recorded result without calling. It returns the
// rows deleted, also when it fails part-way, and fails wrapping
// ErrInvalidConfig for a negative olderThan, or the database error.
func (e *Effects) Prune(ctx context.Context, q Querier, olderThan time.Duration, batchSize int) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("dedupe: prune %s: negative age %v: %w", e.quoted, olderThan, ErrInvalidConfig)
	}
	if batchSize <= 0 {
		batchSize = DefaultPruneBatchSize
	}
	var total int64
	for {
		tag, err := q.Exec(ctx, e.pruneSQL, olderThan.Microseconds(), batchSize)
		if err != nil {
			return total, fmt.Errorf("dedupe: prune %s: %w", e.quoted, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) {
			return total, nil
		}
	}
}
