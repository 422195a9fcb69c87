package consumer_test

import (
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/consumer/otelexport"
	"github.com/exactly-go/exactly/internal/testenv"
)

// freeAddr returns a loopback address nothing listens on (for
// Config.MetricsAddr, which Service.Run listens on itself).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// probe GETs u and returns the status code and body (0 when nothing
// answers).
func probe(t *testing.T, u string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading %s: %v", u, err)
	}
	return resp.StatusCode, body
}

// awaitStatus polls u until it answers with status want (within 60s) and
// returns the body.
func awaitStatus(t *testing.T, u string, want int, what string) []byte {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body := probe(t, u)
		if code == want {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s answered %d %s for 60s, want %d", what, u, code, body, want)
		}
		time.Sleep(50 * time.Millisecond) // polling the probe is what Kubernetes does
	}
}

// series returns the samples of family fam whose labels include want,
// with all their labels.
func series(fams map[string]*dto.MetricFamily, fam string, want map[string]string) []*dto.Metric {
	var out []*dto.Metric
	for _, m := range fams[fam].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for k, v := range want {
			ok = ok && labels[k] == v
		}
		if ok {
			out = append(out, m)
		}
	}
	return out
}

func labelsOf(m *dto.Metric) map[string]string {
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	return labels
}

// A running Service, scraped over HTTP before it processed any record,
// exports the operator's metrics: exactly_build_info (1, with version,
// revision and go_version), the counters an alert takes a rate of at 0
// (duplicate spikes, dead letters, guard rows pruned), the age of the
// oldest guard row (a row written an hour ago reads about 3600 s) beside
// the retention, and exactly_relay_active 1 once its relay holds the lock;
// exactly_consumer_committed_offset has no series before the first commit
// and reads 3 once the offsets of 3 records are committed.
func TestServiceExportsOperatorMetrics(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "credits")
	tel, err := otelexport.Setup(context.Background(), otelexport.Config{Prometheus: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	cfg := testConfig(testenv.Brokers(kc), "g", "credits")
	cfg.MetricsAddr = freeAddr(t)
	cfg.GuardRetention = 200 * time.Hour
	svc, err := consumer.NewService(cfg, pool, consumer.Handle(creditHandler(0)),
		consumer.WithMeterProvider(tel.MeterProvider), consumer.WithMetricsHandler(tel.MetricsHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := svc.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `insert into exactly_guard(scope, key, processed_at) values ('s', 'old', now() - interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	runService(t, svc)
	u := "http://" + cfg.MetricsAddr + "/metrics"
	awaitStatus(t, u, 200, "metrics endpoint")
	table := map[string]string{"exactly_outbox_table": `"exactly_outbox"`}
	var fams = scrape(t, u)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if s := series(fams, "exactly_relay_active", table); len(s) == 1 && s[0].GetGauge().GetValue() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exactly_relay_active never 1: %v", fams["exactly_relay_active"])
		}
		time.Sleep(50 * time.Millisecond) // the relay takes its lock inside Run
		fams = scrape(t, u)
	}

	bi := series(fams, "exactly_build_info", nil)
	if len(bi) != 1 || bi[0].GetGauge().GetValue() != 1 {
		t.Fatalf("exactly_build_info = %v, want one series at 1", fams["exactly_build_info"])
	}
	if l := labelsOf(bi[0]); l["go_version"] != runtime.Version() || l["version"] == "" || l["revision"] == "" {
		t.Errorf("exactly_build_info labels %v, want version, revision and go_version %s", l, runtime.Version())
	}

	zero := []struct {
		fam    string
		labels map[string]string
	}{
		{"exactly_duplicate_spikes_total", map[string]string{"exactly_handler": "credit"}},
		{"exactly_dead_letters_total", map[string]string{"exactly_handler": "credit", "messaging_destination_name": "credits"}},
		{"exactly_records_total", map[string]string{"exactly_handler": "credit", "exactly_outcome": "duplicate", "messaging_destination_name": "credits"}},
		{"exactly_retries_total", map[string]string{"exactly_handler": "credit", "exactly_retry_reason": "transient"}},
		{"exactly_guard_pruned_total", map[string]string{"exactly_guard_table": `"exactly_guard"`}},
	}
	for _, z := range zero {
		s := series(fams, z.fam, z.labels)
		if len(s) != 1 || s[0].GetCounter().GetValue() != 0 {
			t.Errorf("%s%v = %v, want one series at 0 before any record", z.fam, z.labels, s)
		}
	}

	guard := map[string]string{"exactly_guard_table": `"exactly_guard"`}
	if s := series(fams, "exactly_guard_oldest_age_seconds", guard); len(s) != 1 ||
		s[0].GetGauge().GetValue() < 3600 || s[0].GetGauge().GetValue() > 3700 {
		t.Errorf("exactly_guard_oldest_age_seconds = %v, want about 3600 (a row written an hour ago)", fams["exactly_guard_oldest_age_seconds"])
	}
	if s := series(fams, "exactly_guard_retention_seconds", guard); len(s) != 1 ||
		math.Abs(s[0].GetGauge().GetValue()-cfg.GuardRetention.Seconds()) > 0.001 {
		t.Errorf("exactly_guard_retention_seconds = %v, want %v", fams["exactly_guard_retention_seconds"], cfg.GuardRetention.Seconds())
	}
	if s := series(fams, "exactly_consumer_committed_offset", nil); len(s) != 0 {
		t.Errorf("exactly_consumer_committed_offset before any commit: %v, want no series", s)
	}

	// After 3 records the member commits offset 3 for the partition.
	produceCopies(t, testenv.Brokers(kc), "credits", 3, 1, 1)
	part := map[string]string{"messaging_destination_name": "credits", "messaging_destination_partition_id": "0", "messaging_consumer_group_name": "g"}
	deadline = time.Now().Add(30 * time.Second)
	for {
		fams = scrape(t, u)
		if s := series(fams, "exactly_consumer_committed_offset", part); len(s) == 1 && s[0].GetGauge().GetValue() == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exactly_consumer_committed_offset never 3 for credits/0: %v", fams["exactly_consumer_committed_offset"])
		}
		time.Sleep(50 * time.Millisecond) // offsets are committed every CommitInterval
	}
}
