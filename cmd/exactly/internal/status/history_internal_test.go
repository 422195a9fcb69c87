package status

import (
	"strings"
	"testing"
	"time"
)

// The history keeps the newest HistorySize points, oldest first, however
// many are added.
func TestHistoryRingKeepsTheNewest(t *testing.T) {
	r := ring{size: HistorySize}
	t0 := time.Unix(0, 0)
	for i := range HistorySize + 37 {
		r.add(Point{At: t0.Add(time.Duration(i) * time.Second), Lag: int64(i)})
	}
	got := r.snapshot()
	if len(got) != HistorySize || got[0].Lag != 37 || got[len(got)-1].Lag != HistorySize+36 {
		t.Fatalf("%d points from lag %d to %d; want %d from 37 to %d", len(got), got[0].Lag, got[len(got)-1].Lag, HistorySize, HistorySize+36)
	}
	if cap(r.points) > HistorySize {
		t.Errorf("ring grew to capacity %d, past %d", cap(r.points), HistorySize)
	}
}

// A sparkline is inline SVG: a polyline per run of known values, an
// unknown value (negative) a gap, a lone known value a dot; the highest
// value touches the top padding and 0 the baseline.
func TestSparklineDrawsRunsAndGaps(t *testing.T) {
	svg := string(sparkline(`lag <"x">`, []float64{0, 10, -1, 5, -1, 2, 4}))
	if !strings.HasPrefix(svg, `<svg class="spark"`) || !strings.HasSuffix(svg, `</svg>`) {
		t.Fatalf("not an svg element: %s", svg)
	}
	if n := strings.Count(svg, "<polyline"); n != 2 {
		t.Errorf("%d polylines, want 2 (runs 0,10 and 2,4):\n%s", n, svg)
	}
	if n := strings.Count(svg, "<circle"); n != 1 {
		t.Errorf("%d dots, want 1 (the lone 5):\n%s", n, svg)
	}
	if !strings.Contains(svg, `points="2.0,38.0 61.3,2.0"`) {
		t.Errorf("first run not scaled 0 at the baseline, 10 (the highest) at the top:\n%s", svg)
	}
	if strings.Contains(svg, `<"x">`) || !strings.Contains(svg, `aria-label="lag &lt;&#34;x&#34;&gt;"`) {
		t.Errorf("label not escaped:\n%s", svg)
	}
	if strings.Contains(svg, "style") || strings.Contains(svg, "script") {
		t.Errorf("sparkline uses style or script, which the page's CSP forbids or does not need:\n%s", svg)
	}
}
