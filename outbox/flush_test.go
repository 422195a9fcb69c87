package outbox_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/deferred"
	"github.com/exactly-go/exactly/outbox"
)

// A consumer batch's rows, flushed in one statement, are stored each with
// its own topic, key, value and headers, in the order they were added:
// whether the batch's rows share one topic and carry no headers (sent
// without the repeated topic and the null headers) or mix them.
func TestBatchFlushStoresEachRowAsAdded(t *testing.T) {
	ctx := context.Background()
	e := setup(t, 1)
	pool, ob := e.pool, e.ob
	type row struct {
		topic, key, value, headers string
	}
	batches := map[string]func(i int) (outbox.Message, row){
		"one topic, no headers": func(i int) (outbox.Message, row) {
			v := fmt.Sprintf(`{"n":%d}`, i)
			return outbox.Message{Topic: "credited", Key: []byte(strconv.Itoa(i)), Value: []byte(v)}, row{"credited", strconv.Itoa(i), v, "<null>"}
		},
		"mixed": func(i int) (outbox.Message, row) {
			m := outbox.Message{Topic: []string{"credited", "debited", "audit"}[i%3], Value: []byte(strconv.Itoa(i))}
			r := row{m.Topic, "<null>", strconv.Itoa(i), "<null>"}
			if i%2 == 0 {
				m.Key, r.key = []byte("k"+strconv.Itoa(i)), "k"+strconv.Itoa(i)
			}
			if i%4 == 1 {
				m.Headers = []handler.Header{{Key: "h", Value: []byte(strconv.Itoa(i))}}
				r.headers = "h"
			}
			return m, r
		},
		"headers on the last row only": func(i int) (outbox.Message, row) {
			m, r := outbox.Message{Topic: "credited", Value: []byte("v")}, row{"credited", "<null>", "v", "<null>"}
			if i == 4 {
				m.Headers, r.headers = []handler.Header{{Key: "last", Value: []byte("x")}}, "last"
			}
			return m, r
		},
	}
	for name, of := range batches {
		if _, err := pool.Exec(ctx, `truncate exactly_outbox`); err != nil {
			t.Fatal(err)
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		buf := deferred.New(tx)
		bctx := deferred.With(ctx, buf)
		var want []row
		for i := range 5 {
			m, r := of(i)
			if err := ob.Add(bctx, tx, m); err != nil {
				t.Fatalf("%s: adding row %d: %v", name, i, err)
			}
			want = append(want, r)
		}
		if err := buf.Flush(ctx); err != nil {
			t.Fatalf("%s: flushing: %v", name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		rows, err := pool.Query(ctx, `select topic, coalesce(encode(key, 'escape'), '<null>'), encode(value, 'escape'),
			coalesce((select string_agg(h->>'key', ',') from jsonb_array_elements(headers) h), '<null>')
			from exactly_outbox order by id`)
		if err != nil {
			t.Fatal(err)
		}
		var got []row
		for rows.Next() {
			var r row
			if err := rows.Scan(&r.topic, &r.key, &r.value, &r.headers); err != nil {
				t.Fatal(err)
			}
			got = append(got, r)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: rows\n%v\nwant\n%v", name, got, want)
		}
	}
}
