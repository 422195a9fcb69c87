package handler_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/handler"
)

type move struct {
	From string `json:"from"`
	To   string `json:"to"`
}

func moveKey(m move) string { return m.From + ">" + m.To }

// Lock keys are derived with the record's key; a lock-key function of the
// wrong payload type, or a nil one, makes the handler invalid, naming the
// problem; a panicking one fails the record with a *KeyError.
func TestLockKeys(t *testing.T) {
	noop := func(context.Context, pgx.Tx, handler.Message[move]) error { return nil }
	h := handler.New("moves", handler.FromPayload(moveKey), noop,
		handler.WithLockKeys(func(m move) []string { return []string{m.From, m.To} }))
	p, err := h.PrepareUnit(handler.Record{Value: []byte(`{"from":"a","to":"b"}`)})
	if err != nil || !slices.Equal(p.LockKeys, []string{"a", "b"}) {
		t.Fatalf("lock keys %q, error %v; want [a b]", p.LockKeys, err)
	}

	wrong := handler.New("moves", handler.FromPayload(moveKey), noop, handler.WithLockKeys(func(string) []string { return nil }))
	if err := wrong.Validate(); err == nil || !strings.Contains(err.Error(), "WithLockKeys was given a func(string) []string") {
		t.Errorf("lock keys of the wrong type: Validate() = %v, want it named", err)
	}
	nilFn := handler.NewSet("moves", handler.FromPayload(moveKey),
		func(context.Context, pgx.Tx, []handler.Message[move]) error { return nil }, handler.WithLockKeys[move](nil))
	if err := nilFn.Validate(); err == nil || !strings.Contains(err.Error(), "nil function") {
		t.Errorf("nil lock-key function: Validate() = %v, want it named", err)
	}

	panicky := handler.NewPipelined("moves", handler.FromPayload(moveKey),
		func(context.Context, handler.Queue, handler.Message[move]) error { return nil },
		handler.WithLockKeys(func(m move) []string { panic("no accounts") }))
	_, err = panicky.PrepareUnit(handler.Record{Value: []byte(`{"from":"a","to":"b"}`)})
	var ke *handler.KeyError
	if !errors.As(err, &ke) || !strings.Contains(err.Error(), "no accounts") {
		t.Errorf("panicking lock-key function: %v, want a *KeyError saying why", err)
	}
}

// NewPipelined and NewSet refuse a nil function like New.
func TestNewFormsValidate(t *testing.T) {
	if err := handler.NewPipelined[move]("p", handler.FromPayload(moveKey), nil).Validate(); err == nil {
		t.Error("NewPipelined with a nil function is valid")
	}
	if err := handler.NewSet[move]("s", handler.FromPayload(moveKey), nil).Validate(); err == nil {
		t.Error("NewSet with a nil function is valid")
	}
	if err := handler.NewSet("", handler.FromPayload(moveKey),
		func(context.Context, pgx.Tx, []handler.Message[move]) error { return nil }).Validate(); err == nil {
		t.Error("NewSet with an empty name is valid")
	}
}
