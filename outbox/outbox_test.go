package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

func TestMigrateCustomTableIsQuotedAndIdempotent(t *testing.T) {
	e := setup(t, 1)
	ctx := context.Background()
	ob := outbox.New(outbox.WithTable(`Weird "schema"`, `out;box`))
	for range 2 {
		if err := ob.Migrate(ctx, e.pool); err != nil {
			t.Fatal(err)
		}
	}
	var exists bool
	if err := e.pool.QueryRow(ctx, "select to_regclass($1) is not null", ob.Table().Sanitize()).Scan(&exists); err != nil || !exists {
		t.Fatalf("table %s exists = %v, %v", ob.Table().Sanitize(), exists, err)
	}
	if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return ob.Add(ctx, tx, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("v")})
	}); err != nil {
		t.Fatal(err)
	}
	if n, _, err := ob.Backlog(ctx, e.pool); err != nil || n != 1 {
		t.Fatalf("Backlog = %d, %v; want 1", n, err)
	}
	if n := e.backlog(t); n != 0 {
		t.Fatalf("default table backlog = %d, want 0: the custom table was not used", n)
	}
}

func TestAddRejectsInvalidMessages(t *testing.T) {
	e := setup(t, 1)
	tx := e.begin(t)
	for name, m := range map[string]outbox.Message{
		"empty topic":  {Key: []byte("k")},
		"NUL header":   {Topic: "t", Headers: []handler.Header{{Key: "a\x00b"}}},
		"UTF-8 header": {Topic: "t", Headers: []handler.Header{{Key: "\xff"}}},
	} {
		if err := e.ob.Add(context.Background(), tx, m); !errors.Is(err, outbox.ErrInvalidMessage) {
			t.Errorf("%s: err = %v, want ErrInvalidMessage", name, err)
		}
	}
}

// TestAddChecksEveryNewTopic: an Outbox that accepted a topic still
// refuses an illegal one after it (and twice after), and accepts the first
// again.
func TestAddChecksEveryNewTopic(t *testing.T) {
	e := setup(t, 1)
	tx := e.begin(t)
	ctx := context.Background()
	for i, c := range []struct {
		topic string
		ok    bool
	}{{"orders", true}, {"orders", true}, {"bad topic", false}, {"bad topic", false}, {"orders", true}, {"..", false}, {"", false}, {"orders.v2", true}, {"bad topic", false}} {
		err := e.ob.Add(ctx, tx, outbox.Message{Topic: c.topic, Key: []byte("k"), Value: []byte("v")})
		if c.ok != (err == nil) || (!c.ok && !errors.Is(err, outbox.ErrInvalidMessage)) {
			t.Errorf("add %d, topic %q: err = %v, want accepted %v", i, c.topic, err, c.ok)
		}
	}
}

func TestAddFailsWithoutTable(t *testing.T) {
	e := setup(t, 1)
	tx := e.begin(t)
	err := outbox.New(outbox.WithTable("", "missing")).Add(context.Background(), tx, outbox.Message{Topic: "t", Key: []byte("k")})
	if err == nil {
		t.Fatal("Add to a missing table succeeded")
	}
}

