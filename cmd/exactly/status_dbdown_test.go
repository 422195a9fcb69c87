package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
	"github.com/exactly-go/exactly/internal/testenv"
)

// lockedBuffer is a bytes.Buffer safe for a writer and a reader on two
// goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// With the database down (DATABASE_URL points at a port nothing listens
// on) and the broker up, status still starts in all three forms and
// reports the broker's lag: the text report shows the group's 2 records of
// lag and no members, marks the database's parts COULD NOT BE READ, and
// exits 1; -json prints a report (not 0 bytes) with the lag read and the
// database's parts unread; -http serves that report.
func TestStatusWithTheDatabaseDownShowsTheBrokersLag(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://app:pw@"+closedAddr(t)+"/app")
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "orders"))
	t.Setenv("EXACTLY_KAFKA_BROKERS", strings.Join(brokers, ","))
	testenv.Produce(t, brokers, &kgo.Record{Topic: "orders", Value: []byte("1")},
		&kgo.Record{Topic: "orders", Value: []byte("2")}, &kgo.Record{Topic: "orders", Value: []byte("3")})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var offsets kadm.Offsets
	offsets.AddOffset("orders", 0, 1, -1)
	if err := kadm.NewClient(cl).CommitAllOffsets(t.Context(), "billing", offsets); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	err = runStatus(t.Context(), []string{"-interval", "0"}, &out)
	text := out.String()
	if !errors.Is(err, errNeedsHuman) {
		t.Errorf("status with the database down: %v, want errNeedsHuman", err)
	}
	for _, want := range []string{`"billing" "orders"/0  committed 1  end 3  lag 2`, `"billing"  state Empty  lag 2`,
		`group "billing" has 2 records of lag and no members`, `outbox "exactly_outbox": COULD NOT BE READ`,
		"relay: COULD NOT BE READ", `guard "exactly_guard": COULD NOT BE READ`, "docs/operations.md#exactlydatabaseunreachable"} {
		if !strings.Contains(text, want) {
			t.Errorf("text report lacks %q:\n%s", want, text)
		}
	}

	out.Reset()
	err = runStatus(t.Context(), []string{"-json", "-interval", "0"}, &out)
	var r status.Report
	if jerr := json.Unmarshal(out.Bytes(), &r); jerr != nil {
		t.Fatalf("-json with the database down: %v (err %v)\n%q", jerr, err, out.String())
	}
	if !errors.Is(err, errNeedsHuman) || r.Unknown("lag") || r.StoppedLag != 2 || !r.Unknown("guard") || !r.Unknown("outbox") || !r.Unknown("relay") {
		t.Errorf("-json: err %v, unread %q, stopped lag %d; want the lag read (2) and the database's parts unread", err, r.Unread, r.StoppedLag)
	}

	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	var page lockedBuffer
	go func() { served <- runStatus(ctx, []string{"-http", "127.0.0.1:0", "-refresh", "1s"}, &page) }()
	addr := regexp.MustCompile(`status page on (http://[^/]+/)`)
	var base string
	for deadline := time.Now().Add(30 * time.Second); base == ""; {
		if m := addr.FindStringSubmatch(page.String()); m != nil {
			base = m[1]
			break
		}
		select {
		case err := <-served:
			t.Fatalf("-http with the database down did not start: %v\n%s", err, page.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("-http printed no address in 30s:\n%s", page.String())
		}
		time.Sleep(20 * time.Millisecond) // awaiting the line the command prints
	}
	resp, err := http.Get(base + "status.json")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var pr status.Report
	if err := json.Unmarshal(body, &pr); err != nil || resp.StatusCode != 200 || pr.StoppedLag != 2 || !pr.Unknown("guard") {
		t.Errorf("-http /status.json: %s %v: %s", resp.Status, err, body)
	}
	cancel()
	if err := <-served; err != nil {
		t.Errorf("-http after cancel: %v", err)
	}
}
