package bench

import (
	"fmt"
	"io"
	"os"
	"runtime/metrics"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// memEnv names the file prefix under which an exactly child writes its
// memory trace and heap profiles (see docs/performance.md, peak RSS).
const memEnv = "EXACTLY_BENCH_MEMPROFILE"

// memSamples are the runtime/metrics a memory trace records, in its
// columns' order after the time, VmRSS and the record counts.
func memSamples() []string {
	return []string{
		"/gc/heap/live:bytes",
		"/gc/heap/goal:bytes",
		"/memory/classes/heap/objects:bytes",
		"/memory/classes/heap/unused:bytes",
		"/memory/classes/heap/free:bytes",
		"/memory/classes/heap/released:bytes",
		"/memory/classes/heap/stacks:bytes",
		"/memory/classes/total:bytes",
		"/gc/cycles/total:gc-cycles",
		"/sched/goroutines:goroutines",
	}
}

// memTrace samples the process's memory every 100 ms into prefix.csv
// (VmRSS, the records franz-go buffered and those committed, then
// memSamples), writes a heap profile prefix.<ms>.heap whenever VmRSS reaches
// a new high by 1 MiB or more (the last one is the profile at the peak) and
// prefix.end.heap at the end, and sums the record batches franz-go decoded
// into prefix.batches. It is a kgo hook, to count the records and batches.
type memTrace struct {
	prefix string
	out    io.WriteCloser
	stop   chan struct{}
	done   chan struct{}

	buffered  atomic.Int64
	committed func() int64

	mu          sync.Mutex
	batches     int
	maxRecords  int
	maxBytes    int
	sumRecords  int
	sumUncompr  int
	sumCompr    int
	compression uint8
}

// startMemTrace starts a trace to prefix.csv when the environment asks for
// one (memEnv); it returns nil otherwise.
func startMemTrace(name string, committed func() int64) (*memTrace, error) {
	base := os.Getenv(memEnv)
	if base == "" {
		return nil, nil
	}
	prefix := base + "." + name
	f, err := os.Create(prefix + ".csv")
	if err != nil {
		return nil, fmt.Errorf("creating the memory trace: %w", err)
	}
	m := &memTrace{prefix: prefix, out: f, stop: make(chan struct{}), done: make(chan struct{}), committed: committed}
	fmt.Fprint(f, "ms,vmrss_kib,buffered,committed")
	for _, s := range memSamples() {
		fmt.Fprint(f, ",", s)
	}
	fmt.Fprintln(f)
	go m.loop()
	return m, nil
}

// OnFetchRecordBuffered implements kgo.HookFetchRecordBuffered.
func (m *memTrace) OnFetchRecordBuffered(*kgo.Record) { m.buffered.Add(1) }

// OnFetchBatchRead implements kgo.HookFetchBatchRead.
func (m *memTrace) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, b kgo.FetchBatchMetrics) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.batches++
	m.maxRecords = max(m.maxRecords, b.NumRecords)
	m.maxBytes = max(m.maxBytes, b.UncompressedBytes)
	m.sumRecords += b.NumRecords
	m.sumUncompr += b.UncompressedBytes
	m.sumCompr += b.CompressedBytes
	m.compression = b.CompressionType
}

func (m *memTrace) loop() {
	defer close(m.done)
	names := memSamples()
	samples := make([]metrics.Sample, len(names))
	for i, s := range names {
		samples[i].Name = s
	}
	start := time.Now()
	var peak int64
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for last := false; ; {
		rss := vmRSS()
		metrics.Read(samples)
		fmt.Fprintf(m.out, "%d,%d,%d,%d", time.Since(start).Milliseconds(), rss, m.buffered.Load(), m.committed())
		for _, s := range samples {
			switch s.Value.Kind() {
			case metrics.KindUint64:
				fmt.Fprintf(m.out, ",%d", s.Value.Uint64())
			case metrics.KindFloat64:
				fmt.Fprintf(m.out, ",%g", s.Value.Float64())
			default:
				fmt.Fprint(m.out, ",")
			}
		}
		fmt.Fprintln(m.out)
		if rss >= peak+1024 {
			peak = rss
			m.heapProfile(fmt.Sprintf("%s.%05d.heap", m.prefix, time.Since(start).Milliseconds()))
		}
		if last {
			return
		}
		select {
		case <-m.stop:
			last = true // one more sample: the state at the end
		case <-t.C:
		}
	}
}

func (m *memTrace) heapProfile(path string) {
	if f, err := os.Create(path); err == nil {
		_ = pprof.Lookup("heap").WriteTo(f, 0)
		f.Close()
	}
}

// close takes a last sample, stops the sampling, and writes the end's heap
// profile and the summary of the record batches franz-go decoded.
func (m *memTrace) close() {
	if m == nil {
		return
	}
	close(m.stop)
	<-m.done
	m.heapProfile(m.prefix + ".end.heap")
	m.mu.Lock()
	defer m.mu.Unlock()
	if f, err := os.Create(m.prefix + ".batches"); err == nil {
		fmt.Fprintf(f, "batches=%d records=%d max_records=%d uncompressed=%d max_uncompressed=%d compressed=%d compression=%d\n",
			m.batches, m.sumRecords, m.maxRecords, m.sumUncompr, m.maxBytes, m.sumCompr, m.compression)
		f.Close()
	}
	m.out.Close()
}

// vmRSS returns this process's resident set in KiB (VmRSS), or -1.
func vmRSS() int64 { return procStatus("VmRSS:") }
