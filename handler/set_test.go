package handler_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/handler"
)

type credit struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

// TestSetCallsLeaveKeptMessagesIntact: a set-based function may keep the
// msgs it was given, the slice itself as well as copies of its messages,
// and later calls leave both as they were.
func TestSetCallsLeaveKeptMessagesIntact(t *testing.T) {
	var kept []handler.Message[credit]
	var slices [][]handler.Message[credit] // each call's msgs, kept as given
	h := handler.NewSet("credit", handler.FromPayload(func(c credit) string { return c.OrderID }),
		func(_ context.Context, _ pgx.Tx, msgs []handler.Message[credit]) error {
			kept = append(kept, msgs...)
			slices = append(slices, msgs)
			return nil
		})
	ctx := context.Background()
	const calls, per = 5, 40
	for c := range calls {
		members, attempts := make([]any, per), make([]int, per)
		var run func(context.Context, pgx.Tx, []any, []int) error
		for i := range per {
			id := strconv.Itoa(c*per + i)
			p, err := h.PrepareUnit(handler.Record{Topic: "credits", Offset: int64(c*per + i), Value: []byte(`{"order_id":"o-` + id + `","amount":` + id + `}`)})
			if err != nil {
				t.Fatal(err)
			}
			members[i], attempts[i], run = p.Set.Member, 1, p.Set.RunSet
		}
		if err := run(ctx, nil, members, attempts); err != nil {
			t.Fatalf("call %d: %v", c, err)
		}
	}
	if len(kept) != calls*per || len(slices) != calls {
		t.Fatalf("kept %d messages from %d calls, want %d from %d", len(kept), len(slices), calls*per, calls)
	}
	var fromSlices []handler.Message[credit]
	for _, s := range slices {
		fromSlices = append(fromSlices, s...)
	}
	for name, msgs := range map[string][]handler.Message[credit]{"copied message": kept, "kept slice's message": fromSlices} {
		for i, m := range msgs {
			id := strconv.Itoa(i)
			if m.Value.OrderID != "o-"+id || m.Value.Amount != int64(i) || m.Key != "o-"+id || m.Record.Offset != int64(i) ||
				string(m.Record.Value) != `{"order_id":"o-`+id+`","amount":`+id+`}` {
				t.Fatalf("%s %d changed by later calls: value %+v, key %q, offset %d, bytes %s", name, i, m.Value, m.Key, m.Record.Offset, m.Record.Value)
			}
		}
	}
}
