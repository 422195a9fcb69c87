package main

import (
	"context"
	"testing"
	"time"

	"github.com/exactly-go/exactly/examples/charge/charge"
	"github.com/exactly-go/exactly/internal/testenv"
)

// -produce-demo against a fresh development broker (`exactly dev` without
// -topics, as docs/external-effects.md runs it): the commands topic does
// not exist yet, and the demo orders' commands, each twice, still arrive.
// (The producer used to wait for the topic for ever, and the example never
// started consuming.)
func TestProduceDemoCreatesItsTopic(t *testing.T) {
	brokers := testenv.Brokers(testenv.Kafka(t, 6))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := produceDemo(ctx, brokers, nil); err != nil {
		t.Fatalf("produceDemo on a broker without %s: %v", charge.CommandsTopic, err)
	}
	testenv.ReadTopic(t, brokers, charge.CommandsTopic, 2*demoOrders)
}
