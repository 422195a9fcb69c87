package dedupe_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
)

// A payment API that honours Idempotency-Key: the first request with a key
// charges, repeats return the original charge.
func idempotentAPI() (*httptest.Server, func() int) {
	var mu sync.Mutex
	byKey := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		key := r.Header.Get("Idempotency-Key")
		id, ok := byKey[key]
		if !ok {
			id = fmt.Sprintf("ch_%d", len(byKey)+1)
			byKey[key] = id
		}
		fmt.Fprint(w, id)
	}))
	return srv, func() int { mu.Lock(); defer mu.Unlock(); return len(byKey) }
}

func post(ctx context.Context, url, idempotencyKey string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"amount":500}`))
	if err != nil {
		return nil, err
	}
	if idempotencyKey != "" {
		req.Header.Set("Idempotency-Key", idempotencyKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// The handler passes the job's key as the idempotency key and stores the
// charge id in its own transaction. The first attempt rolls back after the
// charge (as when the worker dies before COMMIT); the retry gets the same
// charge back; a later delivery finds the recorded result and does not call.
func ExampleEffects_Call() {
	ctx := context.Background()
	pool, scope := connect()
	defer pool.Close()
	guard := dedupe.New()
	if err := guard.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	effects := dedupe.NewEffects(guard)
	api, charges := idempotentAPI()
	defer api.Close()

	attempt := func(fail bool) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			id, err := effects.Call(ctx, tx, scope, dedupe.Key("charge", "order-8812"),
				func(ctx context.Context, idempotencyKey string) ([]byte, error) {
					fmt.Println("calling the API with key", idempotencyKey)
					return post(ctx, api.URL, idempotencyKey)
				})
			if err != nil {
				return err
			}
			fmt.Println("charge", string(id))
			// ... store the charge id with the handler's other writes, in tx ...
			if fail {
				return fmt.Errorf("crash before commit")
			}
			return nil
		})
		if err != nil {
			fmt.Println("rolled back:", err)
		}
	}
	attempt(true)
	attempt(false)
	attempt(false)
	fmt.Println("charges at the provider:", charges())
	// Output:
	// calling the API with key charge:order-8812
	// charge ch_1
	// rolled back: crash before commit
	// calling the API with key charge:order-8812
	// charge ch_1
	// charge ch_1
	// charges at the provider: 1
}

// An API without idempotency keys: "started" is committed before the call,
// "done" with the handler's transaction. The first attempt refunds and
// then rolls back; the retry finds "started", asks the API (reconcile)
// whether the refund with that reference exists, and records it without
// refunding again.
func ExampleEffects_CallReconciled() {
	ctx := context.Background()
	pool, scope := connect()
	defer pool.Close()
	guard := dedupe.New()
	if err := guard.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	effects := dedupe.NewEffects(guard)

	refunds := map[string]string{} // the external system: refund id by reference
	refund := func(_ context.Context, key string) ([]byte, error) {
		fmt.Println("refunding, reference", key)
		id := fmt.Sprintf("re_%d", len(refunds)+1)
		refunds[key] = id
		return []byte(id), nil
	}
	reconcile := func(_ context.Context, key string) ([]byte, bool, error) {
		id, ok := refunds[key]
		fmt.Println("reconcile: happened =", ok)
		return []byte(id), ok, nil
	}

	for _, fail := range []bool{true, false} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			id, err := effects.CallReconciled(ctx, pool, tx, scope, dedupe.Key("refund", "order-8812"), refund, reconcile)
			if err != nil {
				return err
			}
			fmt.Println("refund", string(id))
			if fail {
				return fmt.Errorf("crash before commit")
			}
			return nil
		})
		if err != nil {
			fmt.Println("rolled back:", err)
		}
	}
	ef, _, _ := effects.Lookup(ctx, pool, scope, dedupe.Key("refund", "order-8812"))
	fmt.Println(ef.State, string(ef.Result), "refunds made:", len(refunds))
	// Output:
	// refunding, reference refund:order-8812
	// refund re_1
	// rolled back: crash before commit
	// reconcile: happened = true
	// refund re_1
	// done re_1 refunds made: 1
}
