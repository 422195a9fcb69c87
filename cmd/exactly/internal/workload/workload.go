// Package workload holds what the demo and the benchmark share: the credit
// commands they send, producing them to a topic, and waiting for a
// consumer group or a condition.
package workload

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/credit"
)

// Commands returns n credit commands: command i has order id
// "order-<8000+i>", account i mod accounts and amount 100+i. The same n
// and accounts always give the same commands.
func Commands(n, accounts int) []credit.Command {
	cmds := make([]credit.Command, n)
	for i := range cmds {
		cmds[i] = credit.Command{OrderID: fmt.Sprintf("order-%d", 8000+i), Account: int64(i % accounts), Amount: int64(100 + i)}
	}
	return cmds
}

// Produce sends cmds to topic, each copies times, keyed by order id: copy c
// of command i goes to partition (i + 2c) mod partitions, so the copies sit
// on different partitions and are worked on by different workers at the
// same time. It returns when every record is acknowledged.
//
// opts are extra client options (a tracing hook, SASL, TLS).
func Produce(ctx context.Context, brokers []string, topic string, partitions int, cmds []credit.Command, copies int, opts ...kgo.Opt) error {
	opts = append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner())}, opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("creating producer: %w", err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, 0, len(cmds)*copies)
	for i := range cmds {
		v, err := json.Marshal(cmds[i])
		if err != nil {
			return fmt.Errorf("encoding command: %w", err)
		}
		for c := 0; c < copies; c++ {
			recs = append(recs, &kgo.Record{Topic: topic, Partition: int32((i + 2*c) % partitions), Key: []byte(cmds[i].OrderID), Value: v})
		}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("producing %d commands: %w", len(recs), err)
	}
	return nil
}

// Poll calls done every 50ms until it reports true or ctx ends.
func Poll(ctx context.Context, done func() (bool, error)) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		ok, err := done()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
			}
			return ctx.Err()
		case <-t.C:
		}
	}
}

// AwaitLagZero waits until group has committed the end of every one of the
// topic's partitions.
func AwaitLagZero(ctx context.Context, adm *kadm.Client, group, topic string, partitions int) error {
	err := Poll(ctx, func() (bool, error) {
		lags, err := adm.Lag(ctx, group)
		if err != nil {
			return false, err
		}
		gl, ok := lags[group]
		if !ok || gl.Error() != nil {
			return false, gl.Error()
		}
		parts, ok := gl.Lag[topic]
		if !ok || len(parts) != partitions {
			return false, nil
		}
		for _, l := range parts {
			if l.Err != nil || l.Commit.At < 0 || l.Lag != 0 {
				return false, l.Err
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for group %s to consume %s: %w", group, topic, err)
	}
	return nil
}

// Client returns a franz-go client seeded with brokers, for admin requests.
func Client(brokers []string) *kgo.Client {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		panic(fmt.Sprintf("workload: creating admin client: %v", err)) // only invalid options fail here
	}
	return cl
}

// AwaitMembers waits until group is stable with members members that share
// every one of the topic's partitions, each owning some, so that records
// produced next are worked on by all of them at once and no join rebalances
// them mid-flight.
func AwaitMembers(ctx context.Context, adm *kadm.Client, group, topic string, members, partitions int) error {
	err := Poll(ctx, func() (bool, error) {
		described, err := adm.DescribeGroups(ctx, group)
		if err != nil {
			return false, err
		}
		g, ok := described[group]
		if !ok || g.Err != nil || g.State != "Stable" || len(g.Members) != members {
			return false, nil
		}
		assigned := 0
		for _, m := range g.Members {
			ca, ok := m.Assigned.AsConsumer()
			if !ok {
				return false, nil
			}
			n := 0
			for _, t := range ca.Topics {
				if t.Topic == topic {
					n += len(t.Partitions)
				}
			}
			if n == 0 {
				return false, nil
			}
			assigned += n
		}
		return assigned == partitions, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %d members of group %s to share %s: %w", members, group, topic, err)
	}
	return nil
}