func TestRolledBackRowsAreNeverPublished(t *testing.T) {
	e := setup(t, 3, "orders")
	ctx := context.Background()
	e.add(t, outbox.Message{Topic: "orders", Key: []byte("a"), Value: []byte("committed-1")})
	tx := e.begin(t)
	if err := e.ob.Add(ctx, tx, outbox.Message{Topic: "orders", Key: []byte("b"), Value: []byte("rolled-back")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	e.add(t, outbox.Message{Topic: "orders", Key: []byte("c"), Value: []byte("committed-2")})

	e.startRelay(t, e.fastConfig(t))
	recs := e.consume(t, "orders").waitFor(2, 10*time.Second)
	eventually(t, 5*time.Second, "empty backlog", func() bool { return e.backlog(t) == 0 })
	if n := e.produced(t, "orders"); n != 2 {
		t.Fatalf("%d records produced, want 2", n)
	}
	got := map[string]bool{}
	for _, r := range recs {
		got[string(r.Value)] = true
	}
	if !got["committed-1"] || !got["committed-2"] || got["rolled-back"] {
		t.Fatalf("published %v", got)
	}
}

func TestPublishedRecordHeaders(t *testing.T) {
	e := setup(t, 1, "orders")
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled,
	}))
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return e.ob.Add(ctx, tx, outbox.Message{Topic: "orders", Key: []byte("k"), Value: []byte("v"),
			Headers: []handler.Header{{Key: "app", Value: []byte{0, 1, 0xff}}, {Key: "traceparent", Value: []byte("stale")}}})
	})
	if err != nil {
		t.Fatal(err)
	}
	var messageID string
	if err := e.pool.QueryRow(ctx, "select message_id::text from exactly_outbox").Scan(&messageID); err != nil {
		t.Fatal(err)
	}
	e.startRelay(t, e.fastConfig(t))
	r := e.consume(t, "orders").waitFor(1, 10*time.Second)[0]
	if string(r.Key) != "k" || string(r.Value) != "v" {
		t.Fatalf("record %q=%q", r.Key, r.Value)
	}
	want := map[string]string{
		"app":                  "\x00\x01\xff",
		"traceparent":          "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		outbox.HeaderMessageID: messageID,
	}
	for k, v := range want {
		if got, ok := header(r, k); !ok || got != v {
			t.Errorf("header %s = %q, %v; want %q", k, got, ok, v)
		}
	}
	if id, ok := header(r, outbox.HeaderOutboxID); !ok || id == "" {
		t.Errorf("no %s header", outbox.HeaderOutboxID)
	}
	n := 0
	for _, h := range r.Headers {
		if h.Key == "traceparent" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d traceparent headers, want 1 (the stale one replaced)", n)
	}
}

func TestAddJSONAndBacklog(t *testing.T) {
	e := setup(t, 1)
	ctx := context.Background()
	type payment struct {
		Order  string `json:"order"`
		Amount int    `json:"amount"`
	}
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return e.ob.AddJSON(ctx, tx, "payments", []byte("o-1"), payment{"o-1", 42})
	})
	if err != nil {
		t.Fatal(err)
	}
	var value string
	if err := e.pool.QueryRow(ctx, "select convert_from(value, 'UTF8') from exactly_outbox").Scan(&value); err != nil {
		t.Fatal(err)
	}
	if value != `{"order":"o-1","amount":42}` {
		t.Fatalf("value %s", value)
	}
	if _, err := e.pool.Exec(ctx, "update exactly_outbox set created_at = now() - interval '1 hour'"); err != nil {
		t.Fatal(err)
	}
	n, oldest, err := e.ob.Backlog(ctx, e.pool)
	if err != nil || n != 1 || oldest < time.Hour || oldest > time.Hour+time.Minute {
		t.Fatalf("Backlog = %d, %v, %v; want 1, about 1h", n, oldest, err)
	}
	tx := e.begin(t)
	if err := e.ob.AddJSON(ctx, tx, "payments", nil, func() {}); err == nil {
		t.Fatal("AddJSON of a func succeeded")
	}
}

