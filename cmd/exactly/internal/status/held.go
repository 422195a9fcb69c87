package status

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultHeldProblemAfter is how long a record may be held (its handler
// failing, retried with backoff) before the report counts it as a problem:
// a record held for a few backoffs is the normal course of a retry, one
// held for minutes is not getting through.
const DefaultHeldProblemAfter = 5 * time.Minute

// HeldRecord is a record a consumer holds after a failed attempt of its
// handler, until a retry succeeds or dead-letters it, as the consumer left
// it in the guard's held table (dedupe.Guard.HeldTable). With key
// concurrency only its keys wait; without, its partition does.
type HeldRecord struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	// Scope and Key are the record's deduplication scope and key; nil (null
	// in JSON) when the record could not be keyed.
	Scope   *string `json:"scope"`
	Key     *string `json:"key"`
	Handler string  `json:"handler"`
	// Attempts are its failed attempts; LastError the last one's error,
	// redacted and bounded as the consumer's logs are.
	Attempts  int    `json:"attempts"`
	LastError string `json:"last_error"`
	// HeldFor is since its first failure; RetryIn until its next attempt
	// (zero or negative: due now).
	HeldFor time.Duration `json:"held_for_ns"`
	RetryIn time.Duration `json:"retry_in_ns"`
	// Stuck: held longer than Config.HeldProblemAfter; the report lists it
	// as a problem.
	Stuck bool `json:"stuck"`
}

// KeyText is the record's key for a person: its key, or "(not keyable)".
func (h HeldRecord) KeyText() string {
	if h.Key == nil {
		return "(not keyable)"
	}
	return *h.Key
}

// ShowKey is the record's key for a listing (see the package's ShowKey):
// quoted and bounded, or (not keyable) without quotes.
func (h HeldRecord) ShowKey() string {
	if h.Key == nil {
		return "(not keyable)"
	}
	return ShowText(*h.Key)
}

// PausedPartition is a partition whose fetching a consumer paused because
// of held records, as the consumer left it in the guard's paused table
// (dedupe.Guard.PausedTable): nothing past its window is read until its
// lowest unfinished record finishes or fewer records are held.
type PausedPartition struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Reason is "held_limit" (KeyConcurrency records are held) or
	// "offset_gap" (its lowest unfinished record is held and the partition
	// works MaxOffsetGap offsets past it).
	Reason           string        `json:"reason"`
	LowestUnfinished int64         `json:"lowest_unfinished"`
	Handler          string        `json:"handler"`
	PausedFor        time.Duration `json:"paused_for_ns"`
}

// Held is what waits in the consumers: held records and paused partitions.
type Held struct {
	// Known is false when the guard's held and paused tables do not exist
	// yet (guard migration 0008 has not run): the lists are then empty by
	// absence.
	Known bool `json:"known"`
	// Records are the held records, those held longest first, at most
	// Config.Rows of them; Total counts them all.
	Records []HeldRecord `json:"records"`
	Total   int64        `json:"total"`
	// Stuck counts the records held longer than Config.HeldProblemAfter
	// among Records.
	Stuck  int               `json:"stuck"`
	Paused []PausedPartition `json:"paused"`
}

