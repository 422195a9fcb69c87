// Package payments is a small fake payment provider for the charge example
// and its tests: an HTTP service on a loopback port with charges in memory,
// and a client for it.
//
// Charges honour the Idempotency-Key header as real providers (Stripe) do:
//
//   - the same key with the same parameters returns the original charge
//     (status 200, header Idempotent-Replayed: true) and charges nothing;
//   - the same key with different parameters is refused with 422;
//   - no key creates a new charge every time.
//
// Refunds go through a legacy endpoint without idempotency keys: every
// POST /v1/refunds-legacy creates a refund. The caller may attach a
// reference, and GET /v1/refunds-legacy?reference=R finds the refund made
// with it: what a reconcile function needs.
//
// Endpoints:
//
//	POST /v1/charges                      {"amount", "currency", "order_id"} -> Charge
//	GET  /v1/charges/{id}                 -> Charge
//	POST /v1/refunds-legacy               {"charge_id", "amount", "reference"} -> Refund
//	GET  /v1/refunds-legacy?reference=R   -> Refund, or 404
package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// ChargeParams are the parameters of a charge.
type ChargeParams struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	OrderID  string `json:"order_id"`
}

// Charge is a charge made by the provider.
type Charge struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	OrderID  string `json:"order_id"`
}

// RefundParams are the parameters of a legacy refund.
type RefundParams struct {
	ChargeID  string `json:"charge_id"`
	Amount    int64  `json:"amount"`
	Reference string `json:"reference,omitempty"`
}

// Refund is a refund made by the provider.
type Refund struct {
	ID        string `json:"id"`
	ChargeID  string `json:"charge_id"`
	Amount    int64  `json:"amount"`
	Reference string `json:"reference,omitempty"`
}

// Stats count what the provider did and was asked.
type Stats struct {
	// ChargeRequests counts POST /v1/charges requests; Replays those
	// answered with an earlier charge because of their Idempotency-Key;
	// Conflicts those refused because the key was reused with other
	// parameters.
	ChargeRequests, Replays, Conflicts int
	// RefundRequests counts POST /v1/refunds-legacy requests that created
	// a refund; RefundLookups the GET lookups by reference.
	RefundRequests, RefundLookups int
}

type keyed struct {
	params ChargeParams
	charge Charge
}

// Server is the fake provider. Start it with Start; it is safe for
// concurrent use.
type Server struct {
	mu      sync.Mutex
	charges []Charge
	byID    map[string]int
	byKey   map[string]keyed
	refunds []Refund
	stats   Stats
	// failRefunds > 0 makes that many refund requests fail with 503 before
	// acting.
	failRefunds int

	srv *http.Server
	ln  net.Listener
	url string
}

// New returns a provider that is not listening; serve its Handler, or use
// Start.
func New() *Server {
	return &Server{byID: map[string]int{}, byKey: map[string]keyed{}}
}

// Start returns a provider listening on a free loopback port. Close stops
// it.
func Start() (*Server, error) {
	s := New()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("payments: listen: %w", err)
	}
	s.ln = ln
	s.url = "http://" + ln.Addr().String()
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// URL is the base URL of a started provider.
func (s *Server) URL() string { return s.url }

// Close stops a started provider.
func (s *Server) Close() error {
	if s.srv == nil {
		return nil
	}
	return s.srv.Close()
}

// Handler serves the provider's API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", s.createCharge)
	mux.HandleFunc("GET /v1/charges/{id}", s.getCharge)
	mux.HandleFunc("POST /v1/refunds-legacy", s.createRefund)
	mux.HandleFunc("GET /v1/refunds-legacy", s.findRefund)
	return mux
}

// Charges returns every charge made, oldest first.
func (s *Server) Charges() []Charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Charge(nil), s.charges...)
}

// Refunds returns every refund made, oldest first.
func (s *Server) Refunds() []Refund {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Refund(nil), s.refunds...)
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// FailRefunds makes the next n refund requests fail with 503 Service
// Unavailable without refunding (the request did not get through).
func (s *Server) FailRefunds(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failRefunds = n
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

type apiError struct {
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, typ, msg string) {
	var e apiError
	e.Error.Type, e.Error.Message = typ, msg
	writeJSON(w, status, e)
}

func (s *Server) createCharge(w http.ResponseWriter, r *http.Request) {
	var p ChargeParams
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Amount <= 0 {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "a positive amount is required")
		return
	}
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.ChargeRequests++
	if key != "" {
		if k, ok := s.byKey[key]; ok {
			if k.params != p {
				s.stats.Conflicts++
				writeError(w, http.StatusUnprocessableEntity, "idempotency_error",
					"Keys for idempotent requests can only be used with the same parameters they were first used with.")
				return
			}
			s.stats.Replays++
			w.Header().Set("Idempotent-Replayed", "true")
			writeJSON(w, http.StatusOK, k.charge)
			return
		}
	}
	c := Charge{ID: "ch_" + strconv.Itoa(len(s.charges)+1), Amount: p.Amount, Currency: p.Currency, OrderID: p.OrderID}
	s.byID[c.ID] = len(s.charges)
	s.charges = append(s.charges, c)
	if key != "" {
		s.byKey[key] = keyed{params: p, charge: c}
	}
	writeJSON(w, http.StatusOK, c)
}

