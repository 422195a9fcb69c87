package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// TestOutboxCommandListsRetriesAndDropsParkedRows runs "exactly relay" and
// "exactly outbox" as a user would: the relay parks a row over
// -max-record-bytes and a row of an illegal topic (each holding the later
// row of its key), "outbox parked" lists them with their reasons, "outbox
// retry" publishes the fixed one, "outbox drop" refuses to run without a
// selection and then says what it dropped, releasing the row held behind it.
func TestOutboxCommandListsRetriesAndDropsParkedRows(t *testing.T) {
	ctx := context.Background()
	url := testenv.DBURL(t)
	t.Setenv("DATABASE_URL", url)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "t"))
	t.Setenv("EXACTLY_KAFKA_BROKERS", strings.Join(brokers, ","))
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ob := outbox.New()
	if err := ob.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 250)
	for _, r := range []struct {
		topic, key string
		value      []byte
	}{
		{long, "k", []byte("never")},
		{long, "k", []byte("held")},
		{"t", "big", make([]byte, 2000)},
		{"t", "ok", []byte("fine")},
	} {
		if _, err := pool.Exec(ctx, "insert into exactly_outbox (topic, key, value) values ($1, $2, $3)", r.topic, []byte(r.key), r.value); err != nil {
			t.Fatal(err)
		}
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		var out bytes.Buffer
		done <- runRelay(rctx, []string{"-poll", "50ms", "-max-record-bytes", "1000"}, &out)
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	waitParked := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			got, err := ob.ParkedCount(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			if got == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d parked rows, want %d", got, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitParked(2)
	testenv.ReadTopic(t, brokers, "t", 1) // "ok" flowed past the parked "big"

	var out bytes.Buffer
	if err := runOutbox(ctx, []string{"parked"}, &out); err != nil {
		t.Fatal(err)
	}
	listing := out.String()
	for _, want := range []string{"over Kafka's 249", "over the 1000-byte limit", `"big"`, `"k"`, "HELD"} {
		if !strings.Contains(listing, want) {
			t.Errorf("parked listing lacks %q:\n%s", want, listing)
		}
	}

	if _, err := pool.Exec(ctx, "update exactly_outbox set value = 'fixed' where key = 'big'"); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := runOutbox(ctx, []string{"retry", "-topic", "t", "-key", "big"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "released 1 parked rows; topics: t; keys: \"big\"") {
		t.Fatalf("retry said %q", out.String())
	}
	recs := testenv.ReadTopic(t, brokers, "t", 2)
	if string(recs[1].Value) != "fixed" {
		t.Fatalf("after retry t holds %q", recs[1].Value)
	}

	if err := runOutbox(ctx, []string{"drop"}, &out); err == nil || !strings.Contains(err.Error(), "-all") {
		t.Fatalf("drop without a selection: %v", err)
	}
	if err := runOutbox(ctx, []string{"drop", "-all"}, &out); err == nil || !strings.Contains(err.Error(), "-yes") {
		t.Fatalf("drop -all without -yes: %v; want a refusal naming -yes", err)
	}
	out.Reset()
	if err := runOutbox(ctx, []string{"drop", "-all", "-dry-run"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "would drop 1 parked rows; topics: "+long+"; keys: \"k\"; ids: 1;") || !strings.Contains(out.String(), "  id 1  topic ") {
		t.Fatalf("drop -dry-run said %q", out.String())
	}
	if n, err := ob.ParkedCount(ctx, pool); err != nil || n != 1 {
		t.Fatalf("after drop -dry-run %d parked rows (%v), want 1: a dry run dropped", n, err)
	}
	out.Reset()
	if err := runOutbox(ctx, []string{"drop", "-all", "-yes"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "dropped 1 parked rows; topics: "+long+"; keys: \"k\"; ids: 1; message ids: ") {
		t.Fatalf("drop said %q", out.String())
	}
	// The row held behind the dropped one is tried next, and parks in turn.
	waitParked(1)
	rows, err := ob.Parked(ctx, pool, outbox.ParkFilter{})
	if err != nil || len(rows) != 1 || rows[0].ID != 2 {
		t.Fatalf("parked after drop: %+v, %v; want row 2", rows, err)
	}
}
