package status_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
	"github.com/exactly-go/exactly/internal/runtime/redact"
	"github.com/exactly-go/exactly/outbox"
)

func newPage(t *testing.T, cfg status.Config) *status.Page {
	t.Helper()
	c, err := status.NewCollector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := status.NewPage(c, 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func get(t *testing.T, h http.Handler, method, path string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	res := rec.Result()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// TestPageEscapesHostileInput puts markup and script in every string the
// page shows that others control: a consumer group id, outbox topics, keys
// and header values; none may reach the page as markup.
func TestPageEscapesHostileInput(t *testing.T) {
	s := newScenario(t)
	const (
		group  = `<script>alert("group")</script>`
		topic  = `</td><script>alert('topic')</script>`
		key    = `"><img src=x onerror=alert(1)>`
		header = `<iframe src="javascript:alert(2)">`
	)
	var offsets kadm.Offsets
	offsets.Add(kadm.Offset{Topic: scenarioTopic, Partition: 0, At: 1, LeaderEpoch: -1})
	if _, err := s.admin.CommitOffsets(t.Context(), group, offsets); err != nil {
		t.Fatalf("committing offsets for the hostile group: %v", err)
	}
	// outbox.Add refuses a topic Kafka would refuse, so the hostile row is
	// written as an older version or a hand-made insert would have left it.
	hdrs, err := json.Marshal([]map[string]any{{"key": header, "value": []byte(header)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(t.Context(), `insert into `+outbox.New().Table().Sanitize()+
		` (topic, key, value, headers) values ($1, $2, 'x', $3::jsonb)`, topic, []byte(key), string(hdrs)); err != nil {
		t.Fatalf("writing the hostile outbox row: %v", err)
	}
	cfg := s.cfg
	cfg.Groups = append(cfg.Groups, group)
	cfg.Rows = 1000

	res, body := get(t, newPage(t, cfg), http.MethodGet, "/")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /: %s\n%s", res.Status, body)
	}
	for _, raw := range []string{"<script", "<img", "<iframe"} {
		if strings.Contains(strings.ToLower(body), raw) {
			t.Errorf("page contains raw %q", raw)
		}
	}
	for _, escaped := range []string{
		`&lt;script&gt;alert(&#34;group&#34;)&lt;/script&gt;`,
		`&lt;/td&gt;&lt;script&gt;alert(&#39;topic&#39;)&lt;/script&gt;`,
		`&#34;&gt;&lt;img src=x onerror=alert(1)&gt;`,
		`&lt;iframe src=&#34;javascript:alert(2)&#34;&gt;: &lt;iframe`,
	} {
		if !strings.Contains(body, escaped) {
			t.Errorf("page lacks the escaped form %s", escaped)
		}
	}
	if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy = %q", csp)
	}
}

// TestPageShowsNoSecret: the connection string's password and key
// password never reach the page or its JSON.
func TestPageShowsNoSecret(t *testing.T) {
	s := newScenario(t)
	cfg := s.cfg
	cfg.Database = "postgres://app:s3cret@db.example:5432/orders?sslmode=require&sslpassword=k3y"
	p := newPage(t, cfg)
	for _, path := range []string{"/", "/status.json"} {
		res, body := get(t, p, http.MethodGet, path)
		if res.StatusCode != http.StatusOK || !strings.Contains(body, "app:"+redact.Redacted+"@db.example:5432/orders") {
			t.Errorf("GET %s: %s; want the redacted address shown", path, res.Status)
		}
		if strings.Contains(body, "s3cret") || strings.Contains(body, "k3y") {
			t.Errorf("GET %s shows a secret", path)
		}
	}
}

// TestPageChangesNothing: writes are refused, and serving the page (many
// times) leaves every table's contents and write counters as they were.
func TestPageChangesNothing(t *testing.T) {
	s := newScenario(t)
	p := newPage(t, s.cfg)
	snapshot := func() string {
		var out string
		// Statistics: inserts, updates, deletes per table; and row counts.
		if err := s.pool.QueryRow(t.Context(), `select string_agg(relname || ':' || n_tup_ins || '/' || n_tup_upd || '/' || n_tup_del, ',' order by relname)
			from pg_stat_user_tables`).Scan(&out); err != nil {
			t.Fatal(err)
		}
		var counts string
		if err := s.pool.QueryRow(t.Context(), `select (select count(*) from exactly_guard) || '/' || (select count(*) from exactly_outbox) || '/' ||
			(select sum(applied + duplicate) from exactly_guard_outcomes)`).Scan(&counts); err != nil {
			t.Fatal(err)
		}
		return out + " " + counts
	}
	if _, err := s.pool.Exec(t.Context(), `select pg_stat_force_next_flush()`); err != nil {
		t.Logf("pg_stat_force_next_flush: %v (PostgreSQL < 15)", err)
	}
	before := snapshot()
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		res, _ := get(t, p, m, "/")
		if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s /: %s, Allow %q; want 405 GET, HEAD", m, res.Status, res.Header.Get("Allow"))
		}
	}
	// A fresh page per request: each collects (one page collects at most
	// once a second).
	for _, path := range []string{"/", "/status.json", "/"} {
		if res, body := get(t, newPage(t, s.cfg), http.MethodGet, path); res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s %s", path, res.Status, body)
		}
	}
	if _, err := s.pool.Exec(t.Context(), `select pg_stat_force_next_flush()`); err != nil {
		t.Logf("pg_stat_force_next_flush: %v", err)
	}
	if after := snapshot(); after != before {
		t.Errorf("database changed by reading the page:\nbefore %s\nafter  %s", before, after)
	}
}

func TestCheckListenAddr(t *testing.T) {
	for addr, ok := range map[string]bool{
		"127.0.0.1:8090": true, "[::1]:8090": true, "localhost:8090": true, "127.0.0.2:1": true,
		":8090": false, "0.0.0.0:8090": false, "[::]:8090": false, "192.0.2.1:8090": false, "example.com:80": false, "nonsense": false,
	} {
		err := status.CheckListenAddr(addr, false)
		if (err == nil) != ok {
			t.Errorf("CheckListenAddr(%q, false) = %v; want ok=%v", addr, err, ok)
		}
		if !ok && addr != "nonsense" && !strings.Contains(fmtErr(err), "-allow-remote") {
			t.Errorf("refusal of %q does not name -allow-remote: %v", addr, err)
		}
	}
	if err := status.CheckListenAddr("0.0.0.0:8090", true); err != nil {
		t.Errorf("-allow-remote did not allow 0.0.0.0: %v", err)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestServeRefusesRemoteAndServesLoopback: Serve binds nothing for a
// non-loopback address and serves the page on loopback until ctx ends.
func TestServeRefusesRemoteAndServesLoopback(t *testing.T) {
	s := newScenario(t)
	p := newPage(t, s.cfg)
	// Bound waits: a Serve that wrongly binds 0.0.0.0 is stopped at once
	// (ready cancels it), and one that refuses loopback fails the test
	// instead of leaving it waiting for an address.
	remote, stopRemote := context.WithCancel(t.Context())
	bound := false
	err := status.Serve(remote, "0.0.0.0:0", false, p, func(net.Addr) { bound = true; stopRemote() })
	stopRemote()
	if bound || err == nil || !strings.Contains(err.Error(), "-allow-remote") {
		t.Errorf("Serve on 0.0.0.0: bound %t, error %v; want a refusal naming -allow-remote and nothing bound", bound, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- status.Serve(ctx, "127.0.0.1:0", false, p, func(a net.Addr) { addrs <- a }) }()
	var addr net.Addr
	select {
	case addr = <-addrs:
	case err := <-done:
		t.Fatalf("Serve on 127.0.0.1 returned %v without listening, want it serving", err)
	case <-time.After(30 * time.Second):
		t.Fatal("Serve on 127.0.0.1 did not listen within 30 s")
	}
	client := &http.Client{Timeout: 20 * time.Second}
	res, err := client.Get("http://" + addr.String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), `http-equiv="refresh" content="5"`) {
		t.Errorf("GET: %s; want 200 and a meta refresh of 5s", res.Status)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("Serve did not return within 10 s of its context ending")
	}
}
