package status

import (
	"fmt"
	"html/template"
	"strings"
	"time"
)

// HistorySize is how many samples a Collector keeps for Report.History:
// with the page's default 5 s refresh, the last ten minutes.
const HistorySize = 120

// Point is one sample of the history: the figures of one report.
type Point struct {
	At time.Time `json:"at"`
	// Lag is the headline lag (Report.Lag), -1 when unknown.
	Lag int64 `json:"lag"`
	// Throughput is the records per second the groups with members
	// committed since the sample before (the sum of their committed
	// offsets' advance over the time between), -1 for the first sample
	// or when the lag could not be read.
	Throughput float64 `json:"throughput"`
	// Backlog is the outbox backlog, -1 when the outbox could not be read.
	Backlog int64 `json:"backlog"`
}

// ring is a bounded, in-process history: the newest HistorySize points.
type ring struct {
	points []Point
	size   int
}

// add appends p, dropping the oldest point beyond the ring's size.
func (r *ring) add(p Point) {
	if r.points == nil {
		r.points = make([]Point, 0, r.size) // never grows past size
	}
	if len(r.points) == r.size {
		copy(r.points, r.points[1:])
		r.points = r.points[:r.size-1]
	}
	r.points = append(r.points, p)
}

// snapshot returns a copy of the points, oldest first.
func (r *ring) snapshot() []Point { return append([]Point(nil), r.points...) }

// point is the history's sample of r, with cur the offsets just read and
// c.prev those of the report before.
func (c *Collector) point(r *Report, cur *sample) Point {
	p := Point{At: r.Taken, Lag: r.Lag, Throughput: -1, Backlog: r.Outbox.Backlog}
	if r.Unknown(partOutbox) {
		p.Backlog = -1
	}
	if c.prev == nil || r.Interval <= 0 || r.Unknown(partLag) || c.cfg.Admin == nil {
		return p
	}
	stopped := map[string]bool{}
	for _, g := range r.Groups {
		stopped[g.Group] = g.Stopped
	}
	var advanced int64
	for k, now := range cur.lags {
		before, ok := c.prev.lags[k]
		if !ok || stopped[k.group] || now.Committed < 0 || before.Committed < 0 || now.Committed < before.Committed {
			continue
		}
		advanced += now.Committed - before.Committed
	}
	p.Throughput = float64(advanced) / r.Interval.Seconds()
	return p
}

// Sparkline geometry, in CSS pixels.
const (
	sparkWidth  = 360
	sparkHeight = 40
	sparkPad    = 2
)

// sparkline draws values (oldest first; negative means unknown, a gap) as
// an inline SVG polyline scaled from 0 to the largest value. It is markup
// built only from numbers and fixed text, so it is safe to emit unescaped;
// it needs no script and no style element (the page's CSP forbids scripts).
func sparkline(label string, values []float64) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="spark" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`,
		sparkWidth, sparkHeight, sparkWidth, sparkHeight, template.HTMLEscapeString(label))
	fmt.Fprintf(&b, `<line x1="0" y1="%d" x2="%d" y2="%d" stroke="#d9dde3" stroke-width="1"/>`,
		sparkHeight-sparkPad, sparkWidth, sparkHeight-sparkPad)
	top := 0.0
	for _, v := range values {
		top = max(top, v)
	}
	if top == 0 {
		top = 1
	}
	step := float64(sparkWidth-2*sparkPad) / float64(max(len(values)-1, 1))
	var run []string
	flush := func() {
		switch len(run) {
		case 0:
		case 1: // a lone known value between gaps: a dot
			xy := strings.Split(run[0], ",")
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="1.5" fill="#1565c0"/>`, xy[0], xy[1])
		default:
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="#1565c0" stroke-width="1.5"/>`, strings.Join(run, " "))
		}
		run = run[:0]
	}
	for i, v := range values {
		if v < 0 {
			flush()
			continue
		}
		x := sparkPad + step*float64(i)
		y := float64(sparkHeight-sparkPad) - (v/top)*float64(sparkHeight-2*sparkPad)
		run = append(run, fmt.Sprintf("%.1f,%.1f", x, y))
	}
	flush()
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // numbers and escaped fixed text only
}

// HistoryChart is one figure of the history for the page: its sparkline
// and the latest, lowest and highest known values.
type HistoryChart struct {
	Name             string
	SVG              template.HTML
	Latest, Min, Max string
	Known, Samples   int
}

// Charts returns the history of lag, throughput and outbox backlog as
// sparklines for the page.
func (r *Report) Charts() []HistoryChart {
	lag, thr, back := make([]float64, len(r.History)), make([]float64, len(r.History)), make([]float64, len(r.History))
	for i, p := range r.History {
		lag[i], thr[i], back[i] = float64(p.Lag), p.Throughput, float64(p.Backlog)
	}
	return []HistoryChart{
		chart("consumer lag (records, groups with members)", lag, "%.0f"),
		chart("throughput (records committed per second)", thr, "%.1f"),
		chart("outbox backlog (rows)", back, "%.0f"),
	}
}

func chart(name string, values []float64, format string) HistoryChart {
	c := HistoryChart{Name: name, SVG: sparkline(name, values), Latest: "–", Min: "–", Max: "–", Samples: len(values)}
	lo, hi := -1.0, -1.0
	for _, v := range values {
		if v < 0 {
			continue
		}
		c.Known++
		if lo < 0 || v < lo {
			lo = v
		}
		hi = max(hi, v)
	}
	if c.Known > 0 {
		c.Min, c.Max = fmt.Sprintf(format, lo), fmt.Sprintf(format, hi)
	}
	if n := len(values); n > 0 && values[n-1] >= 0 {
		c.Latest = fmt.Sprintf(format, values[n-1])
	}
	return c
}
