package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
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

// With the broker unreachable, status does not print "nothing needs a
// human": it lists the Kafka parts it could not read as problems (text and
// JSON), marks them unread, and exits 1.
func TestStatusBrokerUnreachableNeedsAHuman(t *testing.T) {
	statusFixture(t, "order-1")
	t.Setenv("EXACTLY_KAFKA_BROKERS", closedAddr(t))
	var out bytes.Buffer
	err := runStatus(t.Context(), []string{"-interval", "0"}, &out)
	text := out.String()
	if !errors.Is(err, errNeedsHuman) {
		t.Errorf("status with the broker unreachable: err %v, want errNeedsHuman", err)
	}
	if strings.Contains(text, "nothing needs a human") || !strings.Contains(text, "NEEDS A HUMAN") ||
		!strings.Contains(text, "could not read listing consumer groups") || !strings.Contains(text, "consumer lag:\n  COULD NOT BE READ") {
		t.Errorf("text report with the broker unreachable:\n%s", text)
	}
	if !strings.Contains(text, "backlog 1,") {
		t.Errorf("the database parts were not read:\n%s", text)
	}
	out.Reset()
	err = runStatus(t.Context(), []string{"-json", "-interval", "0"}, &out)
	var r status.Report
	if jerr := json.Unmarshal(out.Bytes(), &r); jerr != nil {
		t.Fatalf("JSON: %v\n%s", jerr, out.String())
	}
	if !errors.Is(err, errNeedsHuman) || len(r.Problems) == 0 || !r.Unknown("lag") || !r.Unknown("dead_letters") {
		t.Errorf("JSON report with the broker unreachable: err %v, problems %q, unread %q", err, r.Problems, r.Unread)
	}
}

// With the database unreachable (after status started, as the page sees
// it), the text report says each database part could not be read, shows no
// zero figures for them, never says "nothing needs a human", and shows no
// password.
func TestStatusTextDatabaseUnreachable(t *testing.T) {
	const secret = "hunter2-cli"
	url := "postgres://app:" + secret + "@" + closedAddr(t) + "/app?connect_timeout=5"
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	r, err := status.Collect(t.Context(), status.Config{Pool: pool, Database: url}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	printStatus(&out, r)
	text := out.String()
	for _, want := range []string{`outbox "exactly_outbox": COULD NOT BE READ`, `guard "exactly_guard": COULD NOT BE READ`,
		"NEEDS A HUMAN", `could not read guard table "exactly_guard": `, `could not read outbox table "exactly_outbox": `,
		`could not read outcome counters "exactly_guard_outcomes": `} {
		if !strings.Contains(text, want) {
			t.Errorf("text report lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "nothing needs a human") || strings.Contains(text, "backlog 0") || strings.Contains(text, secret) {
		t.Errorf("text report with the database unreachable reads as healthy or shows the password:\n%s", text)
	}
}
