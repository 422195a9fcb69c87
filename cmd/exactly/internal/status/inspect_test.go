package status_test

import (
	"context"
	"testing"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/outbox"
)

// TestInspectFindsGuardRowAndOutboxRows inspects a key the consumer
// applied: its guard row in the handler's scope, and the outbox row its
// handler emitted under the order id as Kafka key.
func TestInspectFindsGuardRowAndOutboxRows(t *testing.T) {
	s := newScenario(t)
	key := dedupe.Key("order", "order-7")
	rep, err := status.Inspect(t.Context(), s.cfg, key, status.InspectOptions{Scope: scenarioHandler, OutboxKey: []byte("order-7")})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Guard) != 1 || rep.Guard[0].Scope != scenarioHandler || rep.Guard[0].ProcessedAt.IsZero() || rep.Guard[0].DeadLettered() {
		t.Errorf("guard rows %+v; want one applied row in scope %s", rep.Guard, scenarioHandler)
	}
	if rep.OutboxKey != "order-7" || len(rep.Outbox) != 1 || rep.Outbox[0].Topic != scenarioOutboxTop || rep.Outbox[0].Parked {
		t.Errorf("outbox %q %+v; want one pending %s row", rep.OutboxKey, rep.Outbox, scenarioOutboxTop)
	}

	other, err := status.Inspect(t.Context(), s.cfg, key, status.InspectOptions{Scope: "another-service"})
	if err != nil {
		t.Fatal(err)
	}
	if len(other.Guard) != 0 || len(other.Outbox) != 0 || other.OutboxKey != key {
		t.Errorf("another scope, key as outbox key: guard %+v outbox %+v (matched %q); want nothing", other.Guard, other.Outbox, other.OutboxKey)
	}
	if _, err := status.Inspect(t.Context(), s.cfg, "", status.InspectOptions{}); err == nil {
		t.Error("empty key accepted")
	}
	if _, err := status.Inspect(t.Context(), s.cfg, key, status.InspectOptions{JaegerURL: "javascript:alert(1)"}); err == nil {
		t.Error("a javascript: Jaeger URL accepted")
	}
}

// TestInspectShowsClaimTimeColumns reads the columns guard migration 0004
// adds (state, topic, kafka_partition, kafka_offset, trace_id, handler) and
// the outbox's parked mark. Until those migrations are on this branch the
// test adds the columns (if not exists) itself and fills them as the claim
// would.
func TestInspectShowsClaimTimeColumns(t *testing.T) {
	s := newScenario(t)
	key := dedupe.Key("order", "order-8")
	before, err := status.Inspect(t.Context(), s.cfg, key, status.InspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guard columns missing before: %q", before.MissingColumns)
	for _, ddl := range []string{
		`alter table exactly_guard add column if not exists state text not null default 'applied',
			add column if not exists topic text, add column if not exists kafka_partition integer,
			add column if not exists kafka_offset bigint, add column if not exists trace_id text,
			add column if not exists handler text`,
		`alter table exactly_outbox add column if not exists parked_at timestamptz`,
	} {
		if _, err := s.pool.Exec(t.Context(), ddl); err != nil {
			t.Fatal(err)
		}
	}
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	if _, err := s.pool.Exec(t.Context(), `update exactly_guard set state = 'dead_lettered', topic = 'orders', kafka_partition = 2,
		kafka_offset = 17, trace_id = $2, handler = 'orders' where key = $1`, key, trace); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(t.Context(), `update exactly_outbox set parked_at = now() where key = 'order-8'`); err != nil {
		t.Fatal(err)
	}
	addOutboxRow(t, s.pool, outbox.Message{Topic: scenarioOutboxTop, Key: []byte("order-8"), Value: []byte("later")})

	rep, err := status.Inspect(t.Context(), s.cfg, key, status.InspectOptions{OutboxKey: []byte("order-8"), JaegerURL: "http://localhost:16686/"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.MissingColumns) != 0 {
		t.Errorf("missing columns %q after adding them", rep.MissingColumns)
	}
	if len(rep.Guard) != 1 {
		t.Fatalf("guard rows %+v", rep.Guard)
	}
	g := rep.Guard[0]
	if !g.DeadLettered() || g.Topic != "orders" || g.Partition == nil || *g.Partition != 2 || g.Offset == nil || *g.Offset != 17 ||
		g.Handler != "orders" || g.TraceID != trace || g.TraceURL != "http://localhost:16686/trace/"+trace {
		t.Errorf("guard row %+v", g)
	}
	if !rep.OutboxParkedKnown || len(rep.Outbox) != 2 || !rep.Outbox[0].Parked || rep.Outbox[1].Parked {
		t.Errorf("outbox rows %+v; want the parked one first, then the pending one", rep.Outbox)
	}
}

// TestInspectShowsRecordedEffect lists the result an external call
// recorded for the key in the guard's effects table.
func TestInspectShowsRecordedEffect(t *testing.T) {
	s := newScenario(t)
	key := dedupe.Key("order", "order-7")
	tx, err := s.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dedupe.NewEffects(nil).Call(t.Context(), tx, scenarioHandler, key, func(context.Context, string) ([]byte, error) {
		return []byte(`{"id":"ch_7"}`), nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	rep, err := status.Inspect(t.Context(), s.cfg, key, status.InspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.EffectsKnown || len(rep.Effects) != 1 || rep.Effects[0].State != "done" || rep.Effects[0].Result != `{"id":"ch_7"}` ||
		rep.Effects[0].Scope != scenarioHandler {
		t.Errorf("effects %+v (known %v); want the recorded {\"id\":\"ch_7\"} in scope %s", rep.Effects, rep.EffectsKnown, scenarioHandler)
	}
	other, err := status.Inspect(t.Context(), s.cfg, key, status.InspectOptions{Scope: "another-service"})
	if err != nil {
		t.Fatal(err)
	}
	if len(other.Effects) != 0 {
		t.Errorf("effects of another scope: %+v", other.Effects)
	}
}