// AddJSON stores json.Marshal's bytes, whether its faster encoder of flat
// structs takes the value or leaves it to json.Marshal (an escaped string,
// a struct holding a struct, a map), and one value's encoding never shows
// in another's row (each row keeps its own slice).
func TestAddJSONStoresEncodingJSONBytes(t *testing.T) {
	e := setup(t, 1)
	ctx := context.Background()
	type flat struct {
		Order  string  `json:"order"`
		Amount int64   `json:"amount"`
		Rate   float64 `json:"rate,omitempty"`
		OK     bool    `json:"ok"`
	}
	type nested struct {
		In flat `json:"in"`
	}
	values := []any{
		flat{"o-1", 42, 0, true},
		&flat{"o-2", -7, 1e-7, false},
		flat{"<o&3>", 1, 2.5, true},
		flat{"é\n\"", 0, 0, false},
		nested{flat{"o-4", 4, 0.5, true}},
		map[string]int{"b": 2, "a": 1},
	}
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		for i, v := range values {
			if err := e.ob.AddJSON(ctx, tx, "payments", []byte(strconv.Itoa(i)), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := e.pool.Query(ctx, "select value from exactly_outbox order by id")
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(values) {
		t.Fatalf("%d rows, want %d", len(got), len(values))
	}
	for i, v := range values {
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[i], want) {
			t.Errorf("row %d: %s, want json.Marshal's %s", i, got[i], want)
		}
	}
}

// TestAddSerializesSameKey checks the per-key lock: a second transaction
// adding the same key waits in Add until the first ends, and then draws the
// larger id; a different key does not wait.
func TestAddSerializesSameKey(t *testing.T) {
	e := setup(t, 1)
	ctx := context.Background()
	tx1 := e.begin(t)
	if err := e.ob.Add(ctx, tx1, outbox.Message{Topic: "t", Key: []byte("K"), Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	tx2 := e.begin(t)
	var pid2 uint32
	if err := tx2.QueryRow(ctx, "select pg_backend_pid()").Scan(&pid2); err != nil {
		t.Fatal(err)
	}
	added := make(chan error, 1)
	go func() { added <- e.ob.Add(ctx, tx2, outbox.Message{Topic: "t", Key: []byte("K"), Value: []byte("2")}) }()
	eventually(t, 5*time.Second, "tx2 to wait on an advisory lock", func() bool {
		var waiting bool
		err := e.pool.QueryRow(ctx, "select exists(select 1 from pg_locks where pid = $1 and locktype = 'advisory' and not granted)", pid2).Scan(&waiting)
		return err == nil && waiting
	})
	select {
	case err := <-added:
		t.Fatalf("second Add of the same key returned (%v) while the first transaction is open", err)
	default:
	}
	// Another key, or the same key on another topic, does not wait.
	e.add(t, outbox.Message{Topic: "t", Key: []byte("L")}, outbox.Message{Topic: "u", Key: []byte("K")})
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	if err := tx2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := e.pool.Query(ctx, "select convert_from(value, 'UTF8') from exactly_outbox where topic = 't' and key = 'K' order by id")
	if err != nil {
		t.Fatal(err)
	}
	vals, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(vals) != 2 || vals[0] != "1" || vals[1] != "2" {
		t.Fatalf("values of K in id order = %v, %v; want [1 2]", vals, err)
	}
}

// TestLateCommitIsNotSkipped is the BIGSERIAL trap: tx1 draws the smaller
// id and commits after tx2. A relay that remembered "id > last seen" would
// publish tx2's row, move past tx1's id and never publish tx1's row.
func TestLateCommitIsNotSkipped(t *testing.T) {
	e := setup(t, 2, "t")
	ctx := context.Background()
	tx1 := e.begin(t)
	if err := e.ob.Add(ctx, tx1, outbox.Message{Topic: "t", Key: []byte("A"), Value: []byte("A1")}); err != nil {
		t.Fatal(err)
	}
	e.add(t, outbox.Message{Topic: "t", Key: []byte("B"), Value: []byte("B1")})
	e.startRelay(t, e.fastConfig(t))
	c := e.consume(t, "t")
	// Row 2 (key B) may go first: no transaction can still add an earlier
	// row for B, because Add serializes each key.
	if r := c.waitFor(1, 10*time.Second)[0]; string(r.Value) != "B1" {
		t.Fatalf("first record %q, want B1", r.Value)
	}
	e.add(t, outbox.Message{Topic: "t", Key: []byte("B"), Value: []byte("B2")})
	c.waitFor(2, 10*time.Second)
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	recs := c.waitFor(3, 10*time.Second)
	if got := string(recs[2].Value); got != "A1" {
		t.Fatalf("third record %q, want A1 (the late commit)", got)
	}
	eventually(t, 5*time.Second, "empty backlog", func() bool { return e.backlog(t) == 0 })
	if n := e.produced(t, "t"); n != 3 {
		t.Fatalf("%d records produced, want 3", n)
	}
}

// TestXminFilterWouldReorderAKey builds the case a relay filtering on
// txid < pg_snapshot_xmin(pg_current_snapshot()) gets wrong: txOld has the
// oldest xid but adds key K after txNew (newer xid) committed K's first row;
// txMid, still open, keeps xmin between them. The xmin filter would publish
// txOld's row (K's second) and hold back txNew's (K's first). The relay must
// publish K in commit order, and need not wait for txMid.
func TestXminFilterWouldReorderAKey(t *testing.T) {
	e := setup(t, 1, "t")
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, "create table scratch (n int)"); err != nil {
		t.Fatal(err)
	}
	write := func(tx pgx.Tx) uint64 {
		t.Helper()
		var xid uint64
		if err := tx.QueryRow(ctx, "insert into scratch values (1) returning pg_current_xact_id()::text::bigint").Scan(&xid); err != nil {
			t.Fatal(err)
		}
		return xid
	}
	txOld, txMid, txNew := e.begin(t), e.begin(t), e.begin(t)
	xOld, xMid, xNew := write(txOld), write(txMid), write(txNew)
	if !(xOld < xMid && xMid < xNew) {
		t.Fatalf("xids %d %d %d not increasing", xOld, xMid, xNew)
	}
	if err := e.ob.Add(ctx, txNew, outbox.Message{Topic: "t", Key: []byte("K"), Value: []byte("first")}); err != nil {
		t.Fatal(err)
	}
	if err := txNew.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.ob.Add(ctx, txOld, outbox.Message{Topic: "t", Key: []byte("K"), Value: []byte("second")}); err != nil {
		t.Fatal(err)
	}
	if err := txOld.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.startRelay(t, e.fastConfig(t))
	c := e.consume(t, "t")
	if r := c.waitFor(1, 10*time.Second)[0]; string(r.Value) != "first" {
		t.Fatalf("K's first published record is %q, want first: the key was reordered", r.Value)
	}
	recs := c.waitFor(2, 10*time.Second)
	if string(recs[0].Value) != "first" || string(recs[1].Value) != "second" {
		t.Fatalf("K published as %q, %q; want first, second", recs[0].Value, recs[1].Value)
	}
	if err := txMid.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestNewRelayValidates(t *testing.T) {
	e := setup(t, 1)
	if _, err := outbox.NewRelay(e.pool, nil, outbox.RelayConfig{}); err == nil {
		t.Error("no brokers accepted")
	}
	if _, err := outbox.NewRelay(nil, e.brokers, outbox.RelayConfig{}); err == nil {
		t.Error("nil pool accepted")
	}
	if _, err := outbox.NewRelay(e.pool, e.brokers, outbox.RelayConfig{BatchSize: -1}); err == nil {
		t.Error("negative batch size accepted")
	}
}

// seqValue formats a test sequence number.
func seqValue(n int) []byte { return []byte(strconv.Itoa(n)) }

// An outbox table whose schema was dropped with cascade while
// exactly_schema_migrations still records its versions is created again by
// Migrate, and usable; SchemaVersion reports 0 while it is missing.
func TestMigrateRecreatesDroppedTable(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	ob := outbox.New(outbox.WithTable("s", "exactly_outbox"))
	if err := ob.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `drop schema s cascade`); err != nil {
		t.Fatal(err)
	}
	cur, latest, err := ob.SchemaVersion(ctx, pool)
	if err != nil || cur != 0 {
		t.Fatalf("SchemaVersion of the dropped table = %d, %v; want 0", cur, err)
	}
	if err := ob.Migrate(ctx, pool); err != nil {
		t.Fatalf("Migrate after the drop: %v", err)
	}
	if cur, _, err := ob.SchemaVersion(ctx, pool); err != nil || cur != latest {
		t.Fatalf("SchemaVersion after Migrate = %d, %v; want %d", cur, err, latest)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return ob.Add(ctx, tx, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("v")})
	}); err != nil {
		t.Fatalf("Add to the re-created table: %v", err)
	}
	if n, _, err := ob.Backlog(ctx, pool); err != nil || n != 1 {
		t.Fatalf("Backlog = %d, %v; want 1", n, err)
	}
}
