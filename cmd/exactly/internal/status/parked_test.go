package status_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
	"github.com/exactly-go/exactly/outbox"
)

// TestParkedRowShowsReasonHeldAndSize parks the scenario's outbox row of
// key order-5 with a reason, as the relay does, after two more rows of that
// topic and key were written. The report gives the parked row its reason,
// its size (key and value bytes) and the 2 rows held behind it; those two
// are "held", not "pending", and every other row is pending. The page and
// the JSON say the same.
func TestParkedRowShowsReasonHeldAndSize(t *testing.T) {
	s := newScenario(t)
	const key, reason = "order-5", "MESSAGE_TOO_LARGE: record of 2000000 bytes"
	for range 2 {
		addOutboxRow(t, s.pool, outbox.Message{Topic: scenarioOutboxTop, Key: []byte(key), Value: []byte("amended")})
	}
	if _, err := s.pool.Exec(t.Context(), `update exactly_outbox set parked_at = now(), park_reason = $2
		where id = (select min(id) from exactly_outbox where key = $1)`, []byte(key), reason); err != nil {
		t.Fatal(err)
	}
	cfg := s.cfg
	cfg.Rows = 1000
	r, err := status.Collect(t.Context(), cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Outbox.Parked != 1 || r.Outbox.Held != 2 || r.Outbox.Backlog != scenarioUnique+1 {
		t.Errorf("outbox parked %d held %d backlog %d; want 1, 2, %d", r.Outbox.Parked, r.Outbox.Held, r.Outbox.Backlog, scenarioUnique+1)
	}
	p := r.Outbox.Rows[0]
	if !p.Parked || p.Key != key || p.Reason != reason || p.HeldBehind != 2 || p.Size != int64(len(key)+len("placed")) || p.State() != "parked" {
		t.Errorf("first row %+v; want parked %s, reason %q, 2 held behind, size %d", p, key, reason, len(key)+len("placed"))
	}
	var held, pending int
	for _, row := range r.Outbox.Rows[1:] {
		switch {
		case row.Parked || row.Reason != "" || row.HeldBehind != 0:
			t.Errorf("row %+v: only the first is parked", row)
		case row.Key == key && row.Held && row.State() == "held":
			held++
		case row.Key != key && !row.Held && row.State() == "pending":
			pending++
		default:
			t.Errorf("row %+v: a row of %s is held, any other pending", row, key)
		}
	}
	if held != 2 || pending != scenarioUnique-1 {
		t.Errorf("%d held, %d pending; want 2, %d", held, pending, scenarioUnique-1)
	}
	if ps := apartFromStoppedGroup(r.Problems); len(ps) != 1 || !strings.Contains(ps[0], "2 rows held behind them") {
		t.Errorf("problems %q; want the parked row with its 2 held rows", r.Problems)
	}

	_, html := get(t, newPage(t, cfg), http.MethodGet, "/")
	for _, want := range []string{"<td>parked</td><td>" + reason + "</td><td class=\"n\">2</td>", "<td>held</td>",
		"<b>2</b><span>rows held behind parked rows"} {
		if !strings.Contains(html, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	b, err := r.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var js struct {
		Outbox struct {
			Held int64 `json:"held"`
			Rows []struct {
				Reason     string `json:"reason"`
				Size       int64  `json:"size"`
				HeldBehind int64  `json:"held_behind"`
				Held       bool   `json:"held"`
			} `json:"rows"`
		} `json:"outbox"`
	}
	if err := json.Unmarshal(b, &js); err != nil {
		t.Fatal(err)
	}
	if js.Outbox.Held != 2 || js.Outbox.Rows[0].Reason != reason || js.Outbox.Rows[0].HeldBehind != 2 || js.Outbox.Rows[0].Size != 13 {
		t.Errorf("JSON outbox %+v", js.Outbox)
	}
}
