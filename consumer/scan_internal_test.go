package consumer

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// scanWindow is a dispatcher whose window holds records of distinct keys
// at offsets 0, 1, …, ready to run; suspect lists the offsets whose handler
// failed in a transaction.
func scanWindow(n int, suspect ...int64) *dispatch {
	d := &dispatch{w: &worker{c: &Consumer{cfg: Config{KeyConcurrency: 64, BatchMaxRecords: 100}}}, batchCap: 100}
	for off := range int64(n) {
		e := &entry{rec: &kgo.Record{Offset: off}}
		for _, s := range suspect {
			e.suspect = e.suspect || s == off
		}
		d.set(e, stReady)
		d.win = append(d.win, e)
	}
	return d
}

func offsets(batch []*entry) []int64 {
	var out []int64
	for _, e := range batch {
		out = append(out, e.rec.Offset)
	}
	return out
}

// TestSuspectRecordRunsInATransactionOfItsOwn: a record whose handler
// failed in a transaction is never batched with other keys' records, so
// that failing again it rolls none of theirs back. First in the window it
// runs alone; behind others, they run first and it runs alone after.
func TestSuspectRecordRunsInATransactionOfItsOwn(t *testing.T) {
	d := scanWindow(4, 0)
	if got := offsets(d.scan()); len(got) != 1 || got[0] != 0 {
		t.Fatalf("suspect first: batch %v, want [0] alone", got)
	}

	d = scanWindow(4, 2)
	first := d.scan()
	if got := offsets(first); len(got) != 3 || got[0] != 0 || got[1] != 1 || got[2] != 3 {
		t.Fatalf("suspect at offset 2: first batch %v, want [0 1 3] (without it)", got)
	}
	for _, e := range first {
		d.set(e, stDone)
	}
	if got := offsets(d.scan()); len(got) != 1 || got[0] != 2 {
		t.Fatalf("suspect at offset 2: second batch %v, want [2] alone", got)
	}

	d = scanWindow(3)
	if got := offsets(d.scan()); len(got) != 3 {
		t.Fatalf("no suspect: batch %v, want all 3 records together", got)
	}
}
