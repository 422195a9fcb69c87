package handler_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/handler"
)

type order struct {
	Customer *struct {
		ID string `json:"id"`
	} `json:"customer"`
}

type panickyCodec struct{ handler.JSON }

func (panickyCodec) Unmarshal([]byte, any) error { panic("codec bug") }

// A key function or a codec that panics on a record makes that record fail
// with a permanent, typed error (it goes to the dead-letter topic) instead
// of crashing the consumer on every redelivery.
func TestPrepareRecoversPanics(t *testing.T) {
	noop := func(context.Context, pgx.Tx, handler.Message[order]) error { return nil }
	byCustomer := handler.New("orders", handler.FromPayload(func(o order) string { return o.Customer.ID }), noop)
	_, err := byCustomer.PrepareUnit(handler.Record{Value: []byte(`{}`)}) // no customer: nil dereference
	var ke *handler.KeyError
	if !errors.As(err, &ke) {
		t.Fatalf("key function panic: got %v, want a *KeyError", err)
	}

	badCodec := handler.New("orders", handler.FromCoordinates[order](), noop, handler.WithCodec(panickyCodec{}))
	_, err = badCodec.PrepareUnit(handler.Record{Value: []byte(`{}`)})
	var de *handler.DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("codec panic: got %v, want a *DecodeError", err)
	}
}
