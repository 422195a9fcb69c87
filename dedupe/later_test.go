package dedupe_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/runtime/deferred"
	"github.com/exactly-go/exactly/internal/runtime/memo"
)

// Inside a consumer's batch (a memo and a buffer of deferred writes in the
// context), a remembered result is not written by Call: it is queued with
// the batch's deferred writes, invisible until they are flushed, and Call
// returns it at once. Flushing writes every queued row in one statement;
// a key queued twice is written once, with the first result. Where a
// different result is recorded first, the flush fails naming the key
// (SQLSTATE 22P02); where the same one is, it succeeds. A strict memo (the
// record's deferred writes failed before) records at once and returns the
// result recorded first.
func TestRememberedResultRecordedWithDeferredWrites(t *testing.T) {
	e, pool := effects(t)
	ctx := context.Background()
	remembered := func(m *memo.Memo, key, result string) {
		t.Helper()
		if _, err := e.Precall(memo.With(ctx, m), "billing", key, func(context.Context, string) ([]byte, error) { return []byte(result), nil }); err != nil {
			t.Fatal(err)
		}
	}
	noCall := func(context.Context, string) ([]byte, error) {
		t.Error("called; want the remembered result")
		return nil, errors.New("called")
	}
	// Recorded first, committed: "old" for k-diff and "same" for k-same.
	first := begin(t, pool)
	for key, r := range map[string]string{"k-diff": "old", "k-same": "same"} {
		if _, err := e.Call(ctx, first, "billing", key, func(context.Context, string) ([]byte, error) { return []byte(r), nil }); err != nil {
			t.Fatal(err)
		}
	}
	commit(t, first)

	var m memo.Memo
	remembered(&m, "k-new", "new")
	remembered(&m, "k-same", "same")
	tx := begin(t, pool)
	buf := deferred.New(tx)
	bctx := deferred.With(memo.With(ctx, &m), buf)
	for _, key := range []string{"k-new", "k-new", "k-same"} {
		got, err := e.Call(bctx, tx, "billing", key, noCall)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[string]string{"k-new": "new", "k-same": "same"}[key]; string(got) != want {
			t.Errorf("Call(%s) = %q, want %q", key, got, want)
		}
	}
	if _, found := lookup(t, e, tx, "billing", "k-new"); found {
		t.Error("k-new is recorded before the flush; want its row queued")
	}
	if err := buf.Flush(ctx); err != nil {
		t.Fatalf("flushing remembered results: %v", err)
	}
	if ef, found := lookup(t, e, tx, "billing", "k-new"); !found || ef.State != dedupe.Done || string(ef.Result) != "new" {
		t.Errorf("k-new after the flush: %+v found=%v; want done with \"new\"", ef, found)
	}
	commit(t, tx)

	// A different result recorded first: the flush fails, naming the key.
	var m2 memo.Memo
	remembered(&m2, "k-diff", "mine")
	tx = begin(t, pool)
	buf = deferred.New(tx)
	got, err := e.Call(deferred.With(memo.With(ctx, &m2), buf), tx, "billing", "k-diff", noCall)
	if err != nil || string(got) != "mine" {
		t.Fatalf("Call(k-diff) = %q, %v; want the remembered \"mine\", queued", got, err)
	}
	err = buf.Flush(ctx)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22P02" || !strings.Contains(pgErr.Message, "billing/k-diff") {
		t.Fatalf("flush over another recorded result: %v; want SQLSTATE 22P02 naming billing/k-diff", err)
	}
	_ = tx.Rollback(ctx)

	// Strict: recorded at once, the result recorded first returned.
	m2.SetStrict()
	tx = begin(t, pool)
	buf = deferred.New(tx)
	got, err = e.Call(deferred.With(memo.With(ctx, &m2), buf), tx, "billing", "k-diff", noCall)
	if err != nil || string(got) != "old" {
		t.Fatalf("strict Call(k-diff) = %q, %v; want the recorded \"old\"", got, err)
	}
	if err := buf.Flush(ctx); err != nil {
		t.Fatalf("strict: flushing: %v", err)
	}
	commit(t, tx)
}

// Two records of one batch whose calls remembered different results for
// one effect key: the transaction records the first record's result, and
// Call gives the second record that result too, not the one its own call
// remembered and the table will never hold.
func TestOneKeyRememberedTwiceInABatchGetsTheFirstResult(t *testing.T) {
	e, pool := effects(t)
	ctx := context.Background()
	remembered := func(m *memo.Memo, result string) {
		t.Helper()
		if _, err := e.Precall(memo.With(ctx, m), "billing", "k-twice", func(context.Context, string) ([]byte, error) { return []byte(result), nil }); err != nil {
			t.Fatal(err)
		}
	}
	noCall := func(context.Context, string) ([]byte, error) {
		t.Error("called; want the remembered result")
		return nil, errors.New("called")
	}
	var first, second memo.Memo
	remembered(&first, "first")
	remembered(&second, "second")
	tx := begin(t, pool)
	buf := deferred.New(tx)
	for i, m := range []*memo.Memo{&first, &second} {
		got, err := e.Call(deferred.With(memo.With(ctx, m), buf), tx, "billing", "k-twice", noCall)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != "first" {
			t.Errorf("record %d: Call(k-twice) = %q, want %q: the result the batch records", i+1, got, "first")
		}
	}
	if err := buf.Flush(ctx); err != nil {
		t.Fatalf("flushing remembered results: %v", err)
	}
	if ef, found := lookup(t, e, tx, "billing", "k-twice"); !found || string(ef.Result) != "first" {
		t.Errorf("k-twice after the flush: %+v found=%v; want done with \"first\"", ef, found)
	}
	commit(t, tx)
}
