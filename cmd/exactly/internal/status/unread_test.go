package status_test

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// deadDatabase returns a pool (connecting lazily) and its connection
// string with password secret, for a database nothing answers.
func deadDatabase(t *testing.T, secret string) (*pgxpool.Pool, string) {
	t.Helper()
	url := "postgres://app:" + secret + "@" + closedAddr(t) + "/app?connect_timeout=5"
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, url
}

// unreachableAdmin returns a Kafka admin client whose only seed broker
// does not answer; its requests fail instead of retrying for long.
func unreachableAdmin(t *testing.T) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(closedAddr(t)), kgo.RetryTimeout(time.Second), kgo.RequestRetries(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// checkBlindSpot asserts that a report with the unread parts want is not
// healthy anywhere it shows: Problems name each part with its error, the
// JSON lists them, and the page is red without "Nothing needs a human".
func checkBlindSpot(t *testing.T, cfg status.Config, secret string, want map[string]string) {
	t.Helper()
	r, err := status.Collect(t.Context(), cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !r.NeedsHuman() {
		t.Error("NeedsHuman is false with a part unread")
	}
	all := strings.Join(r.Problems, "\n")
	for part, phrase := range want {
		if !r.Unknown(part) {
			t.Errorf("part %q is not reported unread; Unread = %q", part, r.Unread)
		}
		if !strings.Contains(all, "could not read "+phrase) {
			t.Errorf("Problems do not say %q could not be read:\n%s", phrase, all)
		}
	}
	b, err := r.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var decoded struct {
		Problems []string `json:"problems"`
		Unread   []string `json:"unread"`
	}
	if err := json.Unmarshal(b, &decoded); err != nil {
		t.Fatal(err)
	}
	if len(decoded.Problems) < len(want) || len(decoded.Unread) != len(want) {
		t.Errorf("JSON problems %q, unread %q; want the %d unread parts in both", decoded.Problems, decoded.Unread, len(want))
	}
	p := newPage(t, cfg)
	res, html := get(t, p, "GET", "/")
	if res.StatusCode != 200 {
		t.Fatalf("page: %s", res.Status)
	}
	if strings.Contains(html, "Nothing needs a human") || !strings.Contains(html, "Needs a human") {
		t.Errorf("page with an unread part does not say it needs a human:\n%s", html)
	}
	if !strings.Contains(html, `<div class="tile bad"><b>?</b>`) || !strings.Contains(html, "could not read ") {
		t.Errorf("page shows no red unknown card or no unread part in its problems:\n%s", html)
	}
	_, js := get(t, p, "GET", "/status.json")
	if secret != "" && (strings.Contains(html, secret) || strings.Contains(js, secret) || strings.Contains(string(b), secret)) {
		t.Errorf("the database password is shown")
	}
	if strings.Contains(js, `"problems": []`) {
		t.Errorf("/status.json lists no problem:\n%s", js)
	}
}

// The database is down: the guard, the outbox, the outcome counters and the
// held records are unknown, not zero, and every view says so in red.
func TestDatabaseUnreachableIsAProblem(t *testing.T) {
	const secret = "hunter2-status"
	pool, url := deadDatabase(t, secret)
	checkBlindSpot(t, status.Config{Pool: pool, Database: url}, secret, map[string]string{
		"guard": `guard table "exactly_guard"`, "outbox": `outbox table "exactly_outbox"`,
		"outcomes": `outcome counters "exactly_guard_outcomes"`, "held": `held records "exactly_guard_held"`,
		"relay": `the relay holder of "exactly_outbox"`,
	})
}

// The broker is down: the lag and the dead-letter topics are unknown, and
// every view says so; the database parts are still read.
func TestBrokerUnreachableIsAProblem(t *testing.T) {
	pool := testenv.DB(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	checkBlindSpot(t, status.Config{Pool: pool, Admin: unreachableAdmin(t), Database: pool.Config().ConnString()}, "",
		map[string]string{"lag": "listing consumer groups", "dead_letters": "listing topics"})
}
