package consumer

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/exactly-go/exactly/internal/runtime/redact"
)

// What a partition waits on, in the database (the guard's held and paused
// tables, dedupe.Guard.HeldTable and PausedTable), for `exactly status` and
// `exactly inspect`, which read only the database. The rows are written
// only on the failure and pause paths, each in one statement on the pool
// outside any transaction, bounded by waitRowTimeout and best effort: a
// write that fails is logged (at warn the first time per partition, at
// debug after) and never fails or holds the partition longer than that. A
// record that succeeds on its first attempt writes nothing. The worker
// deletes its partition's rows when it starts (so rows a killed process
// left are cleared by the next owner) and, if it wrote any, when it stops.

// waitRowTimeout bounds one write of the held or paused tables.
const waitRowTimeout = 2 * time.Second

// Reasons of a paused row (the paused table's check constraint).
const (
	pausedHeldLimit = "held_limit"
	pausedOffsetGap = "offset_gap"
)

// waitExec runs one statement of the wait rows, best effort.
func (w *worker) waitExec(what, sql string, args ...any) {
	ctx, cancel := context.WithTimeout(context.Background(), waitRowTimeout)
	defer cancel()
	if _, err := w.c.pool.Exec(ctx, sql, args...); err != nil {
		level := slog.LevelDebug
		if !w.waitWarned {
			w.waitWarned, level = true, slog.LevelWarn
		}
		w.c.log.Log(ctx, level, "could not record what the partition waits on for exactly status (best effort; processing goes on)",
			"topic", w.topic, "partition", w.partition, "what", what, "error", err)
	}
}

// waitText is err's text as a held row keeps it: redacted of the
// configuration's secrets and of connection strings, valid UTF-8 without
// NUL bytes (which PostgreSQL text refuses), and bounded as log values are.
func (w *worker) waitText(err error) string {
	s := redact.Text(redact.Scrub(errText(err), w.c.cfg.Secrets()...))
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
	return redact.Bound(s)
}

// noteHeld records that the record at offset is held after its attempts'th
// failed attempt, err, until retryIn from now. scope and key are nil when
// unknown (a record that could not be keyed).
func (w *worker) noteHeld(offset int64, scope, key *string, attempts int, err error, retryIn time.Duration) {
	w.waitRows = true
	t := w.c.guard.HeldTable().Sanitize()
	w.waitExec("held record", `insert into `+t+` as h (consumer_group, topic, partition, record_offset, scope, key, handler, attempts, last_error, retry_at)
values ($1, $2, $3, $4, $5, $6, $7, $8, $9, now() + $10::bigint * interval '1 microsecond')
on conflict (consumer_group, topic, partition, record_offset) do update
set scope = excluded.scope, key = excluded.key, handler = excluded.handler, attempts = excluded.attempts,
    last_error = excluded.last_error, retry_at = excluded.retry_at`,
		w.c.cfg.Group, w.topic, w.partition, offset, scope, key, w.exec.Handler.Name(), attempts, w.waitText(err), retryIn.Microseconds())
}

// forgetHeld deletes the held rows of the records at offsets, which
// finished (committed or dead-lettered).
func (w *worker) forgetHeld(offsets []int64) {
	t := w.c.guard.HeldTable().Sanitize()
	w.waitExec("finished held records", `delete from `+t+` where consumer_group = $1 and topic = $2 and partition = $3 and record_offset = any($4::bigint[])`,
		w.c.cfg.Group, w.topic, w.partition, offsets)
}

// syncPaused writes the partition's paused row when its fetching is
// paused because of held records (KeyConcurrency of them, or its lowest
// unfinished record held at the offset gap), and deletes it when that
// stops. A pause of a partition whose lowest record merely runs (a
// backlog filling the window) is flow control and writes nothing. Each
// change is logged: a warning when held records pause the partition, info
// when it resumes. It is called where that can change: pause and resume, a failed attempt while
// paused, a held record finishing.
func (d *dispatch) syncPaused() {
	w := d.w
	reason := ""
	if d.holding && d.held > 0 {
		switch {
		case d.held >= w.c.cfg.KeyConcurrency:
			reason = pausedHeldLimit
		case d.lowestHeld():
			reason = pausedOffsetGap
		}
	}
	if reason == w.pausedReason {
		return
	}
	if reason != "" {
		d.log.Warn("partition paused: key concurrency works as far ahead of its lowest unfinished record as it may, and held records stop it",
			"reason", reason, "lowest_unfinished", d.lowest(), "held", d.held, "max_offset_gap", w.c.cfg.MaxOffsetGap,
			"key_concurrency", w.c.cfg.KeyConcurrency)
	} else {
		d.log.Info("partition resumed", "lowest_unfinished", d.lowest(), "held", d.held)
	}
	w.pausedReason = reason
	t := w.c.guard.PausedTable().Sanitize()
	if reason == "" {
		w.waitExec("resumed partition", `delete from `+t+` where consumer_group = $1 and topic = $2 and partition = $3`,
			w.c.cfg.Group, w.topic, w.partition)
		return
	}
	w.waitRows = true
	w.waitExec("paused partition", `insert into `+t+` (consumer_group, topic, partition, reason, lowest_unfinished, handler)
values ($1, $2, $3, $4, $5, $6)
on conflict (consumer_group, topic, partition) do update
set reason = excluded.reason, lowest_unfinished = excluded.lowest_unfinished, handler = excluded.handler, paused_since = now()`,
		w.c.cfg.Group, w.topic, w.partition, reason, d.lowest(), w.exec.Handler.Name())
}

// lowestHeld reports whether the window's lowest unfinished record failed
// an attempt.
func (d *dispatch) lowestHeld() bool {
	for _, e := range d.win {
		if e.state != stDone {
			return e.attempts > 0
		}
	}
	return false
}

// clearWaitRows deletes every held and paused row of the partition (its
// group's), in one statement.
func (w *worker) clearWaitRows() {
	held, paused := w.c.guard.HeldTable().Sanitize(), w.c.guard.PausedTable().Sanitize()
	w.waitExec("clearing the partition's rows", `with h as (delete from `+held+` where consumer_group = $1 and topic = $2 and partition = $3)
delete from `+paused+` where consumer_group = $1 and topic = $2 and partition = $3`,
		w.c.cfg.Group, w.topic, w.partition)
	w.waitRows, w.pausedReason = false, ""
}

// closeWaitRows clears the partition's rows when the worker stops, if it
// wrote any.
func (w *worker) closeWaitRows() {
	if w.waitRows {
		w.clearWaitRows()
	}
}
