package main

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestDevBrokerServesClients(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := runDev(ctx, []string{"-port", "0", "-partitions", "2", "-topics", "a, b", "-data", t.TempDir()}, pw)
		pw.Close()
		done <- err
	}()

	sc := bufio.NewScanner(pr)
	if !sc.Scan() {
		t.Fatalf("dev printed nothing (scan err %v, run err %v)", sc.Err(), <-done)
	}
	line := sc.Text()
	addr, ok := strings.CutPrefix(line, "dev broker listening on ")
	if !ok {
		t.Fatalf("first line %q lacks the listening address", line)
	}
	go io.Copy(io.Discard, pr) // keep the command's later output flowing

	opctx, opcancel := context.WithTimeout(ctx, 30*time.Second)
	defer opcancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("a"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(opctx, &kgo.Record{Topic: "a", Value: []byte("ping")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	fs := cl.PollFetches(opctx)
	if err := fs.Err0(); err != nil {
		t.Fatal(err)
	}
	if recs := fs.Records(); len(recs) != 1 || string(recs[0].Value) != "ping" {
		t.Fatalf("consumed %v, want the produced record", recs)
	}
	cl.Close()

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dev returned %v after cancel", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("dev did not return after its context was cancelled")
	}
}

func TestDevRejectsBadFlags(t *testing.T) {
	if err := runDev(t.Context(), []string{"-partitions", "0"}, io.Discard); err == nil {
		t.Error("-partitions 0 accepted")
	}
	if err := runDev(t.Context(), []string{"extra"}, io.Discard); err == nil {
		t.Error("positional argument accepted")
	}
}
