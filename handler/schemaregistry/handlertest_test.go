package schemaregistry_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/handlertest"
	"github.com/exactly-go/exactly/handler/schemaregistry"
	shopv1 "github.com/exactly-go/exactly/handler/schemaregistry/internal/shoppb/v1"
	"github.com/exactly-go/exactly/handler/schemaregistry/protobuf"
	"github.com/exactly-go/exactly/handler/schemaregistry/srtest"
	"github.com/exactly-go/exactly/internal/testenv"
)

// handlertest.Deliver encodes a handler's values with its codec: a
// registry codec bound to the handler's topic (ForTopic) encodes them in
// the wire format, and each value applies once however often it is
// delivered.
func TestHandlertestDeliversThroughARegistryCodec(t *testing.T) {
	ctx := context.Background()
	reg := srtest.New()
	defer reg.Close()
	r, err := schemaregistry.Dial(reg.URL())
	if err != nil {
		t.Fatal(err)
	}
	pool := testenv.DB(t)
	if _, err := pool.Exec(ctx, `create table applied(id text primary key)`); err != nil {
		t.Fatal(err)
	}
	h := handler.New("audit", handler.FromPayload(func(m *shopv1.OrderPaid) string { return dedupe.Key("paid", m.GetOrderId()) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[*shopv1.OrderPaid]) error {
			return insertApplied(ctx, tx, msg.Value.GetOrderId())
		}, handler.WithCodec(protobuf.New(r).ForTopic("orders.paid")))
	rep := handlertest.Deliver(ctx, t, pool, h, handlertest.Delivery{Copies: 3, Topic: "orders.paid"},
		&shopv1.OrderPaid{OrderId: "o-1", AmountCents: 1}, &shopv1.OrderPaid{OrderId: "o-2", AmountCents: 2})
	if rep.Applied != 2 || rep.Duplicates != 4 || len(rep.Errors) != 0 || rep.DeadLettered != 0 {
		t.Errorf("report %+v; want 2 applied, 4 duplicates", rep)
	}
	if !reg.SubjectExists("orders.paid-value") {
		t.Error("the values were not encoded under orders.paid-value")
	}
}
