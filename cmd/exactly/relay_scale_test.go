package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

func TestRelayRejectsBadShardFlags(t *testing.T) {
	t.Setenv("EXACTLY_KAFKA_BROKERS", "localhost:1")
	var out bytes.Buffer
	for _, args := range [][]string{{"-shards", "0"}, {"-shards", "100000"}, {"-shards", "2", "-wal"}} {
		err := runRelay(t.Context(), args, &out)
		if err == nil || !strings.Contains(err.Error(), "-shards") {
			t.Errorf("relay %v: %v, want an error naming -shards", args, err)
		}
	}
	if err := runMigrate(t.Context(), []string{"-shards", "0"}, &out); err == nil || !strings.Contains(err.Error(), "-shards") {
		t.Errorf("migrate -shards 0: %v, want an error naming -shards", err)
	}
}

// TestRelayShardsFlag runs "exactly migrate -shards 3 -outbox-schema app"
// and "exactly relay -shards 3 -outbox-schema app" as a user would: the
// migration creates the tables outbox.NewSharded(3, WithTable("app", ""))
// writes, and rows in every shard's table are published.
func TestRelayShardsFlag(t *testing.T) {
	ctx := context.Background()
	url := testenv.DBURL(t)
	t.Setenv("DATABASE_URL", url)
	brokers := testenv.Brokers(testenv.Kafka(t, 3, "t"))
	t.Setenv("EXACTLY_KAFKA_BROKERS", strings.Join(brokers, ","))
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := outbox.NewSharded(3, outbox.WithTable("app", ""))
	if err != nil {
		t.Fatal(err)
	}
	var migrated bytes.Buffer
	if err := runMigrate(ctx, []string{"-shards", "3", "-outbox-schema", "app"}, &migrated); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if want := fmt.Sprintf(`outbox table "app"."exactly_outbox_%d": migrated`, i); !strings.Contains(migrated.String(), want) {
			t.Fatalf("exactly migrate -shards 3 said %q, want a line %q", migrated.String(), want)
		}
	}
	const n = 30
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i := range n {
			if err := s.Add(ctx, tx, outbox.Message{Topic: "t", Key: []byte{byte(i)}, Value: []byte{byte(i)}}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range s.Shards() {
		if c, _, err := o.Backlog(ctx, pool); err != nil || c == 0 {
			t.Fatalf("shard %d backlog %d, %v: want rows in every shard", i, c, err)
		}
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		var out bytes.Buffer
		done <- runRelay(rctx, []string{"-shards", "3", "-outbox-schema", "app", "-poll", "50ms"}, &out)
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	seen := map[byte]bool{}
	for len(seen) < n {
		fs := cl.PollFetches(pctx)
		if pctx.Err() != nil {
			t.Fatalf("read %d of %d records", len(seen), n)
		}
		fs.EachRecord(func(r *kgo.Record) { seen[r.Value[0]] = true })
	}
}
