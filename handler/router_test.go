package handler_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
)

type deposit struct {
	Type string `json:"type"`
	ID   string `json:"deposit_id"`
}

type transfer struct {
	Type string `json:"type"`
	ID   string `json:"transfer_id"`
	From string `json:"from"`
}

func routeNoop[T any](context.Context, pgx.Tx, handler.Message[T]) error { return nil }

func routes() []handler.RouteOption {
	return []handler.RouteOption{
		handler.Route("deposit", handler.New("deposit",
			handler.FromPayload(func(d deposit) string { return dedupe.Key("deposit", d.ID) }), routeNoop[deposit])),
		handler.Route("transfer", handler.New("transfer",
			handler.FromPayload(func(t transfer) string { return dedupe.Key("transfer", t.ID) }), routeNoop[transfer],
			handler.WithScope("payments"))),
	}
}

// Each record is decoded and keyed by the handler its type names, read
// from a header or from a JSON field.
func TestRouterChoosesHandlerByType(t *testing.T) {
	byHeader := handler.NewRouter("wallet", handler.ByHeader("type"), routes()...)
	byField := handler.NewRouter("wallet", handler.ByField("type"), routes()...)
	for _, r := range []*handler.Router{byHeader, byField} {
		if err := r.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	hdr := func(v string) []handler.Header { return []handler.Header{{Key: "type", Value: []byte(v)}} }
	for _, tc := range []struct {
		r    *handler.Router
		rec  handler.Record
		want string
	}{
		{byHeader, handler.Record{Headers: hdr("deposit"), Value: []byte(`{"deposit_id":"d1"}`)}, "deposit:d1"},
		{byHeader, handler.Record{Headers: hdr("transfer"), Value: []byte(`{"transfer_id":"t1"}`)}, "transfer:t1"},
		{byField, handler.Record{Value: []byte(`{"type":"deposit","deposit_id":"d2"}`)}, "deposit:d2"},
		{byField, handler.Record{Value: []byte(`{"type":"transfer","transfer_id":"t2"}`)}, "transfer:t2"},
	} {
		p, err := tc.r.PrepareUnit(tc.rec)
		if err != nil || p.Key != tc.want {
			t.Errorf("PrepareUnit(%s) = %q, %v; want key %q", tc.rec.Value, p.Key, err, tc.want)
		}
		if key, err := tc.r.Key(tc.rec); err != nil || key != tc.want {
			t.Errorf("Key(%s) = %q, %v; want %q", tc.rec.Value, key, err, tc.want)
		}
	}
}

// A missing, unreadable or unknown type fails with a *RouteError naming
// what was found and the known types; the record is not decoded by any
// handler.
func TestRouterRejectsMissingAndUnknownTypes(t *testing.T) {
	byHeader := handler.NewRouter("wallet", handler.ByHeader("type"), routes()...)
	byField := handler.NewRouter("wallet", handler.ByField("type"), routes()...)
	for _, tc := range []struct {
		r    *handler.Router
		rec  handler.Record
		want string
	}{
		{byHeader, handler.Record{Value: []byte(`{}`)}, "no type in header type (known types: deposit, transfer)"},
		{byHeader, handler.Record{Headers: []handler.Header{{Key: "type", Value: []byte("refund")}}, Value: []byte(`{}`)},
			`unknown type "refund" in header type`},
		{byField, handler.Record{Value: []byte(`{"deposit_id":"d1"}`)}, "no type in JSON field type"},
		{byField, handler.Record{Value: []byte(`{"type":7}`)}, `field "type" is not a string`},
		{byField, handler.Record{Value: []byte(`garbage`)}, "the value is not a JSON object"},
		{byField, handler.Record{Value: []byte(`{"type":"Deposit"}`)}, `unknown type "Deposit"`},
	} {
		_, err := tc.r.PrepareUnit(tc.rec)
		var re *handler.RouteError
		if !errors.As(err, &re) || !strings.Contains(err.Error(), tc.want) || len(re.Known) != 2 {
			t.Errorf("PrepareUnit(%s) = %v, want a *RouteError containing %q", tc.rec.Value, err, tc.want)
		}
		if _, err := tc.r.Key(tc.rec); !errors.As(err, &re) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Key(%s) = %v, want a *RouteError containing %q", tc.rec.Value, err, tc.want)
		}
	}
}

// An invalid router says every problem at start-up.
func TestRouterValidate(t *testing.T) {
	dup := handler.New("deposit", handler.FromPayload(func(d deposit) string { return d.ID }), routeNoop[deposit])
	r := handler.NewRouter("", handler.Discriminator{},
		handler.Route("", dup), handler.Route("a", nil), handler.Route("b", dup), handler.Route("b", dup), handler.Route("c", dup))
	err := r.Validate()
	for _, want := range []string{"empty name", "no discriminator", "empty type", `route "a" has a nil handler`,
		`type "b" is routed twice`, `route to two handlers named "deposit"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, want)
		}
	}
	if err := handler.NewRouter("w", handler.ByHeader("type")).Validate(); err == nil || !strings.Contains(err.Error(), "no routes") {
		t.Errorf("a router without routes validates: %v", err)
	}
}
