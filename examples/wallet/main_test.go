package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/exactly-go/exactly/examples/wallet/wallet"
	"github.com/exactly-go/exactly/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// With EXACTLY_METRICS_ADDR set, the wallet service serves its metrics
// there (the consumer's exactly_* instruments) instead of refusing to start
// for want of a metrics handler, and stops cleanly when cancelled.
func TestServesMetricsWhenMetricsAddrIsSet(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	t.Setenv("DATABASE_URL", testenv.DBURL(t))
	t.Setenv("EXACTLY_KAFKA_BROKERS", strings.Join(testenv.Brokers(testenv.Kafka(t, 1, wallet.CommandsTopic)), ","))
	t.Setenv("EXACTLY_METRICS_ADDR", addr)
	t.Setenv("EXACTLY_GROUP", "wallet-metrics-test")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()

	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-done:
			t.Fatalf("the service stopped before serving metrics: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no exactly_ metrics served on %s within 30s", addr)
		}
		if body, ok := scrape(t, "http://"+addr+"/metrics"); ok && strings.Contains(body, "exactly_") {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the service stopped before serving metrics: %v", err)
		case <-time.After(100 * time.Millisecond): // polling an HTTP endpoint: nothing to await
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("the service failed when cancelled: %v", err)
	}
}

// scrape GETs url and returns its body, and whether it answered 200.
func scrape(t *testing.T, url string) (string, bool) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return "", false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err == nil && resp.StatusCode == http.StatusOK
}