func (s *Server) getCharge(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.byID[r.PathValue("id")]
	if !ok {
		writeError(w, http.StatusNotFound, "invalid_request_error", "no such charge")
		return
	}
	writeJSON(w, http.StatusOK, s.charges[i])
}

func (s *Server) createRefund(w http.ResponseWriter, r *http.Request) {
	var p RefundParams
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Amount <= 0 {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "a positive amount is required")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failRefunds > 0 {
		s.failRefunds--
		writeError(w, http.StatusServiceUnavailable, "api_error", "try again later")
		return
	}
	if _, ok := s.byID[p.ChargeID]; !ok {
		writeError(w, http.StatusNotFound, "invalid_request_error", "no such charge")
		return
	}
	s.stats.RefundRequests++
	rf := Refund{ID: "re_" + strconv.Itoa(len(s.refunds)+1), ChargeID: p.ChargeID, Amount: p.Amount, Reference: p.Reference}
	s.refunds = append(s.refunds, rf)
	writeJSON(w, http.StatusOK, rf)
}

func (s *Server) findRefund(w http.ResponseWriter, r *http.Request) {
	ref := r.URL.Query().Get("reference")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.RefundLookups++
	if ref != "" {
		for _, rf := range s.refunds {
			if rf.Reference == ref {
				writeJSON(w, http.StatusOK, rf)
				return
			}
		}
	}
	writeError(w, http.StatusNotFound, "invalid_request_error", "no refund with that reference")
}

// Error is an error response of the provider.
type Error struct {
	Status  int
	Type    string
	Message string
}

// Error describes the response.
func (e *Error) Error() string {
	return fmt.Sprintf("payments: %d %s: %s", e.Status, e.Type, e.Message)
}

// ErrNotFound is matched (errors.Is) by a 404 *Error.
var ErrNotFound = errors.New("payments: not found")

// Is reports whether target is ErrNotFound and e is a 404.
func (e *Error) Is(target error) bool {
	return target == ErrNotFound && e.Status == http.StatusNotFound
}

// Client calls the provider.
type Client struct {
	// BaseURL is the provider's URL (Server.URL).
	BaseURL string
	// HTTP is the HTTP client; nil means one with a 10-second timeout.
	HTTP *http.Client
}

var defaultHTTP = &http.Client{Timeout: 10 * time.Second}

func (c *Client) do(ctx context.Context, method, path string, header http.Header, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("payments: encoding request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, body)
	if err != nil {
		return fmt.Errorf("payments: %w", err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := c.HTTP
	if hc == nil {
		hc = defaultHTTP
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("payments: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("payments: reading response of %s %s: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var ae apiError
		_ = json.Unmarshal(b, &ae)
		return &Error{Status: resp.StatusCode, Type: ae.Error.Type, Message: ae.Error.Message}
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("payments: decoding response of %s %s: %w", method, path, err)
	}
	return nil
}

// CreateCharge charges p. A non-empty idempotencyKey is sent as the
// Idempotency-Key header: repeating the call with the same key and
// parameters returns the original charge.
func (c *Client) CreateCharge(ctx context.Context, idempotencyKey string, p ChargeParams) (Charge, error) {
	h := http.Header{}
	if idempotencyKey != "" {
		h.Set("Idempotency-Key", idempotencyKey)
	}
	var ch Charge
	err := c.do(ctx, http.MethodPost, "/v1/charges", h, p, &ch)
	return ch, err
}

// GetCharge returns the charge with id.
func (c *Client) GetCharge(ctx context.Context, id string) (Charge, error) {
	var ch Charge
	err := c.do(ctx, http.MethodGet, "/v1/charges/"+id, nil, nil, &ch)
	return ch, err
}

// CreateLegacyRefund refunds through the legacy endpoint, which has no
// idempotency keys: every call refunds again.
func (c *Client) CreateLegacyRefund(ctx context.Context, p RefundParams) (Refund, error) {
	var rf Refund
	err := c.do(ctx, http.MethodPost, "/v1/refunds-legacy", nil, p, &rf)
	return rf, err
}

// FindLegacyRefund returns the refund made with reference; found is false
// when there is none.
func (c *Client) FindLegacyRefund(ctx context.Context, reference string) (rf Refund, found bool, err error) {
	q := "/v1/refunds-legacy?reference=" + url.QueryEscape(reference)
	err = c.do(ctx, http.MethodGet, q, nil, nil, &rf)
	if errors.Is(err, ErrNotFound) {
		return Refund{}, false, nil
	}
	if err != nil {
		return Refund{}, false, err
	}
	return rf, true, nil
}
