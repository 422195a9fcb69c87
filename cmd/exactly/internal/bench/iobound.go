package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/credit"
	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
)

// The I/O-bound scenario: the credit effect with a call to a payment
// provider before it, the provider a local HTTP server that answers after
// providerLatency and dedupes by the Idempotency-Key header, as the jobs
// of Making Background Jobs Idempotent call other systems. The handler
// declares the call once (handler.NewWithCall): the consumer makes it
// before the record's transaction, which records the receipt.
const (
	kindIOBound     = "iobound"
	idIOBound       = "iobound"
	providerLatency = 20 * time.Millisecond
)

// receipt is the provider's answer.
type receipt struct {
	ID string `json:"id"`
}

// provider is the local payment provider: each request waits latency, and
// a repeated Idempotency-Key gets the first answer back.
type provider struct {
	latency time.Duration
	mu      sync.Mutex
	seen    map[string]string
	calls   int
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		http.Error(w, "no Idempotency-Key", http.StatusBadRequest)
		return
	}
	time.Sleep(p.latency)
	p.mu.Lock()
	p.calls++
	id, ok := p.seen[key]
	if !ok {
		id = "ch_" + strconv.Itoa(len(p.seen))
		p.seen[key] = id
	}
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(receipt{ID: id})
}

// startProvider serves a provider on a loopback port; stop ends it.
func startProvider(latency time.Duration) (url string, p *provider, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, nil, fmt.Errorf("listening for the provider: %w", err)
	}
	p = &provider{latency: latency, seen: map[string]string{}}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/charges", p, func() { _ = srv.Close() }, nil
}

// chargeFunc posts a charge for c to url with the idempotency key.
func chargeFunc(client *http.Client, url string, c credit.Command) func(context.Context, string) (receipt, error) {
	return func(ctx context.Context, idempotencyKey string) (receipt, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"?order="+c.OrderID+"&amount="+strconv.FormatInt(c.Amount, 10), nil)
		if err != nil {
			return receipt{}, err
		}
		req.Header.Set("Idempotency-Key", idempotencyKey)
		resp, err := client.Do(req)
		if err != nil {
			return receipt{}, fmt.Errorf("charging order %s: %w", c.OrderID, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return receipt{}, fmt.Errorf("charging order %s: provider answered %s", c.OrderID, resp.Status)
		}
		var r receipt
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return receipt{}, fmt.Errorf("charging order %s: decoding the receipt: %w", c.OrderID, err)
		}
		return r, nil
	}
}

// ioboundCredit is the credit effect behind a provider call, declared
// once (handler.NewWithCall): the call runs before the transaction; in it,
// the receipt is recorded in the effects table of the consumer's guard,
// the ledger row written and the event added to the outbox.
func ioboundCredit(f tables, client *http.Client, url string) *handler.Handler[credit.Command] {
	insert := `insert into ` + f.svc.Ledger().Sanitize() + ` (order_id, account, amount) values ($1, $2, $3)`
	return handler.NewWithCall("credit", handler.FromPayload(credit.Key),
		func(ctx context.Context, msg handler.Message[credit.Command], idempotencyKey string) (receipt, error) {
			return chargeFunc(client, url, msg.Value)(ctx, idempotencyKey)
		},
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit.Command], _ receipt) error {
			c := msg.Value
			if _, err := tx.Exec(ctx, insert, c.OrderID, c.Account, c.Amount); err != nil {
				return fmt.Errorf("inserting the ledger row of order %s: %w", c.OrderID, err)
			}
			return f.ob.AddJSON(ctx, tx, f.events, strconv.AppendInt(nil, c.Account, 10), credit.Credited(c))
		})
}

// runIOBound runs the I/O-bound scenario and reports, besides the rate,
// its ideal: calls in flight (EXACTLY_MAX_CALLS_IN_FLIGHT) ÷ the provider's
// latency.
func runIOBound(ctx context.Context, spec Spec, pool *pgxpool.Pool, f tables, log *slog.Logger) (Result, error) {
	cfg, err := consumer.ConfigFromEnv(ctx)
	if err != nil {
		return Result{}, err
	}
	url, p, stop, err := startProvider(providerLatency)
	if err != nil {
		return Result{}, err
	}
	defer stop()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * cfg.MaxCallsInFlight}}
	defer client.CloseIdleConnections()
	res, err := runExactly(ctx, spec, pool, f, ioboundCredit(f, client, url), log)
	if err != nil {
		return Result{}, err
	}
	res.Ideal = float64(cfg.MaxCallsInFlight) / providerLatency.Seconds()
	p.mu.Lock()
	res.Note = fmt.Sprintf("provider %s per call, %d calls for %d records; ideal %.0f rec/s (%d calls in flight ÷ %s); pool of %d connections",
		providerLatency, p.calls, spec.Records, res.Ideal, cfg.MaxCallsInFlight, providerLatency, spec.Conns)
	p.mu.Unlock()
	return res, nil
}
