package consumer_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"math"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testenv"
)

// histogramRecorder is a metric.MeterProvider that hands every call to a
// real SDK meter provider and remembers the histograms created through it,
// with their units, so that a test can record into each.
type histogramRecorder struct {
	metric.MeterProvider
	mu      sync.Mutex
	hists   map[string]recordedHistogram
	changed chan struct{}
}

type recordedHistogram struct {
	unit   string
	record func(v float64, attrs ...attribute.KeyValue)
}

func (r *histogramRecorder) Meter(name string, opts ...metric.MeterOption) metric.Meter {
	return recordingMeter{Meter: r.MeterProvider.Meter(name, opts...), r: r}
}

func (r *histogramRecorder) add(name, unit string, record func(float64, ...attribute.KeyValue)) {
	r.mu.Lock()
	r.hists[name] = recordedHistogram{unit: unit, record: record}
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *histogramRecorder) snapshot() map[string]recordedHistogram {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]recordedHistogram, len(r.hists))
	for k, v := range r.hists {
		out[k] = v
	}
	return out
}

type recordingMeter struct {
	metric.Meter
	r *histogramRecorder
}

func (m recordingMeter) Float64Histogram(name string, opts ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	h, err := m.Meter.Float64Histogram(name, opts...)
	if err == nil {
		m.r.add(name, metric.NewFloat64HistogramConfig(opts...).Unit(), func(v float64, attrs ...attribute.KeyValue) {
			h.Record(context.Background(), v, metric.WithAttributes(attrs...))
		})
	}
	return h, err
}

func (m recordingMeter) Int64Histogram(name string, opts ...metric.Int64HistogramOption) (metric.Int64Histogram, error) {
	h, err := m.Meter.Int64Histogram(name, opts...)
	if err == nil {
		m.r.add(name, metric.NewInt64HistogramConfig(opts...).Unit(), func(v float64, attrs ...attribute.KeyValue) {
			h.Record(context.Background(), int64(math.Round(v)), metric.WithAttributes(attrs...))
		})
	}
	return h, err
}

// histogramCallSites lists the calls that create a histogram
// (Float64Histogram, Int64Histogram) in the code a service runs: every
// non-test Go file of the module outside cmd/, examples/ and
// internal/testenv.
func histogramCallSites(t *testing.T) []string {
	t.Helper()
	var sites []string
	fset := token.NewFileSet()
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		slash := filepath.ToSlash(path)
		if d.IsDir() {
			switch slash {
			case "../cmd", "../examples", "../internal/testenv":
				return filepath.SkipDir
			}
			if strings.HasPrefix(d.Name(), ".") && path != ".." || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok && (sel.Sel.Name == "Float64Histogram" || sel.Sel.Name == "Int64Histogram") {
					sites = append(sites, fset.Position(call.Pos()).String())
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatalf("scanning the module for histograms: %v", err)
	}
	return sites
}

// Every histogram a service creates has buckets in its unit: a 3 ms
// sample lands in a bucket whose upper bound is below 10 ms (0.01 for a
// seconds histogram), not in a first bucket millisecond bounds put at
// "5" seconds; and the bounds reach 10 s, so a slow sample is not only
// "+Inf". The histograms are the ones a running Service (consumer, relay,
// pruner) creates through a real SDK meter provider; a call site in the
// module that the service did not reach fails the test, so a new histogram
// cannot escape it.
func TestEveryHistogramBucketsMatchItsUnit(t *testing.T) {
	sites := histogramCallSites(t)
	if len(sites) == 0 {
		t.Fatal("no histogram call site found: is the scan right?")
	}
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "credits")
	reader := sdkmetric.NewManualReader()
	sdk := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	rec := &histogramRecorder{MeterProvider: sdk, hists: map[string]recordedHistogram{}, changed: make(chan struct{}, 1)}
	svc, err := consumer.NewService(testConfig(testenv.Brokers(kc), "g", "credits"), pool,
		consumer.Handle(creditHandler(0)), consumer.WithMeterProvider(rec))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	stop := runService(t, svc)
	deadline := time.After(30 * time.Second)
	for len(rec.snapshot()) < len(sites) {
		select {
		case <-rec.changed:
		case <-deadline:
			t.Fatalf("the service created %d histograms (%v), the module has %d call sites (%v): exercise the missing ones here",
				len(rec.snapshot()), keys(rec.snapshot()), len(sites), sites)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("service run: %v", err)
	}

	hists := rec.snapshot()
	probe := attribute.String("test.probe", "3ms")
	for name, h := range hists {
		switch h.unit {
		case "s":
			h.record(0.003, probe)
		case "ms":
			h.record(3, probe)
		default:
			t.Errorf("histogram %s has unit %q, which this test has no 3 ms sample for: add one", name, h.unit)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := hists[m.Name]
			if !ok {
				continue
			}
			var bounds []float64
			var counts []uint64
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					if v, ok := dp.Attributes.Value(probe.Key); ok && v.AsString() == "3ms" {
						bounds, counts = dp.Bounds, dp.BucketCounts
					}
				}
			case metricdata.Histogram[int64]:
				for _, dp := range d.DataPoints {
					if v, ok := dp.Attributes.Value(probe.Key); ok && v.AsString() == "3ms" {
						bounds, counts = dp.Bounds, dp.BucketCounts
					}
				}
			}
			if counts == nil {
				continue
			}
			seen[m.Name] = true
			scale := 1.0 // bounds in seconds per unit
			if h.unit == "ms" {
				scale = 0.001
			}
			upper := math.Inf(1)
			for i, c := range counts {
				if c > 0 && i < len(bounds) {
					upper = bounds[i]
				}
			}
			if upper*scale >= 0.01 {
				t.Errorf("%s (unit %q): a 3 ms sample lands in the bucket le=%v, want an upper bound below 10 ms; bounds %v",
					m.Name, h.unit, upper, bounds)
			}
			if len(bounds) == 0 || bounds[len(bounds)-1]*scale < 10 {
				t.Errorf("%s (unit %q): the largest bound is below 10 s, slow samples all land in +Inf; bounds %v", m.Name, h.unit, bounds)
			}
		}
	}
	names := keys(hists)
	sort.Strings(names)
	for _, n := range names {
		if !seen[n] {
			t.Errorf("histogram %s: the 3 ms sample was not collected", n)
		}
	}
}
