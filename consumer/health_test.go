package consumer_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

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

// A member whose partitions are lost (its heartbeats answered
// UNKNOWN_MEMBER_ID: the group dropped it) is not ready from the moment it
// drops them until it has joined again: while the coordinator refuses its
// joins, Ready fails the group check; once it accepts them, it is ready
// again.
func TestNotReadyAfterPartitionsLost(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "credits")
	cfg := testConfig(testenv.Brokers(kc), "g-lost", "credits")
	logs := newLogCapture()
	svc, err := consumer.NewService(cfg, pool, consumer.Handle(creditHandler(0)), consumer.WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := svc.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	runService(t, svc)
	awaitReady := func(want bool, what string) consumer.Readiness {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			r := svc.Ready(ctx)
			if r.Ready == want {
				return r
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: Ready = %+v after 30 s, want ready %v", what, r, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	awaitReady(true, "after start")

	var out atomic.Bool
	out.Store(true)
	kc.ControlKey(kmsg.Heartbeat.Int16(), func(r kmsg.Request) (kmsg.Response, error, bool) {
		if !out.Load() {
			kc.DropControl()
			return nil, nil, false
		}
		kc.KeepControl()
		req := r.(*kmsg.HeartbeatRequest)
		resp := req.ResponseKind().(*kmsg.HeartbeatResponse)
		resp.SetVersion(req.GetVersion())
		resp.ErrorCode = kerr.UnknownMemberID.Code
		return resp, nil, true
	})
	kc.ControlKey(kmsg.JoinGroup.Int16(), func(r kmsg.Request) (kmsg.Response, error, bool) {
		if !out.Load() {
			kc.DropControl()
			return nil, nil, false
		}
		kc.KeepControl()
		req := r.(*kmsg.JoinGroupRequest)
		resp := req.ResponseKind().(*kmsg.JoinGroupResponse)
		resp.SetVersion(req.GetVersion())
		resp.ErrorCode = kerr.CoordinatorLoadInProgress.Code
		return resp, nil, true
	})
	logs.await(t, 30*time.Second, 1, "partitions lost")
	r := svc.Ready(ctx)
	var group consumer.ReadyCheck
	for _, c := range r.Checks {
		if c.Name == "group" {
			group = c
		}
	}
	if r.Ready || group.OK || !strings.Contains(group.Detail, "not a member of group") {
		t.Fatalf("Ready after the partitions were lost, the group refusing the joins = %+v, want not ready: not a member of the group", r)
	}
	out.Store(false)
	awaitReady(true, "after joining again")
}
