// Package shipping is a handler of Protobuf commands in the Confluent
// Schema Registry wire format: a ShipOrder command creates one shipment
// per order however often it is delivered, and emits an OrderShipped
// event, Protobuf as well, through the outbox, in the transaction that
// holds the guard row keyed "ship:<order id>".
package shipping

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/examples/shipping/shippb"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/schemaregistry"
	"github.com/exactly-go/exactly/handler/schemaregistry/protobuf"
	"github.com/exactly-go/exactly/outbox"
)

// Topics of the service.
const (
	// CommandsTopic carries ShipOrder commands.
	CommandsTopic = "ship-order"
	// EventsTopic carries OrderShipped events.
	EventsTopic = "order-shipped"
)

// Key is the deduplication key of a command: "ship:<order id>". A command
// without an order id has no key ("") and goes to the dead-letter topic.
func Key(c *shippb.ShipOrder) string {
	if c.GetOrderId() == "" {
		return ""
	}
	return dedupe.Key("ship", c.GetOrderId())
}

// Service ships orders: its codec reads commands and writes events through
// the schema registry.
type Service struct {
	codec  *protobuf.Codec
	events *protobuf.Codec // the codec bound to EventsTopic
	out    *outbox.Outbox
}

// New returns the service, reading and registering schemas through reg,
// adding its events to out.
func New(reg *schemaregistry.Registry, out *outbox.Outbox) *Service {
	c := protobuf.New(reg)
	return &Service{codec: c, events: c.ForTopic(EventsTopic), out: out}
}

// Codec returns the codec of the service's commands and events (a producer
// of commands encodes with it: Codec().Encode(ctx, CommandsTopic, cmd)).
func (s *Service) Codec() *protobuf.Codec { return s.codec }

// Migrate creates the shipments table when it does not exist.
func (s *Service) Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `create table if not exists shipments(
		id bigserial primary key, order_id text not null unique, address text not null, parcels int not null)`)
	if err != nil {
		return fmt.Errorf("creating the shipments table: %w", err)
	}
	return nil
}

// Handler returns the handler of ShipOrder commands. An undecodable
// command (an unknown schema id, another message type, a body that does
// not parse) is dead-lettered with the schema id and subject in its
// reason; while the registry is unreachable the partition waits, and no
// command is dead-lettered for it.
func (s *Service) Handler() *handler.Handler[*shippb.ShipOrder] {
	return handler.New("ship-order", handler.FromPayload(Key), s.ship, handler.WithCodec(s.codec))
}

// ship creates the shipment and adds its event.
func (s *Service) ship(ctx context.Context, tx pgx.Tx, msg handler.Message[*shippb.ShipOrder]) error {
	cmd := msg.Value
	var parcels int32
	for _, it := range cmd.GetItems() {
		parcels += it.GetQuantity()
	}
	var id int64
	if err := tx.QueryRow(ctx, `insert into shipments(order_id, address, parcels) values ($1, $2, $3) returning id`,
		cmd.GetOrderId(), cmd.GetAddress(), parcels).Scan(&id); err != nil {
		return fmt.Errorf("creating the shipment of order %s: %w", cmd.GetOrderId(), err)
	}
	ev := &shippb.OrderShipped{OrderId: cmd.GetOrderId(), ShipmentId: id, Parcels: parcels}
	return s.out.AddValue(ctx, tx, EventsTopic, []byte(cmd.GetOrderId()), ev, s.events)
}
