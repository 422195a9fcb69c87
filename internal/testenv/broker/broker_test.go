package broker

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestProduceConsumeAndPersist(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dir := t.TempDir()

	b, err := Start(ctx, Options{DataDir: dir, Partitions: 3, Topics: []string{"events"}})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "events", Key: []byte("k"), Value: []byte("v1")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	b.Close()
	b.Close() // idempotent

	b, err = Start(ctx, Options{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cl, err = kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.ConsumeTopics("events"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	fs := cl.PollFetches(ctx)
	if err := fs.Err0(); err != nil {
		t.Fatal(err)
	}
	recs := fs.Records()
	if len(recs) != 1 || string(recs[0].Value) != "v1" {
		t.Fatalf("after restart got %d records (%v), want the one produced before", len(recs), recs)
	}
}

func TestStartCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Start(ctx, Options{}); err == nil {
		t.Fatal("Start with a cancelled context succeeded")
	}
}
