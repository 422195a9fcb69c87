package consumer

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// fetchPools lends franz-go the memory of fetched records again
// (kgo.WithPools): the arrays a fetched record batch is decoded into
// (kgo.PoolRecords) and the buffers a compressed batch is decompressed into
// (kgo.PoolDecompressBytes). franz-go takes them back once every record of
// the batch was recycled (kgo.Record.Recycle). The key-concurrent
// dispatcher recycles a record when it compacts it out of its window, after
// its transaction committed, its outcome was reported and its in-flight
// bytes released: nothing reads it after that, and what outlives it
// (handlers' messages, dead letters) holds copies of its bytes. A record
// that is never recycled (a revoked partition's, or any with
// EXACTLY_KEY_CONCURRENCY=1) keeps its batch's memory out of the pools and
// is collected as without them. Safe for concurrent use, as franz-go
// requires.
type fetchPools struct {
	records sync.Pool // *[]kgo.Record
	bytes   sync.Pool // *[]byte
}

var (
	_ kgo.PoolRecords         = (*fetchPools)(nil)
	_ kgo.PoolDecompressBytes = (*fetchPools)(nil)
)

// GetRecords returns an array for n records: a pooled one when it has the
// room, else a new one.
func (p *fetchPools) GetRecords(n int) []kgo.Record {
	if s, ok := p.records.Get().(*[]kgo.Record); ok && cap(*s) >= n {
		return (*s)[:0]
	}
	return make([]kgo.Record, 0, n)
}

// PutRecords keeps a batch's array, every record zeroed by its Recycle.
func (p *fetchPools) PutRecords(recs []kgo.Record) { p.records.Put(&recs) }

// GetDecompressBytes returns a pooled buffer to decompress into, or nil
// (the codec then allocates its output, which comes back here once the
// batch's records are recycled).
func (p *fetchPools) GetDecompressBytes([]byte, kgo.CompressionCodecType) []byte {
	if b, ok := p.bytes.Get().(*[]byte); ok {
		return *b
	}
	return nil
}

// PutDecompressBytes keeps a batch's decompression buffer, zeroed by
// franz-go.
func (p *fetchPools) PutDecompressBytes(b []byte) { p.bytes.Put(&b) }
