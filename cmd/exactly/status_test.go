package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// statusFixture migrates a fresh database, commits one guard row and one
// outbox row for key k, puts a record on a dead-letter topic, and points
// DATABASE_URL and EXACTLY_KAFKA_BROKERS at them.
func statusFixture(t *testing.T, k string) {
	t.Helper()
	url := testenv.DBURL(t)
	t.Setenv("DATABASE_URL", url)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "orders", "orders.dlq"))
	t.Setenv("EXACTLY_KAFKA_BROKERS", strings.Join(brokers, ","))
	var out bytes.Buffer
	if err := runMigrate(t.Context(), nil, &out); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out.String())
	}
	p, err := poolFromDatabaseURL(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tx, err := p.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dedupe.New().Claim(t.Context(), tx, "orders", k); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Add(t.Context(), tx, outbox.Message{Topic: "order-events", Key: []byte(k), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	testenv.Produce(t, brokers, &kgo.Record{Topic: "orders.dlq", Value: []byte("poison")})
}

func TestStatusCommand(t *testing.T) {
	statusFixture(t, "order-1")
	var out bytes.Buffer
	if err := runStatus(t.Context(), []string{"-interval", "0"}, &out); err != nil {
		t.Fatalf("status: %v\n%s", err, out.String())
	}
	for _, want := range []string{"backlog 1,", `"orders.dlq": 1 records`, "exactly_guard\": 1 rows", "nothing needs a human"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := runStatus(t.Context(), []string{"-json", "-interval", "0"}, &out); err != nil {
		t.Fatal(err)
	}
	var r status.Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil || r.Outbox.Backlog != 1 || r.Guard.Rows != 1 {
		t.Errorf("JSON %v: %s", err, out.String())
	}
	if r.Outbox.Table != "exactly_outbox" || r.Guard.Table != "exactly_guard" {
		t.Errorf("JSON tables %q, %q, want them plain: %s", r.Outbox.Table, r.Guard.Table, out.String())
	}

	// A retention the oldest row exceeds: exit non-zero, saying why.
	out.Reset()
	err := runStatus(t.Context(), []string{"-interval", "0", "-retention", "1ns", "-retention-grace", "1ns"}, &out)
	if !errors.Is(err, errNeedsHuman) || !strings.Contains(out.String(), "NEEDS A HUMAN") || !strings.Contains(out.String(), "retention") {
		t.Errorf("status with retention exceeded: err %v\n%s", err, out.String())
	}
	if code := run([]string{"status", "-interval", "0", "-retention", "1ns", "-retention-grace", "1ns"}, &out, &out); code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}

	// A parked row (the column comes from the relay's outbox migration 0002;
	// added here if that is not on this branch yet) is listed and needs a human.
	p, err := poolFromDatabaseURL(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Exec(t.Context(), `alter table exactly_outbox add column if not exists parked_at timestamptz;
		update exactly_outbox set parked_at = now()`); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err = runStatus(t.Context(), []string{"-interval", "0"}, &out)
	if !errors.Is(err, errNeedsHuman) || !strings.Contains(out.String(), `PARKED id 1  topic "order-events"  key "order-1"`) ||
		!strings.Contains(out.String(), "1 parked rows") {
		t.Errorf("status with a parked row: err %v\n%s", err, out.String())
	}

	if err := runStatus(t.Context(), []string{"-http", "0.0.0.0:0"}, &out); err == nil || !strings.Contains(err.Error(), "-allow-remote") {
		t.Errorf("-http 0.0.0.0: %v; want a refusal naming -allow-remote", err)
	}
}

func TestInspectCommand(t *testing.T) {
	statusFixture(t, "order-1")
	var out bytes.Buffer
	if err := runInspect(t.Context(), []string{"order-1", "-scope", "orders"}, &out); err != nil {
		t.Fatalf("inspect: %v\n%s", err, out.String())
	}
	for _, want := range []string{`key "order-1" in scope "orders"`, `scope "orders": applied, committed at`, `rows with Kafka key "order-1"`, `topic "order-events"  pending`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := runInspect(t.Context(), []string{"order-2"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "no guard row") || !strings.Contains(out.String(), "none pending or parked") {
		t.Errorf("inspect of an unknown key:\n%s", out.String())
	}
	if err := runInspect(t.Context(), nil, &out); err == nil || !strings.Contains(err.Error(), "missing KEY") {
		t.Errorf("inspect without a key: %v", err)
	}
	t.Setenv("DATABASE_URL", "")
	if err := runInspect(t.Context(), []string{"k"}, &out); !errors.Is(err, errNoDatabaseURL) {
		t.Errorf("inspect without DATABASE_URL: %v", err)
	}
}

// A DATABASE_URL that does not parse fails the commands without quoting
// its secrets, whatever the driver's own message quotes.
func TestDatabaseURLErrorsHideSecrets(t *testing.T) {
	for _, url := range []string{
		"host=db password = 'hunter3 tail9' sslpassword=hunter4 port=notaport",
		"postgres://app:hunter3@db:notaport/app?sslpassword=hunter4",
	} {
		t.Setenv("DATABASE_URL", url)
		_, err := poolFromDatabaseURL(t.Context())
		if err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
			t.Errorf("DATABASE_URL=%q: %v, want an error naming DATABASE_URL", url, err)
		} else if strings.Contains(err.Error(), "hunter") || strings.Contains(err.Error(), "tail9") {
			t.Errorf("DATABASE_URL=%q: the error shows a secret: %v", url, err)
		}
	}
}

// The issue: `exactly inspect order-1` answered "no guard row: not applied"
// for an applied order whose guard key is credit:order-1, and showed only
// the last of the key's three dead letters (the guard keeps one mark).
func TestInspectMatchesGuardOrKafkaKeyAndListsEveryDeadLetter(t *testing.T) {
	url := testenv.DBURL(t)
	t.Setenv("DATABASE_URL", url)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "orders", "orders.dlq"))
	t.Setenv("EXACTLY_KAFKA_BROKERS", strings.Join(brokers, ","))
	var out bytes.Buffer
	if err := runMigrate(t.Context(), nil, &out); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out.String())
	}
	p, err := poolFromDatabaseURL(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tx, err := p.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dedupe.New().Claim(t.Context(), tx, "credit", dedupe.Key("credit", "order-1")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	testenv.Produce(t, brokers,
		deadLetter("order-1", "boom 1", "3", "2026-01-01T00:00:00Z"),
		deadLetter("order-2", "not mine", "4", "2026-01-01T00:01:00Z"),
		deadLetter("order-1", "boom 2", "5", "2026-01-01T00:02:00Z"),
		deadLetter("order-1", "boom 3", "6", "2026-01-01T00:03:00Z"))

	for _, tc := range []struct{ key, matched string }{
		{"order-1", `matched as a Kafka key: no guard key "order-1", the guard keys ending in ":order-1"`},
		{"credit:order-1", "matched as a guard key"},
	} {
		out.Reset()
		if err := runInspect(t.Context(), []string{tc.key}, &out); err != nil {
			t.Fatalf("inspect %s: %v\n%s", tc.key, err, out.String())
		}
		text := out.String()
		for _, want := range []string{tc.matched, `scope "credit": applied, committed at`,
			`dead letters with Kafka key ["order-1"] (or a guard row's coordinates): 3`,
			`"boom 1"`, `"boom 2"`, `"boom 3"`, `from "orders"/0@6`} {
			if !strings.Contains(text, want) {
				t.Errorf("inspect %s lacks %q:\n%s", tc.key, want, text)
			}
		}
		if strings.Contains(text, "not mine") {
			t.Errorf("inspect %s lists another key's dead letter:\n%s", tc.key, text)
		}
	}

	out.Reset()
	if err := runInspect(t.Context(), []string{"order-1", "-json"}, &out); err != nil {
		t.Fatal(err)
	}
	var rep status.KeyReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("inspect -json: %v\n%s", err, out.String())
	}
	if rep.Matched != status.MatchedKafkaKey || len(rep.Guard) != 1 || rep.Guard[0].Key != "credit:order-1" || len(rep.DeadLetters) != 3 {
		t.Errorf("inspect -json: matched %q, guard %+v, %d dead letters; want a Kafka-key match of credit:order-1 and 3 dead letters",
			rep.Matched, rep.Guard, len(rep.DeadLetters))
	}

	out.Reset()
	if err := runInspect(t.Context(), []string{"order-9"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "no guard row") || !strings.Contains(out.String(), `["order-9"] (or a guard row's coordinates): 0`) {
		t.Errorf("inspect of an unknown key:\n%s", out.String())
	}
	t.Setenv("EXACTLY_KAFKA_BROKERS", "")
	out.Reset()
	if err := runInspect(t.Context(), []string{"order-1"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "dead letters: not read") {
		t.Errorf("inspect without brokers:\n%s", out.String())
	}
}
