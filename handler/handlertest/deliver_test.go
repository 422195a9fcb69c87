package handlertest_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/handlertest"
	"github.com/exactly-go/exactly/internal/testenv"
)

type deposit struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
}

type refund struct {
	ID string `json:"id"`
}

// A handler.Permanent failure is what a consumer dead-letters at once:
// Deliver counts it in DeadLettered with its reason, not in Errors, and
// marks the key's guard row dead-lettered. (Each copy is a record of its
// own, which a consumer would dead-letter too: only a redelivery of the
// same record is a duplicate.) An ordinary failure stays in Errors (a
// consumer would retry it).
func TestPermanentFailureIsDeadLettered(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	refuse := handler.New("refuse", handler.FromPayload(func(d deposit) string { return dedupe.Key("deposit", d.ID) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[deposit]) error {
			if msg.Value.Amount < 0 {
				return handler.Permanent(errors.New("negative amount"))
			}
			return errors.New("ledger unavailable")
		})
	rep := handlertest.Deliver(ctx, t, pool, refuse, handlertest.Delivery{Copies: 2, Sequential: true}, deposit{"d-1", -5})
	if rep.DeadLettered != 2 || rep.Applied != 0 || len(rep.Errors) != 0 {
		t.Fatalf("permanent failure: dead-lettered %d, applied %d, errors %v; want 2, 0 and none", rep.DeadLettered, rep.Applied, rep.Errors)
	}
	if len(rep.DeadLetterReasons) != 2 || !strings.Contains(rep.DeadLetterReasons[0].Error(), "negative amount") {
		t.Errorf("dead-letter reasons %v, want the handler's error", rep.DeadLetterReasons)
	}
	var state string
	if err := pool.QueryRow(ctx, `select state from exactly_guard where scope = 'refuse' and key = 'deposit:d-1'`).Scan(&state); err != nil || state != "dead_lettered" {
		t.Errorf("guard row state %q (%v), want dead_lettered", state, err)
	}

	rep = handlertest.Deliver(ctx, t, pool, refuse, handlertest.Delivery{Copies: 1}, deposit{"d-2", 5})
	if rep.DeadLettered != 0 || len(rep.Errors) != 1 {
		t.Errorf("ordinary failure: dead-lettered %d, errors %v; want 0 and one", rep.DeadLettered, rep.Errors)
	}
}

// A *handler.Router goes to Deliver like a handler: values are encoded by
// the route that takes their type and routed by the header given in the
// delivery; every key applies once; an unknown type is dead-lettered with a
// *handler.RouteError; a router with no route for the values' type fails t.
func TestDeliverToARouter(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	if _, err := pool.Exec(ctx, `create table deposits(id text primary key, amount bigint not null)`); err != nil {
		t.Fatal(err)
	}
	wallet := handler.NewRouter("wallet", handler.ByHeader("type"),
		handler.Route("deposit", handler.New("deposit", handler.FromPayload(func(d deposit) string { return dedupe.Key("deposit", d.ID) }),
			func(ctx context.Context, tx pgx.Tx, msg handler.Message[deposit]) error {
				_, err := tx.Exec(ctx, `insert into deposits(id, amount) values ($1, $2)`, msg.Value.ID, msg.Value.Amount)
				return err
			})),
		handler.Route("refund", handler.New("refund", handler.FromPayload(func(r refund) string { return dedupe.Key("refund", r.ID) }),
			func(ctx context.Context, tx pgx.Tx, msg handler.Message[refund]) error { return nil })),
	)
	typed := func(typ string) handlertest.Delivery {
		return handlertest.Delivery{Copies: 3, Headers: []handler.Header{{Key: "type", Value: []byte(typ)}}}
	}
	rep := handlertest.Deliver(ctx, t, pool, wallet, typed("deposit"), deposit{"d-1", 100}, deposit{"d-2", 30})
	handlertest.AssertOneEffectPerKey(t, rep)
	if rep.Applied != 2 || rep.Duplicates != 4 {
		t.Errorf("applied %d, duplicates %d; want 2 and 4", rep.Applied, rep.Duplicates)
	}
	var n int
	if err := pool.QueryRow(ctx, `select count(*) from deposits`).Scan(&n); err != nil || n != 2 {
		t.Errorf("%d deposit rows (%v), want 2", n, err)
	}

	rep = handlertest.Deliver(ctx, t, pool, wallet, handlertest.Delivery{Copies: 1, Headers: []handler.Header{{Key: "type", Value: []byte("transfer")}}}, deposit{"d-3", 1})
	var re *handler.RouteError
	if rep.DeadLettered != 1 || len(rep.DeadLetterReasons) != 1 || !errors.As(rep.DeadLetterReasons[0], &re) {
		t.Errorf("unknown type: dead-lettered %d, reasons %v; want one *handler.RouteError", rep.DeadLettered, rep.DeadLetterReasons)
	}

	var r recorder
	r.run(func(tb handlertest.TB) {
		handlertest.Deliver(ctx, tb, pool, wallet, typed("deposit"), "not a routed type")
	})
	if len(r.failures) != 1 || !strings.Contains(r.failures[0], `router "wallet" has no route whose handler takes a string`) {
		t.Errorf("values no route takes: failures %q, want one naming the router and the type", r.failures)
	}
}

// A handler.WithCall handler's call runs before its transaction, as in a
// consumer with key concurrency on: delivered three times one after
// another, the provider is called once (the copies after the first find
// the guard row and skip the call), the handler records the call's result
// without calling inside the transaction, and the effect row holds it. A
// call failing with handler.Permanent dead-letters its delivery; another
// failure is in Errors.
func TestDeliverRunsThePreTransactionCall(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	effects := dedupe.NewEffects(nil)
	calls := map[string]int{}
	h := handler.New("charge", handler.FromPayload(func(d deposit) string { return dedupe.Key("charge", d.ID) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[deposit]) error {
			_, err := effects.Call(ctx, tx, msg.Scope, msg.Key, func(context.Context, string) ([]byte, error) {
				return nil, errors.New("called inside the transaction")
			})
			return err
		},
		handler.WithCall(func(ctx context.Context, msg handler.Message[deposit]) error {
			_, err := effects.Precall(ctx, msg.Scope, msg.Key, func(_ context.Context, key string) ([]byte, error) {
				calls[key]++
				switch {
				case msg.Value.Amount < 0:
					return nil, handler.Permanent(errors.New("card declined"))
				case msg.Value.Amount == 0:
					return nil, errors.New("provider unavailable")
				}
				return []byte("receipt-" + key), nil
			})
			return err
		}))
	rep := handlertest.Deliver(ctx, t, pool, h, handlertest.Delivery{Copies: 3, Sequential: true}, deposit{"c-1", 5})
	if rep.Applied != 1 || rep.Duplicates != 2 || len(rep.Errors) != 0 || calls["charge:c-1"] != 1 {
		t.Fatalf("applied %d, duplicates %d, errors %v, calls %d; want 1, 2, none and 1", rep.Applied, rep.Duplicates, rep.Errors, calls["charge:c-1"])
	}
	var result string
	if err := pool.QueryRow(ctx, `select convert_from(result, 'UTF8') from exactly_guard_effects where scope = 'charge' and key = 'charge:c-1' and state = 'done'`).Scan(&result); err != nil || result != "receipt-charge:c-1" {
		t.Errorf("recorded result %q (%v), want the call's receipt", result, err)
	}

	rep = handlertest.Deliver(ctx, t, pool, h, handlertest.Delivery{Copies: 1}, deposit{"c-2", -1})
	if rep.DeadLettered != 1 || len(rep.Errors) != 0 || len(rep.DeadLetterReasons) != 1 || !strings.Contains(rep.DeadLetterReasons[0].Error(), "card declined") {
		t.Errorf("permanent call failure: dead-lettered %d, reasons %v, errors %v; want 1 with the call's error", rep.DeadLettered, rep.DeadLetterReasons, rep.Errors)
	}
	rep = handlertest.Deliver(ctx, t, pool, h, handlertest.Delivery{Copies: 1}, deposit{"c-3", 0})
	if rep.DeadLettered != 0 || rep.Applied != 0 || len(rep.Errors) != 1 || !strings.Contains(rep.Errors[0].Error(), "provider unavailable") {
		t.Errorf("failing call: dead-lettered %d, applied %d, errors %v; want one error", rep.DeadLettered, rep.Applied, rep.Errors)
	}
}

// A handler.NewWithCall handler delivered through Deliver: the call is
// made once for three sequential copies, its typed result reaches the
// transaction function, and it is recorded in the effects table of the
// delivery's guard (a non-default one here).
func TestDeliverRunsNewWithCall(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	g := dedupe.New(dedupe.WithTable("public", "charge_guard"))
	type receipt struct {
		ID string `json:"id"`
	}
	calls := map[string]int{}
	var stored []string
	h := handler.NewWithCall("charge", handler.FromPayload(func(d deposit) string { return dedupe.Key("charge", d.ID) }),
		func(_ context.Context, msg handler.Message[deposit], idempotencyKey string) (receipt, error) {
			calls[idempotencyKey]++
			return receipt{ID: "ch-" + msg.Value.ID}, nil
		},
		func(_ context.Context, _ pgx.Tx, _ handler.Message[deposit], r receipt) error {
			stored = append(stored, r.ID)
			return nil
		})
	rep := handlertest.Deliver(ctx, t, pool, h, handlertest.Delivery{Copies: 3, Sequential: true, Guard: g}, deposit{"c-1", 5})
	if rep.Applied != 1 || rep.Duplicates != 2 || len(rep.Errors) != 0 || calls["charge:c-1"] != 1 {
		t.Fatalf("applied %d, duplicates %d, errors %v, calls %v; want 1, 2, none and one call", rep.Applied, rep.Duplicates, rep.Errors, calls)
	}
	if len(stored) != 1 || stored[0] != "ch-c-1" {
		t.Errorf("the transaction function got %q, want the call's ch-c-1", stored)
	}
	var result string
	if err := pool.QueryRow(ctx, `select convert_from(result, 'UTF8') from charge_guard_effects where key = 'charge:c-1' and state = 'done'`).Scan(&result); err != nil || result != `{"id":"ch-c-1"}` {
		t.Errorf("recorded result %q (%v), want the call's receipt in charge_guard_effects", result, err)
	}
}
