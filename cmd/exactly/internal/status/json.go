package status

import (
	"encoding/json"
	"strings"
)

// The JSON form of a report (Report.JSON, /status.json, `exactly status
// -json`) differs from the Go values in two ways that make it easier to
// consume: table names are plain (schema.table, not SQL-quoted), and figures
// the Go values mark "no data" with -1 are null.

// MarshalJSON encodes p with null for Committed (no committed offset), Lag
// and LagBefore (unknown) where the Go value holds -1. It does not fail.
func (p Partition) MarshalJSON() ([]byte, error) {
	type plain Partition
	return json.Marshal(struct {
		plain
		Committed *int64 `json:"committed"`
		Lag       *int64 `json:"lag"`
		LagBefore *int64 `json:"lag_before"`
	}{plain(p), known(p.Committed), known(p.Lag), known(p.LagBefore)})
}

// MarshalJSON encodes g with null for Lag when it is unknown (-1 in the Go
// value). It does not fail.
func (g Group) MarshalJSON() ([]byte, error) {
	type plain Group
	return json.Marshal(struct {
		plain
		Lag *int64 `json:"lag"`
	}{plain(g), known(g.Lag)})
}

// MarshalJSON encodes r with null for Lag and StoppedLag when they are
// unknown (-1 in the Go value). It fails only as encoding/json does.
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report
	return json.Marshal(struct {
		plain
		Lag        *int64 `json:"lag"`
		StoppedLag *int64 `json:"stopped_lag"`
	}{plain(r), known(r.Lag), known(r.StoppedLag)})
}

// MarshalJSON encodes o with null for Recent when there were no deliveries
// between the samples (-1 in the Go value). It does not fail.
func (o Outcomes) MarshalJSON() ([]byte, error) {
	type plain Outcomes
	var recent *float64
	if o.Recent >= 0 {
		recent = &o.Recent
	}
	return json.Marshal(struct {
		plain
		Recent *float64 `json:"recent_duplicate_ratio"`
	}{plain(o), recent})
}

// MarshalJSON encodes o with its table name unquoted. It fails only as
// encoding/json does.
func (o Outbox) MarshalJSON() ([]byte, error) {
	type plain Outbox
	p := plain(o)
	p.Table = unquoteTable(o.Table)
	return json.Marshal(p)
}

// MarshalJSON encodes g with its table name unquoted. It does not fail.
func (g Guard) MarshalJSON() ([]byte, error) {
	type plain Guard
	p := plain(g)
	p.Table = unquoteTable(g.Table)
	return json.Marshal(p)
}

// MarshalJSON encodes p with null for the figures that are unknown (-1 in
// the Go value). It does not fail.
func (p Point) MarshalJSON() ([]byte, error) {
	var thr *float64
	if p.Throughput >= 0 {
		thr = &p.Throughput
	}
	return json.Marshal(struct {
		At         any      `json:"at"`
		Lag        *int64   `json:"lag"`
		Throughput *float64 `json:"throughput"`
		Backlog    *int64   `json:"backlog"`
	}{p.At, known(p.Lag), thr, known(p.Backlog)})
}

// known returns nil for -1 (or any negative value), else a pointer to v.
func known(v int64) *int64 {
	if v < 0 {
		return nil
	}
	return &v
}

// unquoteTable turns a sanitized identifier ("schema"."table", quotes
// doubled inside) into schema.table. A name that is not in that form is
// returned as it is.
func unquoteTable(s string) string {
	var parts []string
	for rest := s; rest != ""; {
		if rest[0] != '"' {
			return s
		}
		var b strings.Builder
		i := 1
		for {
			if i >= len(rest) {
				return s // unterminated
			}
			if rest[i] == '"' {
				if i+1 < len(rest) && rest[i+1] == '"' {
					b.WriteByte('"')
					i += 2
					continue
				}
				break
			}
			b.WriteByte(rest[i])
			i++
		}
		parts = append(parts, b.String())
		rest = rest[i+1:]
		if rest == "" {
			break
		}
		if rest[0] != '.' || len(rest) == 1 {
			return s
		}
		rest = rest[1:]
	}
	if len(parts) == 0 {
		return s
	}
	return strings.Join(parts, ".")
}
