package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
)

// namedCredit is the credit handler of these tests under another name,
// with opts (handler.WithScope, say): the same key function, the same
// ledger writes.
func namedCredit(name string, opts ...handler.Option) *handler.Handler[credit] {
	return handler.New(name, creditKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
		return insertCredit(ctx, tx, msg.Value)
	}, opts...)
}

// runUntilRefused runs a consumer built from cfg and opts and returns the
// error Run returns; it fails t when Run is still running after 30s (the
// consumer started instead of refusing).
func runUntilRefused(t *testing.T, cfg consumer.Config, pool *pgxpool.Pool, opts ...consumer.Option) error {
	t.Helper()
	c, err := consumer.New(cfg, pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		cancel()
		<-done
		t.Fatal("Run was still running after 30s: the member started instead of refusing")
		return nil
	}
}

// A rolling deploy that renames a handler (credit-v1 to credit-v2, same
// keys) without keeping its scope: the keys of credit-v2 are claimed in a
// new scope, so while members of both run, each applies every key (10
// commands delivered to both gave 20 ledger rows, nothing logged). The
// group records the scope its handler uses on the topic, and the member
// that brings another refuses to start with a *ScopeChangeError naming the
// group, the topic, both scopes and the way out.
func TestRenamedHandlerRefusesToStart(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	const parts, n = 2, 10
	kc := testenv.Kafka(t, parts, "credits")
	brokers := testenv.Brokers(kc)
	produceCopies(t, brokers, "credits", n, 2, parts)
	cfg := testConfig(brokers, "g", "credits")
	o := newOutcomes()
	startConsumer(t, cfg, pool, consumer.Handle(namedCredit("credit-v1")), consumer.WithHooks(o.hooks()))
	o.await(t, 30*time.Second, "the first member's records", func() bool { return o.total() == 2*n })

	err := runUntilRefused(t, cfg, pool, consumer.Handle(namedCredit("credit-v2")), consumer.WithHooks(o.hooks()))
	var sce *consumer.ScopeChangeError
	if !errors.As(err, &sce) {
		t.Fatalf("Run of the renamed handler = %v, want a *consumer.ScopeChangeError", err)
	}
	if sce.Group != "g" || sce.Topic != "credits" || sce.Route != "" || sce.OldScope != "credit-v1" || sce.OldHandler != "credit-v1" ||
		sce.NewScope != "credit-v2" || sce.NewHandler != "credit-v2" || sce.LastSeen.IsZero() {
		t.Errorf("ScopeChangeError = %+v, want group g, topic credits, scope credit-v1 (handler credit-v1) to credit-v2 (handler credit-v2)", *sce)
	}
	for _, want := range []string{`"g"`, `"credits"`, `"credit-v1"`, `"credit-v2"`, `handler.WithScope("credit-v1")`, "EXACTLY_ALLOW_SCOPE_CHANGE"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if got := count(t, pool, `select count(*) from ledger`); got != n {
		t.Errorf("ledger rows = %d, want %d", got, n)
	}
}

// A handler renamed with handler.WithScope(old name) keeps its keys' scope:
// both members run side by side in the group, each key is applied once.
func TestRenamedHandlerKeepingItsScopeRuns(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	const parts, n = 2, 10
	kc := testenv.Kafka(t, parts, "credits")
	brokers := testenv.Brokers(kc)
	cfg := testConfig(brokers, "g", "credits")
	o := newOutcomes()
	logs := newLogCapture()
	startConsumer(t, cfg, pool, consumer.Handle(namedCredit("credit-v1")), consumer.WithHooks(o.hooks()))
	startConsumer(t, cfg, pool, consumer.Handle(namedCredit("credit-v2", handler.WithScope("credit-v1"))),
		consumer.WithHooks(o.hooks()), consumer.WithLogger(slog.New(logs)))
	logs.await(t, 30*time.Second, 1, "partitions assigned")
	produceCopies(t, brokers, "credits", n, 2, parts)
	o.await(t, 60*time.Second, "every delivery", func() bool { return o.total() == 2*n })
	if got := count(t, pool, `select count(*) from ledger`); got != n {
		t.Errorf("ledger rows = %d, want %d (one per key)", got, n)
	}
	if got := count(t, pool, `select count(*) from exactly_guard_scopes where consumer_group = 'g' and topic = 'credits' and scope = 'credit-v1'`); got != 1 {
		t.Errorf("recorded scopes credit-v1 = %d, want 1", got)
	}
}

// Config.AllowScopeChange lets a member change its handler's scope
// deliberately: it starts, logs an error-level line, and records the new
// scope, so that a member that comes back with the old scope is refused in
// turn.
func TestScopeChangeAllowedExplicitly(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "credits")
	brokers := testenv.Brokers(kc)
	cfg := testConfig(brokers, "g", "credits")
	logs := newLogCapture()
	stop := startConsumer(t, cfg, pool, consumer.Handle(namedCredit("credit-v1")), consumer.WithLogger(slog.New(logs)))
	logs.await(t, 30*time.Second, 1, "partitions assigned")
	stop()

	allow := cfg
	allow.AllowScopeChange = true
	changed := newLogCapture()
	startConsumer(t, allow, pool, consumer.Handle(namedCredit("credit-v2")), consumer.WithLogger(slog.New(changed)))
	warned := changed.await(t, 30*time.Second, 1, "SCOPE CHANGED")
	if warned[0].Level != slog.LevelError {
		t.Errorf("the scope change was logged at %v, want error", warned[0].Level)
	}
	changed.await(t, 30*time.Second, 1, "partitions assigned")
	if got := count(t, pool, `select count(*) from exactly_guard_scopes where consumer_group = 'g' and topic = 'credits' and scope = 'credit-v2' and handler = 'credit-v2'`); got != 1 {
		t.Errorf("recorded scope credit-v2 rows = %d, want 1", got)
	}

	err := runUntilRefused(t, cfg, pool, consumer.Handle(namedCredit("credit-v1")))
	var sce *consumer.ScopeChangeError
	if !errors.As(err, &sce) || sce.OldScope != "credit-v2" || sce.NewScope != "credit-v1" {
		t.Fatalf("Run with the old scope after the change = %v, want a *consumer.ScopeChangeError from credit-v2 to credit-v1", err)
	}
}

