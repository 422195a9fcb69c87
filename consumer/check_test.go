package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// Ten transfers reach a pipelined handler that queues the debit, the
// credit with handler.RowsAffected(1), and an event; one credits account
// 99, which does not exist. The check refuses that credit before anything
// commits: the transfer alone is retried, then dead-lettered to
// transfers.dlq with a reason naming the check (want 1, got 0); its debit
// and event roll back; the nine others are applied with their events, the
// balances add up, and the offset reaches the end of the batch. (Without
// the check the bad transfer is applied and its money vanishes.)
func TestPipelinedCheckDeadLettersOnlyItsTransfer(t *testing.T) {
	ctx := context.Background()
	pool, ob, brokers := outboxSetup(t, 1, "transfers")
	if _, err := pool.Exec(ctx, `create table accounts (id bigint primary key, balance bigint not null);
		insert into accounts select g, 1000 from generate_series(0, 2) g`); err != nil {
		t.Fatal(err)
	}
	const bad = 6
	want := map[int64]int64{0: 1000, 1: 1000, 2: 1000}
	var recs []*kgo.Record
	for i := range 10 {
		tr := transfer{ID: fmt.Sprintf("t%d", i), From: int64(i % 3), To: int64((i + 1) % 3), Amount: int64(1 + i)}
		if i == bad {
			tr.To = 99
		} else {
			want[tr.From] -= tr.Amount
			want[tr.To] += tr.Amount
		}
		v, _ := json.Marshal(tr)
		recs = append(recs, &kgo.Record{Topic: "transfers", Key: []byte(tr.ID), Value: v})
	}
	testenv.Produce(t, brokers, recs...)

	const update = `update accounts set balance = balance + $2 where id = $1`
	h := handler.NewPipelined("transfer", handler.FromPayload(func(tr transfer) string { return dedupe.Key("transfer", tr.ID) }),
		func(ctx context.Context, q handler.Queue, msg handler.Message[transfer]) error {
			tr := msg.Value
			q.Queue(update, tr.From, -tr.Amount)
			q.QueueCheck(handler.RowsAffected(1), update, tr.To, tr.Amount)
			return ob.Add(ctx, q.Tx(), outbox.Message{Topic: "transferred", Key: []byte(tr.ID), Value: msg.Record.Value})
		})
	o := newOutcomes()
	cfg := testConfig(brokers, "checked", "transfers")
	cfg.MaxAttempts = 3
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()),
		consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)))
	o.await(t, 30*time.Second, "an outcome for every transfer", func() bool { return o.total() == 10 })
	if a, d := o.get("applied"), o.get("dead_lettered"); a != 9 || d != 1 {
		t.Errorf("applied=%d dead_lettered=%d, want 9 and 1", a, d)
	}
	o.awaitCommitted(t, 10*time.Second, "transfers", 0, 10) // past the batch
	for id, b := range want {
		if got := count(t, pool, `select balance from accounts where id = $1`, id); int64(got) != b {
			t.Errorf("account %d: balance %d, want %d (the refused transfer's debit must roll back)", id, got, b)
		}
	}
	if n := count(t, pool, `select count(*) from exactly_outbox where topic = 'transferred'`); n != 9 {
		t.Errorf("%d events, want 9 (none for the refused transfer)", n)
	}
	if n := count(t, pool, `select count(*) from exactly_outbox where topic = 'transferred' and key = 't6'::bytea`); n != 0 {
		t.Errorf("%d events of the refused transfer, want 0", n)
	}
	reasons := deadLetterReasons(t, pool, "transfers.dlq")
	if len(reasons) != 1 || !strings.Contains(reasons[0], "failed its check") || !strings.Contains(reasons[0], "affected 0 rows, want 1") {
		t.Fatalf("dead-letter reasons %q, want one naming the refused check (want 1, got 0)", reasons)
	}
	t.Logf("dead-letter reason: %s", reasons[0])
	o.checkCommitsTrail(t)
}
