package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/runtime/telemetry"
	"github.com/exactly-go/exactly/internal/testenv"
)

// owned returns the one partition a member owns (by its in-flight gauge),
// or "" when it owns none or several.
func owned(t *testing.T, r *sdkmetric.ManualReader) string {
	t.Helper()
	parts := gauges(t, r, telemetry.MetricPartitionInFlight)
	if len(parts) != 1 {
		return ""
	}
	for p := range parts {
		return p
	}
	return ""
}

// With EXACTLY_INSTANCE_ID (static membership, KIP-345) a member that
// stops and comes back with the same id gets its partition back at once,
// without waiting for the session timeout (set to 4 minutes here, far
// past the test's deadline) and without a rebalance: the other member is
// never assigned another partition nor asked to revoke its own. A dynamic
// member fails this: it leaves the group when it stops, and the other
// member takes its partition until it comes back.
// (kfake implements static membership for the classic group protocol.)
func TestStaticMemberGetsItsPartitionsBack(t *testing.T) {
	pool := testenv.DB(t)
	setupLedger(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 2, "credits"))
	cfg := testConfig(brokers, "static", "credits")
	cfg.SessionTimeout = 4 * time.Minute
	cfg.RebalanceTimeout = 10 * time.Second
	cfg.GroupLagInterval = 100 * time.Millisecond
	aCfg, bCfg := cfg, cfg
	aCfg.InstanceID, bCfg.InstanceID = "member-a", "member-b"

	// The partitions the other member was asked to revoke (it gives one
	// up when the first member joins: that one is not its own).
	var bRevoked sync.Map
	aReader, bReader := sdkmetric.NewManualReader(), sdkmetric.NewManualReader()
	bLogs := &syncBuffer{}
	stopA := startConsumer(t, aCfg, pool, consumer.Handle(creditHandler(0)),
		consumer.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(aReader))))
	startConsumer(t, bCfg, pool, consumer.Handle(creditHandler(0)),
		consumer.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(bReader))),
		consumer.WithLogger(slog.New(slog.NewTextHandler(bLogs, nil))),
		consumer.WithHooks(consumer.Hooks{OnRevoke: func(_ context.Context, d consumer.RevokeData) {
			for _, p := range d.Revoked["credits"] {
				bRevoked.Store(fmt.Sprint(p), true)
			}
		}}))
	var aPart, bPart string
	awaitCond(t, "each member owning one partition", func() bool {
		aPart, bPart = owned(t, aReader), owned(t, bReader)
		return aPart != "" && bPart != "" && aPart != bPart &&
			strings.Contains(bLogs.String(), "partitions assigned")
	})
	bLogged := len(bLogs.String())

	stopA()
	// A read of the group from the broker after the stop (the lag of a
	// record produced since): the stopped static member keeps its place
	// in the group and its partition (a dynamic member left it).
	v, _ := json.Marshal(credit{OrderID: "after-stop", Account: 1, Amount: 1})
	produceManual(t, brokers, &kgo.Record{Topic: "credits", Partition: int32(mustAtoi(t, aPart)), Value: v})
	awaitCond(t, "the other member reading the stopped member's partition's lag", func() bool {
		return gauges(t, bReader, telemetry.MetricConsumerGroupLag)[aPart] >= 1
	})
	if n := gauges(t, bReader, telemetry.MetricConsumerGroupMembers)[""]; n != 2 {
		t.Errorf("the group has %d members after the static member stopped, want 2 (it keeps its place until the session timeout)", n)
	}
	restarted := time.Now()
	a2Reader := sdkmetric.NewManualReader()
	startConsumer(t, aCfg, pool, consumer.Handle(creditHandler(0)),
		consumer.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(a2Reader))))
	awaitCond(t, "the restarted member owning its partition again and applying the record", func() bool {
		return owned(t, a2Reader) == aPart && gauges(t, bReader, telemetry.MetricConsumerGroupLag)[aPart] == 0
	})
	t.Logf("the restarted static member owned partition %s again %v after its restart (session timeout %v)",
		aPart, time.Since(restarted).Round(time.Millisecond), cfg.SessionTimeout)
	if got := owned(t, bReader); got != bPart {
		t.Errorf("the other member owns %q after the restart, want %q (unchanged)", got, bPart)
	}
	if later := bLogs.String()[bLogged:]; strings.Contains(later, "partitions assigned") {
		t.Errorf("the other member was assigned partitions during the restart (a rebalance):\n%s", later)
	}
	if _, ok := bRevoked.Load(bPart); ok {
		t.Errorf("the other member was asked to revoke its partition %s, want it kept (no rebalance)", bPart)
	}
}
