// Package handlertest is the kit for testing exactly handlers in your own
// tests, against your own database: deliver messages to a handler many
// times, concurrently, through the same transaction path the consumer uses
// (guard claim, handler, commit), and assert one effect per key; for
// naturally idempotent handlers, assert that running twice leaves the same
// state as running once.
//
// [RequireOutboxed] and [RequireOutboxCount] assert the messages a handler
// added to the outbox, as River's rivertest.RequireInserted asserts
// inserted jobs: nothing is relayed in a test, so the rows stay in the
// table for the assertions.
//
// No Kafka is involved: records are built in memory with the coordinates
// you choose. The database must be real; the guard table is migrated on
// first use. Every function takes the test's context first and fails t,
// with the reason, when something cannot be done.
package handlertest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
	"github.com/exactly-go/exactly/internal/runtime/callctx"
	"github.com/exactly-go/exactly/internal/runtime/memo"
)

// TB is the part of testing.TB the kit uses; a *testing.T or *testing.B
// is one. Fatalf must stop the calling goroutine (testing's does, with
// runtime.Goexit).
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// Report counts what a delivery run did.
type Report struct {
	// Applied, Duplicates and DeadLettered count deliveries by outcome.
	Applied, Duplicates, DeadLettered int
	// Applies counts applied deliveries per key; one effect per key means
	// every value is 1.
	Applies map[string]int
	// Deliveries counts deliveries per key.
	Deliveries map[string]int
	// Errors holds the errors of deliveries that did not commit and would
	// be retried by a consumer (a handler's ordinary failure, an outage).
	Errors []error
	// DeadLetterReasons holds, per dead-lettered delivery, why: a value that
	// cannot be decoded or keyed, an unknown route, or a handler error
	// wrapped with handler.Permanent. A consumer sends such a record to the
	// dead-letter topic at once; Deliver marks its guard row dead-lettered
	// and publishes nothing.
	DeadLetterReasons []error
}

// Delivery configures [Deliver].
type Delivery struct {
	// Copies is how many times each message is delivered (default 3).
	Copies int
	// Sequential delivers the copies one after another instead of all at
	// once.
	Sequential bool
	// Topic is the topic of the built records (default "test").
	Topic string
	// Headers are set on every record (e.g. a message-id for FromHeader).
	Headers []handler.Header
	// Guard is the guard to claim with; default dedupe.New().
	Guard *dedupe.Guard
}

// Typed is a handler of payload type T of any form: a *handler.Handler[T],
// *handler.Pipelined[T] or *handler.Set[T]. [Deliver] encodes values with
// it.
type Typed[T any] interface {
	handler.Any
	// Encode encodes a value with the handler's codec.
	Encode(v T) ([]byte, error)
}

// Deliver encodes each value with h's codec and delivers it d.Copies times
// to h against pool, each delivery in its own transaction, the copies of
// all values concurrently (unless d.Sequential). Copies of one value get
// different partitions and offsets, as redeliveries and producer-side
// duplicates do.
//
// h is a handler of payload type T ([Typed]) or a *handler.Router, whose
// values are encoded by its first route (in type order) that takes a T;
// give the router's discriminator in d.Headers (handler.ByHeader) or in
// the values (handler.ByField). A delivery the consumer would dead-letter
// at once (a handler.Permanent error, an undecodable or unroutable record)
// is counted in Report.DeadLettered, with its reason in
// Report.DeadLetterReasons; other failures are in Report.Errors.
//
// A handler built with handler.WithCall has its call run first, as a
// consumer with key concurrency on runs it: outside any transaction,
// skipped when the delivery's guard row exists, its result recorded by
// the handler's dedupe.Effects.Call in the transaction that follows. A
// failing call is a failed delivery (in Report.Errors), or a dead-lettered
// one when it is handler.Permanent.
//
// It fails t when h is invalid or takes no T, a value cannot be encoded or
// the guard cannot be migrated, and returns the counts.
func Deliver[T any](ctx context.Context, t TB, pool *pgxpool.Pool, h handler.Any, d Delivery, values ...T) Report {
	t.Helper()
	if d.Copies == 0 {
		d.Copies = 3
	}
	if d.Topic == "" {
		d.Topic = "test"
	}
	if d.Guard == nil {
		d.Guard = dedupe.New()
	}
	if err := d.Guard.Migrate(ctx, pool); err != nil {
		t.Fatalf("handlertest: migrating the guard table: %v", err)
	}
	if h == nil {
		t.Fatalf("handlertest: nil handler")
	}
	if err := h.Validate(); err != nil {
		t.Fatalf("handlertest: %v", err)
	}
	enc, err := encoder[T](h)
	if err != nil {
		t.Fatalf("handlertest: %v", err)
	}
	// The dead-letter step of a consumer, without Kafka: the guard row is
	// marked dead-lettered in the delivery's transaction and nothing is
	// published.
	noTopic := func(context.Context, pgx.Tx, handler.Record, string, int, error) error { return nil }
	exec := &apply.Executor{Pool: pool, Guard: d.Guard, Handler: h, DeadLetter: noTopic, Effects: dedupe.NewEffects(d.Guard)}
	var recs []handler.Record
	for i, v := range values {
		b, err := enc.Encode(v)
		if err != nil {
			t.Fatalf("handlertest: encoding value %d: %v", i, err)
		}
		for c := 0; c < d.Copies; c++ {
			recs = append(recs, handler.Record{
				Topic: d.Topic, Partition: int32(c), Offset: int64(i),
				Value: b, Headers: append([]handler.Header(nil), d.Headers...),
			})
		}
	}
	rep := Report{Applies: map[string]int{}, Deliveries: map[string]int{}}
	var mu sync.Mutex
	deliver := func(rec handler.Record) {
		item, callErr := preCall(ctx, exec, pool, d.Guard, rec)
		if callErr != nil {
			mu.Lock()
			defer mu.Unlock()
			rep.Deliveries[callErr.Key]++
			rep.Errors = append(rep.Errors, callErr)
			return
		}
		results, herr, err := exec.Run(ctx, []apply.Item{item})
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err != nil:
			rep.Errors = append(rep.Errors, err)
		case herr != nil:
			rep.Deliveries[herr.Key]++
			rep.Errors = append(rep.Errors, herr)
		default:
			r := results[0]
			rep.Deliveries[r.Key]++
			switch r.Outcome {
			case dedupe.Applied:
				rep.Applied++
				rep.Applies[r.Key]++
			case dedupe.Duplicate:
				rep.Duplicates++
			case dedupe.DeadLettered:
				rep.DeadLettered++
				rep.DeadLetterReasons = append(rep.DeadLetterReasons, r.Reason)
			}
		}
	}
	if d.Sequential {
		for _, r := range recs {
			deliver(r)
		}
		return rep
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, r := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			deliver(r)
		}()
	}
	close(start)
	wg.Wait()
	return rep
}