// A Router's handlers are recorded per routed type: a route whose handler
// changed scope is refused (the error names the route), a route added
// beside the recorded ones is not.
func TestRouterScopesAreRecordedPerRoute(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "wallet")
	brokers := testenv.Brokers(kc)
	cfg := testConfig(brokers, "g", "wallet")
	router := func(routes ...handler.RouteOption) *handler.Router {
		return handler.NewRouter("wallet", handler.ByHeader("type"), routes...)
	}
	logs := newLogCapture()
	stop := startConsumer(t, cfg, pool, consumer.Handle(router(handler.Route("deposit", namedCredit("deposit")))), consumer.WithLogger(slog.New(logs)))
	logs.await(t, 30*time.Second, 1, "partitions assigned")
	stop()

	added := newLogCapture()
	stop = startConsumer(t, cfg, pool, consumer.Handle(router(handler.Route("deposit", namedCredit("deposit")), handler.Route("refund", namedCredit("refund")))),
		consumer.WithLogger(slog.New(added)))
	added.await(t, 30*time.Second, 1, "partitions assigned")
	stop()
	if got := count(t, pool, `select count(*) from exactly_guard_scopes where consumer_group = 'g' and topic = 'wallet'`); got != 2 {
		t.Errorf("recorded routes = %d, want 2 (deposit, refund)", got)
	}

	err := runUntilRefused(t, cfg, pool, consumer.Handle(router(handler.Route("deposit", namedCredit("deposit-v2")), handler.Route("refund", namedCredit("refund")))))
	var sce *consumer.ScopeChangeError
	if !errors.As(err, &sce) || sce.Route != "deposit" || sce.OldScope != "deposit" || sce.NewScope != "deposit-v2" {
		t.Fatalf("Run with route deposit renamed = %v, want a *consumer.ScopeChangeError on route deposit", err)
	}
	if !strings.Contains(err.Error(), `route "deposit"`) {
		t.Errorf("error %q does not name the route", err)
	}
}
