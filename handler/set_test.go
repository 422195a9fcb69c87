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
// messages it was given (copies of the slice's values), and later calls,
// which reuse the slice's array, leave them as they were; the slice itself
// holds no message once the call has returned, so it keeps none alive.
func TestSetCallsLeaveKeptMessagesIntact(t *testing.T) {
	var kept []handler.Message[credit]
	var lastSlice []handler.Message[credit] // kept against SetFunc's contract, to look at
	h := handler.NewSet("credit", handler.FromPayload(func(c credit) string { return c.OrderID }),
		func(_ context.Context, _ pgx.Tx, msgs []handler.Message[credit]) error {
			kept = append(kept, msgs...)
			lastSlice = msgs
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
		for i, m := range lastSlice {
			if m.Value.OrderID != "" || m.Record.Value != nil {
				t.Fatalf("call %d: message %d still in the slice after the call returned: %+v", c, i, m.Value)
			}
		}
	}
	if len(kept) != calls*per {
		t.Fatalf("kept %d messages, want %d", len(kept), calls*per)
	}
	for i, m := range kept {
		id := strconv.Itoa(i)
		if m.Value.OrderID != "o-"+id || m.Value.Amount != int64(i) || m.Key != "o-"+id || m.Record.Offset != int64(i) ||
			string(m.Record.Value) != `{"order_id":"o-`+id+`","amount":`+id+`}` {
			t.Fatalf("kept message %d changed by later calls: value %+v, key %q, offset %d, bytes %s", i, m.Value, m.Key, m.Record.Offset, m.Record.Value)
		}
	}
}
