package consumer

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestFetchPoolsLendWhatCameBack: an array given back answers a later
// request it has room for, and not one it has no room for; a buffer given
// back is lent again; an empty pool lends nothing (the codec allocates).
// A sync.Pool may drop what it is given (the race detector makes it drop
// a quarter), so each lending is tried a few times.
func TestFetchPoolsLendWhatCameBack(t *testing.T) {
	var p fetchPools
	if b := p.GetDecompressBytes(nil, kgo.CodecSnappy); b != nil {
		t.Errorf("an empty pool lent a buffer of %d bytes", cap(b))
	}
	recs := p.GetRecords(100)
	if len(recs) != 0 || cap(recs) < 100 {
		t.Fatalf("GetRecords(100) on an empty pool: len %d cap %d, want 0 and at least 100", len(recs), cap(recs))
	}
	recs = recs[:100]
	lent := func(give func(), got func() bool) bool {
		for range 20 {
			give()
			if got() {
				return true
			}
		}
		return false
	}
	if !lent(func() { p.PutRecords(recs) }, func() bool {
		again := p.GetRecords(60)
		return cap(again) >= 100 && &again[:1][0] == &recs[0]
	}) {
		t.Error("GetRecords(60) never lent the 100-record array given back")
	}
	p.PutRecords(recs)
	if bigger := p.GetRecords(200); cap(bigger) < 200 {
		t.Errorf("GetRecords(200) lent an array of %d", cap(bigger))
	}
	buf := make([]byte, 0, 4096)
	if !lent(func() { p.PutDecompressBytes(buf) }, func() bool {
		return cap(p.GetDecompressBytes(nil, kgo.CodecSnappy)) == 4096
	}) {
		t.Error("the buffer given back was never lent again")
	}
}
