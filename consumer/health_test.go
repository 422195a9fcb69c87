package consumer_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testenv"
)

func readiness(t *testing.T, body []byte) (consumer.Readiness, map[string]consumer.ReadyCheck) {
	t.Helper()
	var r consumer.Readiness
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("/readyz body %q is not a Readiness: %v", body, err)
	}
	checks := map[string]consumer.ReadyCheck{}
	for _, c := range r.Checks {
		checks[c.Name] = c
	}
	if len(checks) != 3 || len(r.Checks) != 3 {
		t.Fatalf("/readyz checks %+v, want group, database and schema once each", r.Checks)
	}
	return r, checks
}

// Readiness says why, check by check: before Migrate and before Run the
// service is not ready (no group membership, schema missing) while the
// database answers; running, /readyz answers 200; when the database stops
// accepting connections (ALLOW_CONNECTIONS false, its sessions
// terminated) /readyz answers 503 naming the database, while /healthz stays
// 200 and the consumer stays in its group; when the database accepts
// connections again, /readyz is 200 again.
func TestReadyzFollowsTheDatabase(t *testing.T) {
	dbURL := testenv.DBURL(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	dbName := strings.TrimPrefix(u.Path, "/")
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	pcfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = consumer.PoolConns(1) + 1 // the readiness probe's connection
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	ctx := context.Background()
	admin, err := pgx.Connect(ctx, os.Getenv(testenv.EnvDatabaseURL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	allow := func(on bool) {
		t.Helper()
		v := "false"
		if on {
			v = "true"
		}
		if _, err := admin.Exec(ctx, "alter database "+pgx.Identifier{dbName}.Sanitize()+" allow_connections "+v); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { allow(true) })

	kc := testenv.Kafka(t, 1, "credits")
	cfg := testConfig(testenv.Brokers(kc), "g", "credits")
	cfg.MetricsAddr = freeAddr(t)
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "exactly_test 1\n") })
	svc, err := consumer.NewService(cfg, pool, consumer.Handle(creditHandler(0)), consumer.WithMetricsHandler(metrics))
	if err != nil {
		t.Fatal(err)
	}

	r := svc.Ready(ctx)
	checks := map[string]consumer.ReadyCheck{}
	for _, c := range r.Checks {
		checks[c.Name] = c
	}
	if r.Ready || checks["group"].OK || !checks["database"].OK || checks["schema"].OK ||
		!strings.Contains(checks["schema"].Detail, "does not exist") {
		t.Fatalf("Ready before Migrate and Run = %+v, want not ready: group and schema failing (table missing), database ok", r)
	}
	setupLedger(t, pool)
	if err := svc.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	stop := runService(t, svc)

	base := "http://" + cfg.MetricsAddr
	body := awaitStatus(t, base+"/readyz", http.StatusOK, "after start")
	if r, checks := readiness(t, body); !r.Ready || !checks["group"].OK || !checks["database"].OK || !checks["schema"].OK {
		t.Fatalf("/readyz 200 with body %s", body)
	}

	// The database goes away.
	allow(false)
	if _, err := admin.Exec(ctx, `select pg_terminate_backend(pid) from pg_stat_activity where datname = $1`, dbName); err != nil {
		t.Fatal(err)
	}
	body = awaitStatus(t, base+"/readyz", http.StatusServiceUnavailable, "database refusing connections")
	r, checks = readiness(t, body)
	if r.Ready || checks["database"].OK || checks["database"].Detail == "" || checks["schema"].OK {
		t.Errorf("/readyz 503 with body %s, want the database check failing with its reason and the schema not checked", body)
	}
	if !checks["group"].OK {
		t.Errorf("the consumer left its group during a database outage: %s", body)
	}
	if code, body := probe(t, base+"/healthz"); code != http.StatusOK || !strings.Contains(string(body), "ok") {
		t.Errorf("/healthz during the outage = %d %s, want 200: liveness depends on nothing outside the process", code, body)
	}

	// It comes back.
	allow(true)
	body = awaitStatus(t, base+"/readyz", http.StatusOK, "database back")
	if r, _ := readiness(t, body); !r.Ready {
		t.Fatalf("/readyz 200 with body %s", body)
	}
	if code, _ := probe(t, base+"/metrics"); code != http.StatusOK {
		t.Errorf("/metrics = %d beside the health endpoints", code)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run after cancellation = %v, want nil", err)
	}
}