// readHeld reads the held records (with key non-empty: only those of the
// key, in scope when not empty) and, without a key, the paused partitions.
// known is false when the tables do not exist.
func readHeld(ctx context.Context, tx pgx.Tx, cfg Config, key, scope string, limit int) (Held, error) {
	held := Held{Records: []HeldRecord{}, Paused: []PausedPartition{}}
	ht, pt := cfg.Guard.HeldTable(), cfg.Guard.PausedTable()
	if err := tx.QueryRow(ctx, tableExistsSQL, ht.Sanitize()).Scan(&held.Known); err != nil {
		return held, fmt.Errorf("looking up %s: %w", ht.Sanitize(), err)
	}
	if !held.Known {
		return held, nil
	}
	args := []any{limit}
	if key != "" {
		args = append(args, key)
		if scope != "" {
			args = append(args, scope)
		}
	}
	rows, err := tx.Query(ctx, heldRowsSQL(ht, key != "", scope != ""), args...)
	if err != nil {
		return held, fmt.Errorf("reading %s: %w", ht.Sanitize(), err)
	}
	for rows.Next() {
		var h HeldRecord
		var heldFor, retryIn int64
		if err := rows.Scan(&h.Group, &h.Topic, &h.Partition, &h.Offset, &h.Scope, &h.Key, &h.Handler, &h.Attempts,
			&h.LastError, &heldFor, &retryIn, &held.Total); err != nil {
			rows.Close()
			return held, fmt.Errorf("reading %s: %w", ht.Sanitize(), err)
		}
		h.HeldFor = time.Duration(heldFor) * time.Microsecond
		h.RetryIn = time.Duration(retryIn) * time.Microsecond
		h.Stuck = h.HeldFor > cfg.HeldProblemAfter
		if h.Stuck {
			held.Stuck++
		}
		held.Records = append(held.Records, h)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return held, fmt.Errorf("reading %s: %w", ht.Sanitize(), err)
	}
	if key != "" {
		return held, nil
	}
	prows, err := tx.Query(ctx, pausedRowsSQL(pt))
	if err != nil {
		return held, fmt.Errorf("reading %s: %w", pt.Sanitize(), err)
	}
	held.Paused, err = pgx.CollectRows(prows, func(r pgx.CollectableRow) (PausedPartition, error) {
		var p PausedPartition
		var micros int64
		err := r.Scan(&p.Group, &p.Topic, &p.Partition, &p.Reason, &p.LowestUnfinished, &p.Handler, &micros)
		p.PausedFor = time.Duration(micros) * time.Microsecond
		return p, err
	})
	if err != nil {
		return held, fmt.Errorf("reading %s: %w", pt.Sanitize(), err)
	}
	if held.Paused == nil {
		held.Paused = []PausedPartition{}
	}
	return held, nil
}

// heldProblems lists, as problems, the paused partitions (a partition that
// reads nothing behind a held record needs a look) and the records held
// longer than Config.HeldProblemAfter. A record held for less is a retry
// in its normal course: listed, not a problem.
func (c *Collector) heldProblems(r *Report) {
	for _, p := range r.Held.Paused {
		why := "its lowest unfinished record is held and it works MaxOffsetGap offsets past it"
		if p.Reason == "held_limit" {
			why = "KeyConcurrency of its records are held"
		}
		r.Problems = append(r.Problems, problem(fmt.Sprintf("partition %s/%d of %s paused for %v: %s (lowest unfinished offset %d, handler %s)",
			ShowText(p.Topic), p.Partition, ShowText(p.Group), p.PausedFor.Round(time.Second), why, p.LowestUnfinished, ShowText(p.Handler)),
			"exactly inspect the held record's key; fix the handler or its dependency, or let it be dead-lettered", "exactlyconsumerstalled"))
	}
	if r.Held.Stuck == 0 {
		return
	}
	var stuck []string
	for _, h := range r.Held.Records {
		if h.Stuck {
			stuck = append(stuck, fmt.Sprintf("%s %s/%d@%d key %s (%d attempts, held %v: error %s)",
				ShowText(h.Group), ShowText(h.Topic), h.Partition, h.Offset, h.ShowKey(), h.Attempts, h.HeldFor.Round(time.Second), ShowError(h.LastError)))
		}
	}
	what := "records held"
	if r.Held.Stuck == 1 {
		what = "record held"
	}
	r.Problems = append(r.Problems, problem(fmt.Sprintf("%d %s longer than %v, their handlers failing: %s",
		r.Held.Stuck, what, c.cfg.HeldProblemAfter, strings.Join(stuck, "; ")),
		"exactly inspect KEY shows the record and its last error; fix the handler or its dependency, or let it be dead-lettered and replay it (exactly deadletters, exactly replay)",
		"exactlyconsumerstalled"))
}