// preCall runs rec's pre-transaction call (handler.WithCall), as a
// consumer with key concurrency on does: outside any transaction, skipped
// when the record's guard row exists, its result remembered for the
// record's transaction. It returns the item to run: with the call's
// results, or, when the call failed for good (handler.Permanent), to be
// dead-lettered with its error. A call that failed otherwise is returned
// as the attempt's *apply.HandlerError.
func preCall(ctx context.Context, exec *apply.Executor, pool *pgxpool.Pool, g *dedupe.Guard, rec handler.Record) (apply.Item, *apply.HandlerError) {
	item := apply.Item{Record: rec, Attempt: 1}
	p, err := exec.Prepare(rec)
	if err != nil || p.Call == nil {
		return item, nil
	}
	item.Prepared, item.Memo = &p, &memo.Memo{}
	if !p.Unguarded {
		if found, err := g.Claimed(ctx, pool, p.Scope, []string{p.Key}); err == nil && found[0] {
			return item, nil // a duplicate: its transaction finds the row
		}
	}
	if err := p.Call(callctx.With(memo.With(ctx, item.Memo), exec.Effects), 1); err != nil {
		herr := &apply.HandlerError{Key: p.Key, Err: err}
		if !herr.Permanent() {
			return item, herr
		}
		item.Exhausted = err
	}
	return item, nil
}

// encoder returns what encodes h's values: h itself, or the handler of a
// router's first route (in type order) that takes a T. It fails when none
// does.
func encoder[T any](h handler.Any) (Typed[T], error) {
	if typed, ok := h.(Typed[T]); ok {
		return typed, nil
	}
	var zero T
	r, ok := h.(*handler.Router)
	if !ok {
		return nil, fmt.Errorf("handler %q does not take a %T", h.Name(), zero)
	}
	for _, typ := range r.Types() {
		if route, _ := r.Handler(typ); route != nil {
			if typed, ok := route.(Typed[T]); ok {
				return typed, nil
			}
		}
	}
	return nil, fmt.Errorf("router %q has no route whose handler takes a %T (types %v)", h.Name(), zero, r.Types())
}

// AssertOneEffectPerKey fails t unless every key in rep was applied exactly
// once and no delivery failed.
func AssertOneEffectPerKey(t TB, rep Report) {
	t.Helper()
	for _, err := range rep.Errors {
		t.Errorf("handlertest: a delivery failed: %v", err)
	}
	for key := range rep.Deliveries {
		if n := rep.Applies[key]; n != 1 {
			t.Errorf("handlertest: key %q applied %d times over %d deliveries, want once", key, n, rep.Deliveries[key])
		}
	}
}

// Snapshot reads the state a handler affects, in a form reflect.DeepEqual
// can compare (e.g. the rows of a table as a slice, ordered).
type Snapshot func(ctx context.Context, pool *pgxpool.Pool) (any, error)

// AssertIdempotent checks a handler declared handler.NaturallyIdempotent:
// it delivers values once, takes a snapshot, delivers them again, and fails
// t unless the second snapshot equals the first. It also fails t when the
// handler claims guard rows (then it is not declared idempotent and
// AssertOneEffectPerKey is the check to use).
func AssertIdempotent[T any](ctx context.Context, t TB, pool *pgxpool.Pool, h *handler.Handler[T], snap Snapshot, values ...T) {
	t.Helper()
	if h.Guarded() {
		t.Fatalf("handlertest: handler %q is guarded; declare it handler.NaturallyIdempotent() or use AssertOneEffectPerKey", h.Name())
	}
	once := Deliver(ctx, t, pool, h, Delivery{Copies: 1, Sequential: true}, values...)
	if len(once.Errors) > 0 {
		t.Fatalf("handlertest: first run failed: %v", errors.Join(once.Errors...))
	}
	first, err := snap(ctx, pool)
	if err != nil {
		t.Fatalf("handlertest: snapshot after one run: %v", err)
	}
	twice := Deliver(ctx, t, pool, h, Delivery{Copies: 1, Sequential: true}, values...)
	if len(twice.Errors) > 0 {
		t.Fatalf("handlertest: second run failed: %v", errors.Join(twice.Errors...))
	}
	second, err := snap(ctx, pool)
	if err != nil {
		t.Fatalf("handlertest: snapshot after two runs: %v", err)
	}
	if !reflect.DeepEqual(first, second) {
		t.Errorf("handlertest: handler %q is not idempotent:\n after one run:  %s\n after two runs: %s",
			h.Name(), fmt.Sprint(first), fmt.Sprint(second))
	}
}
