package bench

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/bench/creditpb"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/handler/schemaregistry"
	"github.com/exactly-go/exactly/handler/schemaregistry/protobuf"
	"github.com/exactly-go/exactly/handler/schemaregistry/srtest"
)

// The Protobuf row: the "exactly, defaults" scenario with its commands and
// events in Protobuf, framed in the Confluent Schema Registry wire format
// (handler/schemaregistry/protobuf), so that a record's cost with a
// registry codec stands beside its cost with JSON.
const (
	kindProtobuf = "protobuf"
	idProtobuf   = "protobuf"
)

// protobufScenario is the Protobuf row: the credit commands of the JSON
// row, produced by the child itself to topic (a topic of its own) before it
// consumes them.
func protobufScenario(with func(func(*Spec)) Spec, topic, run string) scenario {
	return scenario{idProtobuf, "exactly, defaults, Protobuf (registry)", with(func(s *Spec) {
		s.Kind, s.Schema, s.Group, s.Topic = kindProtobuf, "bench_protobuf", "bench-protobuf-"+run, topic
	}), true}
}

// runProtobuf starts an in-memory schema registry (srtest), produces
// spec.Records credit commands to spec.Topic encoded by the Protobuf codec,
// and runs exactly on them with the credit effect (a ledger row and an
// account-credited event, Protobuf too, through the outbox). The clock
// starts at the first fetched record, after the production.
func runProtobuf(ctx context.Context, spec Spec, pool *pgxpool.Pool, f tables, log *slog.Logger) (Result, error) {
	reg := srtest.New()
	defer reg.Close()
	r, err := schemaregistry.Dial(reg.URL())
	if err != nil {
		return Result{}, err
	}
	codec := protobuf.New(r)
	if err := produceProtobuf(ctx, spec, codec); err != nil {
		return Result{}, err
	}
	events := codec.ForTopic(f.events)
	insert := `insert into ` + f.svc.Ledger().Sanitize() + ` (order_id, account, amount) values ($1, $2, $3)`
	h := handler.New("credit",
		handler.FromPayload(func(c *creditpb.Credit) string { return dedupe.Key("credit", c.GetOrderId()) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[*creditpb.Credit]) error {
			c := msg.Value
			if _, err := tx.Exec(ctx, insert, c.GetOrderId(), c.GetAccount(), c.GetAmount()); err != nil {
				return fmt.Errorf("inserting ledger row for order %s: %w", c.GetOrderId(), err)
			}
			ev := &creditpb.Credited{OrderId: c.GetOrderId(), Account: c.GetAccount(), Amount: c.GetAmount()}
			if err := f.ob.AddValue(ctx, tx, f.events, strconv.AppendInt(nil, c.GetAccount(), 10), ev, events); err != nil {
				return fmt.Errorf("emitting account-credited for order %s: %w", c.GetOrderId(), err)
			}
			return nil
		}, handler.WithCodec(codec))
	return runExactly(ctx, spec, pool, f, h, log)
}

// produceProtobuf produces the JSON row's commands (workload.Commands) to
// spec.Topic as creditpb.Credit, partitioned as workload.Produce does.
func produceProtobuf(ctx context.Context, spec Spec, codec *protobuf.Codec) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(spec.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return fmt.Errorf("creating producer: %w", err)
	}
	defer cl.Close()
	cmds := workload.Commands(spec.Records, spec.Accounts)
	for len(cmds) > 0 {
		n := min(len(cmds), defaultSmall)
		recs := make([]*kgo.Record, n)
		for i, c := range cmds[:n] {
			v, err := codec.Encode(ctx, spec.Topic, &creditpb.Credit{OrderId: c.OrderID, Account: c.Account, Amount: c.Amount})
			if err != nil {
				return err
			}
			recs[i] = &kgo.Record{Topic: spec.Topic, Partition: int32((spec.Records - len(cmds) + i) % spec.Partitions), Key: []byte(c.OrderID), Value: v}
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return fmt.Errorf("producing %d protobuf commands: %w", n, err)
		}
		cmds = cmds[n:]
	}
	return nil
}
