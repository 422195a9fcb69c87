package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
)

func commitClaims(t *testing.T, g *dedupe.Guard, pool *pgxpool.Pool, claims ...dedupe.RecordClaim) []dedupe.Outcome {
	t.Helper()
	ctx := context.Background()
	tx := begin(t, pool)
	outs, err := g.ClaimRecords(ctx, tx, claims)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return outs
}

// ClaimRecords claims each record in its own scope, in one statement, and
// stores the record's coordinates with its row.
func TestClaimRecordsScopesAndCoordinates(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	outs := commitClaims(t, g, pool,
		dedupe.RecordClaim{Scope: "deposit", Key: "k", Topic: "cmds", Partition: 1, Offset: 10, TraceID: "abc", Handler: "deposit"},
		dedupe.RecordClaim{Scope: "transfer", Key: "k", Topic: "cmds", Partition: 1, Offset: 11, Handler: "transfer"},
		dedupe.RecordClaim{Scope: "deposit", Key: "k", Topic: "cmds", Partition: 1, Offset: 12, Handler: "deposit"})
	if fmt.Sprint(outs) != "[applied applied duplicate]" {
		t.Fatalf("outcomes %v, want the same key applied once per scope", outs)
	}
	var topic, trace, handlerName, state string
	var part int32
	var off int64
	if err := pool.QueryRow(ctx, `select topic, kafka_partition, kafka_offset, coalesce(trace_id, ''), handler, state from exactly_guard where scope = 'deposit' and key = 'k'`).
		Scan(&topic, &part, &off, &trace, &handlerName, &state); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%s %d %d %s %s %s", topic, part, off, trace, handlerName, state); got != "cmds 1 10 abc deposit applied" {
		t.Errorf("row %q, want the first record's coordinates", got)
	}
	if n := count(t, pool, `select count(*) from exactly_guard where scope = 'transfer' and trace_id is null`); n != 1 {
		t.Errorf("an empty trace id must be stored as NULL")
	}
	tx := begin(t, pool)
	if _, err := g.ClaimRecords(ctx, tx, []dedupe.RecordClaim{{Scope: "s", Key: ""}}); !errors.Is(err, dedupe.ErrEmptyKey) {
		t.Errorf("empty key: %v, want ErrEmptyKey", err)
	}
	if _, err := g.ClaimRecords(ctx, tx, []dedupe.RecordClaim{{Scope: "s\x00", Key: "k"}}); !errors.Is(err, dedupe.ErrInvalidScope) {
		t.Errorf("NUL in scope: %v, want ErrInvalidScope", err)
	}
}

// A dead-lettered key is a duplicate for the record that was dead-lettered
// and is taken over, once, by a record at other coordinates.
func TestDeadLetteredMarkTakeover(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	first := dedupe.RecordClaim{Scope: "s", Key: "k", Topic: "cmds", Partition: 0, Offset: 5, Handler: "h"}
	commitClaims(t, g, pool, first)
	tx := begin(t, pool)
	if err := g.MarkDeadLettered(ctx, tx, first); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if outs := commitClaims(t, g, pool, first); outs[0] != dedupe.Duplicate {
		t.Errorf("redelivery of the dead-lettered record: %v, want duplicate", outs[0])
	}
	replay := first
	replay.Offset = 99
	if outs := commitClaims(t, g, pool, replay); outs[0] != dedupe.Applied {
		t.Errorf("replayed copy: %v, want applied (takes the mark over)", outs[0])
	}
	if n := count(t, pool, `select count(*) from exactly_guard where key = 'k' and state = 'applied' and kafka_offset = 99`); n != 1 {
		t.Errorf("the row was not taken over by the replayed copy")
	}
	for _, c := range []dedupe.RecordClaim{replay, first} {
		if outs := commitClaims(t, g, pool, c); outs[0] != dedupe.Duplicate {
			t.Errorf("after the takeover, offset %d: %v, want duplicate", c.Offset, outs[0])
		}
	}
	// A record without a key is marked by its coordinates, inserting the row.
	tx = begin(t, pool)
	mark := dedupe.RecordClaim{Scope: "s", Key: dedupe.DeadLetterKey("cmds", 0, 7), Topic: "cmds", Offset: 7}
	if err := g.MarkDeadLettered(ctx, tx, mark); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if outs := commitClaims(t, g, pool, mark); outs[0] != dedupe.Duplicate {
		t.Errorf("redelivery of the undecodable record: %v, want duplicate", outs[0])
	}
	if k := dedupe.DeadLetterKey("cmds", 2, 7); k != "dead-letter:cmds/2/7" {
		t.Errorf("DeadLetterKey = %q", k)
	}
}

