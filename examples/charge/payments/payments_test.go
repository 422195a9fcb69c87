package payments_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/exactly-go/exactly/examples/charge/payments"
)

func start(t *testing.T) (*payments.Server, *payments.Client) {
	t.Helper()
	srv, err := payments.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv, &payments.Client{BaseURL: srv.URL()}
}

// Idempotency-Key as Stripe honours it: same key and parameters return the
// original charge; same key, other parameters is refused; no key charges
// every time.
func TestIdempotencyKey(t *testing.T) {
	ctx := context.Background()
	srv, c := start(t)
	p := payments.ChargeParams{Amount: 500, Currency: "eur", OrderID: "o-1"}

	first, err := c.CreateCharge(ctx, "charge:o-1", p)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.CreateCharge(ctx, "charge:o-1", p)
	if err != nil || again != first {
		t.Fatalf("replay = %+v, %v; want the original %+v", again, err, first)
	}
	_, err = c.CreateCharge(ctx, "charge:o-1", payments.ChargeParams{Amount: 600, Currency: "eur", OrderID: "o-1"})
	var pe *payments.Error
	if !errors.As(err, &pe) || pe.Status != http.StatusUnprocessableEntity || pe.Type != "idempotency_error" {
		t.Fatalf("reuse with other parameters: %v", err)
	}
	if len(srv.Charges()) != 1 {
		t.Fatalf("%d charges with one key, want 1", len(srv.Charges()))
	}
	for range 2 {
		if _, err := c.CreateCharge(ctx, "", p); err != nil {
			t.Fatal(err)
		}
	}
	if len(srv.Charges()) != 3 {
		t.Fatalf("%d charges, want 3: without a key every call charges", len(srv.Charges()))
	}
	if st := srv.Stats(); st.ChargeRequests != 5 || st.Replays != 1 || st.Conflicts != 1 {
		t.Fatalf("stats %+v", st)
	}
	if got, err := c.GetCharge(ctx, first.ID); err != nil || got != first {
		t.Fatalf("GetCharge = %+v, %v", got, err)
	}
	if _, err := c.GetCharge(ctx, "ch_missing"); !errors.Is(err, payments.ErrNotFound) {
		t.Fatalf("GetCharge of a missing charge: %v", err)
	}
}

// The legacy refund endpoint has no keys: every call refunds; lookups by
// reference find what was refunded.
func TestLegacyRefunds(t *testing.T) {
	ctx := context.Background()
	srv, c := start(t)
	ch, err := c.CreateCharge(ctx, "", payments.ChargeParams{Amount: 500, Currency: "eur", OrderID: "o-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, found, err := c.FindLegacyRefund(ctx, "refund:o-1"); err != nil || found {
		t.Fatalf("before: found=%v err=%v", found, err)
	}
	srv.FailRefunds(1)
	p := payments.RefundParams{ChargeID: ch.ID, Amount: 100, Reference: "refund:o-1"}
	var pe *payments.Error
	if _, err := c.CreateLegacyRefund(ctx, p); !errors.As(err, &pe) || pe.Status != http.StatusServiceUnavailable {
		t.Fatalf("injected failure: %v", err)
	}
	r1, err := c.CreateLegacyRefund(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateLegacyRefund(ctx, p); err != nil {
		t.Fatal(err)
	}
	if n := len(srv.Refunds()); n != 2 {
		t.Fatalf("%d refunds, want 2: the legacy endpoint refunds on every call", n)
	}
	got, found, err := c.FindLegacyRefund(ctx, "refund:o-1")
	if err != nil || !found || got != r1 {
		t.Fatalf("FindLegacyRefund = %+v, %v, %v; want %+v", got, found, err, r1)
	}
}
