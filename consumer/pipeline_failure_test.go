package consumer_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/outbox"
)

// A trigger the user put on the outbox table rejects the rows of one
// record of a batch of ten (a check violation, not an outage). The rows
// are flushed for the whole batch in one statement just before COMMIT, so
// the executor cannot tell whose row failed: it replays shorter prefixes
// until one record's own rows fail. That record alone is retried, then
// dead-lettered (its dead letter without the rejected row), with the
// failing statement named in the log and the dead letter's reason; the
// other nine are applied with their events, and the offset reaches the end
// of the batch. (The old code took the failure for an outage and retried
// the whole batch for ever: the partition stalled.)
func TestOutboxTriggerRejectsOneRecordOnly(t *testing.T) {
	ctx := context.Background()
	pool, ob, brokers := outboxSetup(t, 1, "cmds")
	if _, err := pool.Exec(ctx, `create function reject_poison() returns trigger language plpgsql as $$
		begin
			if position('poison'::bytea in new.value) > 0 then
				raise exception 'outbox row rejected: poison payload' using errcode = 'check_violation';
			end if;
			return new;
		end $$;
		create trigger reject_poison before insert on exactly_outbox for each row execute function reject_poison()`); err != nil {
		t.Fatal(err)
	}
	produceCopies(t, brokers, "cmds", 10, 1, 1)
	h := handler.New("credit",
		creditKey(),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			if err := insertCredit(ctx, tx, msg.Value); err != nil {
				return err
			}
			event := "credited " + msg.Value.OrderID
			if msg.Value.OrderID == "order-6" {
				event = "poison for " + msg.Value.OrderID
			}
			return ob.Add(ctx, tx, outbox.Message{Topic: "credited", Key: []byte(msg.Value.OrderID), Value: []byte(event)})
		})
	var logs syncBuffer
	o := newOutcomes()
	cfg := testConfig(brokers, "poisonrow", "cmds")
	cfg.MaxAttempts = 3
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()),
		consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)),
		consumer.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	o.await(t, 30*time.Second, "an outcome for every record", func() bool { return o.total() == 10 })
	if a, d := o.get("applied"), o.get("dead_lettered"); a != 9 || d != 1 {
		t.Errorf("applied=%d dead_lettered=%d, want 9 and 1", a, d)
	}
	o.awaitCommitted(t, 10*time.Second, "cmds", 0, 10) // past the batch
	if n := count(t, pool, `select count(*) from ledger where order_id <> 'order-6'`); n != 9 {
		t.Errorf("%d ledger rows of the nine good records, want 9", n)
	}
	if n := count(t, pool, `select count(*) from ledger where order_id = 'order-6'`); n != 0 {
		t.Errorf("%d ledger rows of the poison record, want 0 (its writes roll back with its rejected row)", n)
	}
	if n := count(t, pool, `select count(*) from exactly_outbox where topic = 'credited'`); n != 9 {
		t.Errorf("%d events, want 9 (none for the poison record)", n)
	}
	reasons := deadLetterReasons(t, pool, "cmds.dlq")
	if len(reasons) != 1 || !strings.Contains(reasons[0], "exactly_outbox") || !strings.Contains(reasons[0], "poison payload") {
		t.Fatalf("dead-letter reasons %q, want one naming the failing outbox statement and the trigger's error", reasons)
	}
	t.Logf("dead-letter reason: %s", reasons[0])
	if logged := logs.String(); !strings.Contains(logged, "handler failed") || !strings.Contains(logged, "exactly_outbox") {
		t.Errorf("the log does not name the failing statement:\n%s", logged)
	}
}

// deadLetterReasons returns the reasons (the error header) of the dead
// letters written to the outbox for topic.
func deadLetterReasons(t testing.TB, pool *pgxpool.Pool, topic string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `select convert_from(decode(h->>'value', 'base64'), 'UTF8')
		from exactly_outbox, jsonb_array_elements(headers) h where topic = $1 and h->>'key' = $2`, topic, outbox.HeaderError)
	if err != nil {
		t.Fatal(err)
	}
	reasons, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return reasons
}
