package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
)

// TestStatusAndInspectShowHeldRecords: with a held row (as a consumer
// writes it: a record whose handler keeps failing) and a paused row,
// `exactly status` lists the held record (group, partition, offset, key,
// attempts, held for, retry in, last error) and the paused partition, in
// text and JSON, and exits needing a human for the paused partition;
// `exactly inspect` of the key says it is held, with its attempts, last
// error and retry time.
func TestStatusAndInspectShowHeldRecords(t *testing.T) {
	statusFixture(t, "order-1")
	p, err := poolFromDatabaseURL(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Exec(t.Context(), `insert into exactly_guard_held (consumer_group, topic, partition, record_offset, scope, key, handler, attempts, last_error, held_since, retry_at)
values ('billing', 'orders', 2, 41, 'orders', 'order:order-7', 'orders', 4, 'card declined', now() - interval '30 seconds', now() + interval '90 seconds')`); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := runStatus(t.Context(), []string{"-interval", "0"}, &out); err != nil {
		t.Fatalf("status with a record held for 30s (no problem): %v\n%s", err, out.String())
	}
	for _, want := range []string{"held records (a handler failed; retried with backoff): 1",
		`"billing" "orders"/2@41  key "order:order-7"  attempts 4  held for 3`, `s  retry in 1m`, `error "card declined"`,
		"paused partitions (behind held records): 0", "nothing needs a human"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status output lacks %q:\n%s", want, out.String())
		}
	}

	if _, err := p.Exec(t.Context(), `insert into exactly_guard_paused (consumer_group, topic, partition, reason, lowest_unfinished, handler)
values ('billing', 'orders', 2, 'offset_gap', 41, 'orders')`); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err = runStatus(t.Context(), []string{"-interval", "0"}, &out)
	if !errors.Is(err, errNeedsHuman) || !strings.Contains(out.String(), `PAUSED "billing" "orders"/2  reason offset_gap  lowest unfinished 41`) ||
		!strings.Contains(out.String(), `partition "orders"/2 of "billing" paused`) {
		t.Errorf("status with a paused partition: err %v\n%s", err, out.String())
	}
	out.Reset()
	if err := runStatus(t.Context(), []string{"-json", "-interval", "0"}, &out); !errors.Is(err, errNeedsHuman) {
		t.Fatalf("status -json: %v", err)
	}
	var r status.Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil || len(r.Held.Records) != 1 || r.Held.Records[0].Attempts != 4 ||
		r.Held.Records[0].LastError != "card declined" || len(r.Held.Paused) != 1 || r.Held.Paused[0].LowestUnfinished != 41 {
		t.Errorf("JSON held %+v (%v):\n%s", r.Held, err, out.String())
	}

	for _, key := range []string{"order:order-7", "order-7"} {
		out.Reset()
		if err := runInspect(t.Context(), []string{key}, &out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), `HELD: record "orders" partition 2 offset 41 (group "billing", handler "orders", key "order:order-7") failed 4 attempts; held for 3`) ||
			!strings.Contains(out.String(), `s, next attempt in 1m`) ||
			!strings.Contains(out.String(), `last error: "card declined"`) {
			t.Errorf("inspect %s:\n%s", key, out.String())
		}
	}
	out.Reset()
	if err := runInspect(t.Context(), []string{"order-1"}, &out); err != nil || !strings.Contains(out.String(), "held: no record of the key is held") {
		t.Errorf("inspect order-1 (not held): %v\n%s", err, out.String())
	}
}