// A dead-lettered record redelivered after a copy of its key (other
// coordinates) took the mark over and was dead-lettered in turn stays a
// duplicate: it is not dead-lettered a second time. This is what a
// producer's copy of a poison record plus a partition reset did in
// `exactly chaos` (seed 5).
func TestDeadLetteredRedeliveryAfterTakeover(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	long := strings.Repeat("t", 249) // a mark key over MaxKeyLen: hashed
	for _, topic := range []string{"cmds", long} {
		first := dedupe.RecordClaim{Scope: "s", Key: "k-" + topic[:1], Topic: topic, Partition: 3, Offset: 417, Handler: "h"}
		copied := first
		copied.Partition, copied.Offset = 5, 459
		for _, c := range []dedupe.RecordClaim{first, copied} {
			if outs := commitClaims(t, g, pool, c); outs[0] != dedupe.Applied {
				t.Fatalf("%s/%d/%d: %v, want applied (first delivery, or the copy taking the mark over)", c.Topic[:1], c.Partition, c.Offset, outs[0])
			}
			tx := begin(t, pool)
			if err := g.MarkDeadLettered(ctx, tx, c); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range []dedupe.RecordClaim{first, copied} {
			if outs := commitClaims(t, g, pool, c); outs[0] != dedupe.Duplicate {
				t.Errorf("topic %.8s…: redelivery of %d/%d after the copy was dead-lettered: %v, want duplicate", c.Topic, c.Partition, c.Offset, outs[0])
			}
		}
		if n := count(t, pool, `select count(*) from exactly_guard where scope = 's' and key = '`+first.Key+`' and state = 'dead_lettered' and kafka_offset = 459`); n != 1 {
			t.Errorf("topic %.8s…: the key's row does not name the copy's dead letter", topic)
		}
	}
	// A new record at other coordinates still takes the mark over once.
	replay := dedupe.RecordClaim{Scope: "s", Key: "k-c", Topic: "cmds", Partition: 0, Offset: 1000, Handler: "h"}
	if outs := commitClaims(t, g, pool, replay); outs[0] != dedupe.Applied {
		t.Errorf("replayed record: %v, want applied", outs[0])
	}
}

func BenchmarkClaimRecords(b *testing.B) {
	ctx := context.Background()
	pool := testDB(b)
	g := dedupe.New()
	if err := g.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	claims := make([]dedupe.RecordClaim, 100)
	for j := range claims {
		claims[j] = dedupe.RecordClaim{Key: dedupe.Key("k", j), Topic: "cmds", Partition: 3, Offset: int64(j), Handler: "h",
			TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		tx, err := pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		// A new scope per iteration, so every key applies.
		for j := range claims {
			claims[j].Scope = strconv.Itoa(i)
		}
		if _, err := g.ClaimRecords(ctx, tx, claims); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// A single claim (the statement of a batch of one record) has the outcomes
// and leaves the rows that the same claim in a batch of several has: the
// same sequence of deliveries, dead-lettering and takeover runs in scope
// "one" claimed alone and in scope "many" next to another key's claim. So
// does the executor's claim of a lone record (scope "new"): QueueClaimNew,
// then ClaimRecords in the same transaction when it inserted nothing.
func TestClaimOneRecordMatchesBatchForm(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	first := dedupe.RecordClaim{Key: "k", Topic: "cmds", Partition: 2, Offset: 5, TraceID: "abc", Handler: "h"}
	replay := first
	replay.Offset, replay.TraceID = 99, ""
	steps := []struct {
		c    dedupe.RecordClaim
		dead bool // mark it dead-lettered after the claim
	}{{first, false}, {first, true}, {first, false}, {replay, false}, {replay, false}, {first, false}}
	var got [3][]dedupe.Outcome
	for i, scope := range []string{"one", "many", "new"} {
		for j, s := range steps {
			c := s.c
			c.Scope = scope
			claims := []dedupe.RecordClaim{c}
			if scope == "many" {
				claims = append(claims, dedupe.RecordClaim{Scope: scope, Key: "filler-" + strconv.Itoa(j), Topic: "cmds", Offset: int64(1000 + j)})
			}
			if scope == "new" {
				got[i] = append(got[i], claimNew(t, g, pool, c))
			} else {
				got[i] = append(got[i], commitClaims(t, g, pool, claims...)[0])
			}
			if s.dead {
				tx := begin(t, pool)
				if err := g.MarkDeadLettered(ctx, tx, c); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if want := "[applied duplicate duplicate applied duplicate duplicate]"; fmt.Sprint(got[0]) != want || fmt.Sprint(got[1]) != want || fmt.Sprint(got[2]) != want {
		t.Errorf("outcomes alone %v, in a batch %v, by QueueClaimNew %v, want %s for all", got[0], got[1], got[2], want)
	}
	row := func(scope string) string {
		var r string
		if err := pool.QueryRow(ctx, `select concat_ws(' ', topic, kafka_partition, kafka_offset, coalesce(trace_id, 'NULL'), handler, state) from exactly_guard where scope = $1 and key = 'k'`, scope).Scan(&r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if one, many, fresh := row("one"), row("many"), row("new"); one != many || one != fresh || one != "cmds 2 99 NULL h applied" {
		t.Errorf("row alone %q, in a batch %q, by QueueClaimNew %q, want all %q", one, many, fresh, "cmds 2 99 NULL h applied")
	}
}

// claimNew claims c as the executor claims a lone record, in its own
// committed transaction: QueueClaimNew in a batch, then, when that
// inserted nothing, ClaimRecords.
func claimNew(t *testing.T, g *dedupe.Guard, pool *pgxpool.Pool, c dedupe.RecordClaim) dedupe.Outcome {
	t.Helper()
	ctx := context.Background()
	tx := begin(t, pool)
	var inserted bool
	b := &pgx.Batch{}
	if err := g.QueueClaimNew(b, c, &inserted); err != nil {
		t.Fatal(err)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	out := dedupe.Applied
	if !inserted {
		outs, err := g.ClaimRecords(ctx, tx, []dedupe.RecordClaim{c})
		if err != nil {
			t.Fatal(err)
		}
		out = outs[0]
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return out
}

// QueueClaimNew inserts a new key's row and reports it, leaves an existing
// row as it is (a dead-lettered one included) and reports that, and
// refuses an invalid claim without queuing anything.
func TestQueueClaimNew(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	c := dedupe.RecordClaim{Scope: "s", Key: "k", Topic: "cmds", Partition: 1, Offset: 7, TraceID: "abc", Handler: "h"}
	queue := func(c dedupe.RecordClaim) bool {
		t.Helper()
		tx := begin(t, pool)
		var inserted bool
		b := &pgx.Batch{}
		if err := g.QueueClaimNew(b, c, &inserted); err != nil {
			t.Fatal(err)
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return inserted
	}
	if !queue(c) {
		t.Fatal("a new key's claim inserted nothing")
	}
	tx := begin(t, pool)
	if err := g.MarkDeadLettered(ctx, tx, c); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	other := c
	other.Offset, other.TraceID = 8, ""
	if queue(other) {
		t.Fatal("the claim of a dead-lettered key inserted a row")
	}
	var r string
	if err := pool.QueryRow(ctx, `select concat_ws(' ', topic, kafka_partition, kafka_offset, coalesce(trace_id, 'NULL'), handler, state) from exactly_guard where scope = 's' and key = 'k'`).Scan(&r); err != nil {
		t.Fatal(err)
	}
	if r != "cmds 1 7 abc h dead_lettered" {
		t.Errorf("row %q after a claim that found it, want it unchanged: %q", r, "cmds 1 7 abc h dead_lettered")
	}
	b := &pgx.Batch{}
	var inserted bool
	if err := g.QueueClaimNew(b, dedupe.RecordClaim{Scope: "s", Key: ""}, &inserted); !errors.Is(err, dedupe.ErrEmptyKey) || b.Len() != 0 {
		t.Errorf("empty key: %v with %d statements queued, want ErrEmptyKey and none", err, b.Len())
	}
}

// A dead letter of a key that another handler sharing the scope applied
// (a naturally idempotent route beside a guarded one) leaves the
// applied row as it is: the key is not reopened to a takeover, and its
// applied delivery stays counted. (The mark used to overwrite the row, so a
// copy of the applied record took it over and applied it again.)
func TestMarkLeavesAnEarlierAppliedRow(t *testing.T) {
	ctx := t.Context()
	g, pool := migrated(t)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := g.ClaimRecords(ctx, tx, []dedupe.RecordClaim{{Scope: "shared", Key: "k", Topic: "orders", Partition: 0, Offset: 3, Handler: "guarded"}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return g.MarkDeadLettered(ctx, tx, dedupe.RecordClaim{Scope: "shared", Key: "k", Topic: "orders", Partition: 1, Offset: 7, Handler: "idempotent"})
	}); err != nil {
		t.Fatal(err)
	}
	var outs []dedupe.Outcome
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		outs, err = g.ClaimRecords(ctx, tx, []dedupe.RecordClaim{{Scope: "shared", Key: "k", Topic: "orders", Partition: 2, Offset: 9, Handler: "guarded"}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(outs) != 1 || outs[0] != dedupe.Duplicate {
		t.Fatalf("a copy of the applied key claimed %v, want duplicate (the applied row must not be reopened)", outs)
	}
	if c, err := g.Outcomes(ctx, pool, "shared"); err != nil || c.Applied != 1 {
		t.Fatalf("Outcomes = %+v, %v; want the applied delivery still counted", c, err)
	}
}

// ClaimRecords stores each record's own topic, partition, offset and
// handler, whether the batch shares them (one partition's records, sent
// without their repeated values) or mixes them.
func TestClaimRecordsStoresEachRecordsCoordinates(t *testing.T) {
	ctx := context.Background()
	g, pool := migrated(t)
	type want struct {
		topic, handler string
		part           int32
	}
	batches := map[string]func(i int) want{
		"same": func(int) want { return want{"orders", "credit", 3} },
		"mixed": func(i int) want {
			return want{[]string{"orders", "refunds"}[i%2], []string{"credit", "refund", "audit"}[i%3], int32(i % 4)}
		},
		"partition varies last": func(i int) want {
			if i == 4 {
				return want{"orders", "credit", 7}
			}
			return want{"orders", "credit", 3}
		},
	}
	for name, of := range batches {
		var claims []dedupe.RecordClaim
		for i := range 5 {
			w := of(i)
			claims = append(claims, dedupe.RecordClaim{Scope: "s", Key: name + "-" + strconv.Itoa(i), Topic: w.topic, Partition: w.part, Offset: int64(100 + i), Handler: w.handler})
		}
		if outs := commitClaims(t, g, pool, claims...); fmt.Sprint(outs) != "[applied applied applied applied applied]" {
			t.Fatalf("%s: outcomes %v, want all applied", name, outs)
		}
		for i, c := range claims {
			var got want
			var off int64
			if err := pool.QueryRow(ctx, `select topic, kafka_partition, kafka_offset, handler from exactly_guard where scope = 's' and key = $1`, c.Key).
				Scan(&got.topic, &got.part, &off, &got.handler); err != nil {
				t.Fatalf("%s: reading row %d: %v", name, i, err)
			}
			if got != of(i) || off != c.Offset {
				t.Errorf("%s: row %d is %+v at offset %d, want %+v at %d", name, i, got, off, of(i), c.Offset)
			}
		}
	}
}
