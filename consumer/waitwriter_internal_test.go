package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/runtime/redact"
	"github.com/exactly-go/exactly/internal/testenv"
)

// lockHeld takes an access exclusive lock on the held table in a
// transaction of its own connection (every write of a held row waits for
// it) and returns its release.
func lockHeld(t *testing.T, pool *pgxpool.Pool) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `lock table exactly_guard_held in access exclusive mode`); err != nil {
		t.Fatal(err)
	}
	done := false
	unlock = func() {
		if !done {
			done = true
			_ = tx.Rollback(ctx)
			conn.Release()
		}
	}
	t.Cleanup(unlock)
	return unlock
}

// awaitWaiting waits until a statement starting with prefix waits for a
// lock, failing t after 30 s.
func awaitWaiting(t *testing.T, pool *pgxpool.Pool, prefix string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(context.Background(), `select count(*) from pg_stat_activity
where wait_event_type = 'Lock' and query like $1 || '%'`, prefix).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no statement %q waits for the lock after 30 s", prefix)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitState is the wait rows of a group's topic t, partition 0: its held
// rows' offsets and attempts (the first and last five of more than ten),
// and its paused row's reason and lowest offset ("" none).
type waitState struct {
	held   string
	paused string
}

// readWaitState reads the wait rows of group's topic t, partition 0.
func readWaitState(t *testing.T, pool *pgxpool.Pool, group string) waitState {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `select record_offset, attempts from exactly_guard_held
where consumer_group = $1 and topic = 't' and partition = 0 order by 1`, group)
	if err != nil {
		t.Fatal(err)
	}
	held, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var o int64
		var a int
		err := r.Scan(&o, &a)
		return fmt.Sprintf("%d:%d", o, a), err
	})
	if err != nil {
		t.Fatal(err)
	}
	var s waitState
	s.held = fmt.Sprint(held)
	if len(held) > 10 {
		s.held = fmt.Sprintf("%v … %v (%d rows)", held[:5], held[len(held)-5:], len(held))
	}
	err = pool.QueryRow(ctx, `select reason || '@' || lowest_unfinished from exactly_guard_paused
where consumer_group = $1 and topic = 't' and partition = 0`, group).Scan(&s.paused)
	if err != nil && err != pgx.ErrNoRows {
		t.Fatal(err)
	}
	return s
}

// awaitWaitState polls the rows of group until they are want, failing t
// after 30 s.
func awaitWaitState(t *testing.T, pool *pgxpool.Pool, group string, want waitState) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := readWaitState(t, pool, group)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("wait rows of %s: %+v after 30 s, want %+v", group, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// newTestWaitWriter starts a writer of the wait rows of group's topic t,
// partition 0, handler h, in the default guard's tables.
func newTestWaitWriter(pool *pgxpool.Pool, group string) *waitWriter {
	g := dedupe.New()
	return newWaitWriter(pool, slog.New(slog.DiscardHandler), g.HeldTable().Sanitize(), g.PausedTable().Sanitize(), group, "t", 0, "h")
}

// held is a held row after attempts failed attempts, retried in 1 s.
func held(attempts int) heldWrite {
	return heldWrite{attempts: attempts, lastError: "failed", retryAt: time.Now().Add(time.Second)}
}

// While the held table is locked (the writer's first statement, the
// clearing of a previous owner's rows, waits), the writer queues without
// blocking: 5000 held records, 4999 of which finish (past waitForgetMax
// finished offsets the queue collapses into one prune, so it stays
// bounded), one that finishes and is held again, and pauses that replace
// one another. Once unlocked, the previous owner's rows are cleared before
// the new ones are written, and the rows are the latest state queued.
func TestWaitWriterCoalescesInOrderWhileStuck(t *testing.T) {
	pool := testenv.DB(t)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`insert into exactly_guard_held (consumer_group, topic, partition, record_offset, handler, attempts, last_error, retry_at)
values ('g', 't', 0, 99999, 'h', 9, 'left by a killed process', now()), ('other', 't', 0, 1, 'h', 9, 'another group''s', now())`,
		`insert into exactly_guard_paused (consumer_group, topic, partition, reason, lowest_unfinished, handler) values ('g', 't', 0, 'held_limit', 99999, 'h')`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	unlock := lockHeld(t, pool)
	ww := newTestWaitWriter(pool, "g")
	defer ww.close()
	awaitWaiting(t, pool, "with h as (delete from")
	const n = 5000
	for o := range int64(n) {
		ww.hold(o, held(1))
	}
	for o := range int64(n - 1) {
		ww.forget([]int64{o})
	}
	ww.hold(7, held(2))
	ww.pause(pausedHeldLimit, 0)
	ww.resume()
	ww.pause(pausedOffsetGap, 7)
	ww.mu.Lock()
	prune, forgets, rows := ww.pending.prune, len(ww.pending.forget), len(ww.pending.held)
	ww.mu.Unlock()
	if !prune || forgets != 0 || rows != 2 {
		t.Errorf("queue: prune %v, %d finished offsets, %d held rows; want a prune, none, 2 (offsets 7 and %d)", prune, forgets, rows, n-1)
	}
	unlock()
	awaitWaitState(t, pool, "g", waitState{held: fmt.Sprintf("[7:2 %d:1]", n-1), paused: "offset_gap@7"})
	if got := readWaitState(t, pool, "other"); got.held != "[1:9]" {
		t.Errorf("another group's held rows %s, want [1:9]", got.held)
	}
}

// A held row's deletion queued while its insertion is in flight (waiting
// for a lock) is written after it: the row is gone, never left behind.
// The same for the paused row.
func TestWaitWriterDeletesAfterTheWriteInFlight(t *testing.T) {
	pool := testenv.DB(t)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	ww := newTestWaitWriter(pool, "g")
	defer ww.close()
	ww.hold(1, held(1))
	awaitWaitState(t, pool, "g", waitState{held: "[1:1]"})

	unlock := lockHeld(t, pool)
	ww.hold(2, held(1))
	ww.hold(1, held(2))
	awaitWaiting(t, pool, "insert into")
	ww.forget([]int64{1, 2})
	unlock()
	awaitWaitState(t, pool, "g", waitState{held: "[]"})

	ww.pause(pausedHeldLimit, 3)
	ww.resume()
	awaitWaitState(t, pool, "g", waitState{held: "[]"})
	ww.pause(pausedHeldLimit, 4)
	awaitWaitState(t, pool, "g", waitState{held: "[]", paused: "held_limit@4"})
}

// Closing the writer clears the partition's rows it wrote, leaves other
// groups' rows, and ends its goroutine; with the held table locked, it
// cancels the write in flight, gives up the clearing after its bound
// (best effort), and still ends.
func TestWaitWriterCloseClearsAndEnds(t *testing.T) {
	pool := testenv.DB(t)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `insert into exactly_guard_held (consumer_group, topic, partition, record_offset, handler, attempts, last_error, retry_at)
values ('other', 't', 0, 1, 'h', 9, 'another group''s', now())`); err != nil {
		t.Fatal(err)
	}
	ww := newTestWaitWriter(pool, "g")
	ww.hold(1, held(1))
	ww.pause(pausedOffsetGap, 1)
	awaitWaitState(t, pool, "g", waitState{held: "[1:1]", paused: "offset_gap@1"})
	ww.close()
	if got := readWaitState(t, pool, "g"); got != (waitState{held: "[]"}) {
		t.Errorf("rows after close: %+v, want none", got)
	}
	if got := readWaitState(t, pool, "other"); got.held != "[1:9]" {
		t.Errorf("another group's held rows %s, want [1:9]", got.held)
	}
	select {
	case <-ww.done:
	default:
		t.Error("the writer's goroutine runs after close returned")
	}
	ww.hold(2, held(1)) // after close: ignored, no panic, no write
	ww.forget([]int64{2})

	stuck := newTestWaitWriter(pool, "g2")
	stuck.hold(1, held(1))
	awaitWaitState(t, pool, "g2", waitState{held: "[1:1]"})
	unlock := lockHeld(t, pool)
	stuck.hold(2, held(1))
	awaitWaiting(t, pool, "insert into")
	closed := make(chan struct{})
	go func() { stuck.close(); close(closed) }()
	// At most the clearing's bound once the insertion is cancelled.
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("close of a writer stuck on a lock did not return in 30 s")
	}
	// The insertion cancelled never lands. (The clearing the writer gave
	// up may still run once the lock goes: the server may not have taken
	// its cancellation yet.)
	unlock()
	if got := readWaitState(t, pool, "g2"); got.held != "[1:1]" && got.held != "[]" {
		t.Errorf("held rows of the writer closed while stuck: %s, want offset 1's or none", got.held)
	}
}

// Rows another owner of the partition left (a zombie that lost it without
// knowing: its late held and paused rows, and its final clearing of this
// owner's rows) are put right by the writer's periodic reconciliation:
// the stale rows deleted, its own rows written again, and the paused row's
// paused_since kept while the partition stays paused.
func TestWaitWriterReconcilesRowsAnotherOwnerLeft(t *testing.T) {
	pool := testenv.DB(t)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	g := dedupe.New()
	ww := newWaitWriterEvery(pool, slog.New(slog.DiscardHandler), g.HeldTable().Sanitize(), g.PausedTable().Sanitize(), "g", "t", 0, "h", 50*time.Millisecond)
	defer ww.close()
	ww.hold(5, held(2))
	awaitWaitState(t, pool, "g", waitState{held: "[5:2]"})

	zombie := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	// The zombie's late rows, then its final clearing of the held rows.
	zombie(`delete from exactly_guard_held where consumer_group = 'g'`)
	zombie(`insert into exactly_guard_held (consumer_group, topic, partition, record_offset, handler, attempts, last_error, retry_at)
values ('g', 't', 0, 9, 'h', 7, 'the zombie''s', now())`)
	zombie(`insert into exactly_guard_paused (consumer_group, topic, partition, reason, lowest_unfinished, handler)
values ('g', 't', 0, 'held_limit', 9, 'h')`)
	awaitWaitState(t, pool, "g", waitState{held: "[5:2]"})

	ww.pause(pausedOffsetGap, 5)
	awaitWaitState(t, pool, "g", waitState{held: "[5:2]", paused: "offset_gap@5"})
	var since time.Time
	if err := pool.QueryRow(ctx, `select paused_since from exactly_guard_paused where consumer_group = 'g'`).Scan(&since); err != nil {
		t.Fatal(err)
	}
	// A later stale row gone proves a reconciliation ran since.
	zombie(`insert into exactly_guard_held (consumer_group, topic, partition, record_offset, handler, attempts, last_error, retry_at)
values ('g', 't', 0, 11, 'h', 7, 'the zombie''s', now())`)
	awaitWaitState(t, pool, "g", waitState{held: "[5:2]", paused: "offset_gap@5"})
	var after time.Time
	if err := pool.QueryRow(ctx, `select paused_since from exactly_guard_paused where consumer_group = 'g'`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if !after.Equal(since) {
		t.Errorf("paused_since %v after a reconciliation, want %v kept: the partition stayed paused", after, since)
	}
}

// A worker's held row carries the record's scope and key, and nulls for a
// record that could not be keyed ("" to noteHeld). noteHeld takes values,
// not pointers into the record's state, which the dispatcher reuses once
// the record finishes while the writer may not have written yet.
func TestHeldRowCarriesScopeAndKeyOrNulls(t *testing.T) {
	pool := testenv.DB(t)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	w := &worker{c: &Consumer{log: slog.New(slog.DiscardHandler)}, waits: newTestWaitWriter(pool, "g")}
	defer w.waits.close()
	w.noteHeld(1, "jobs", "job:a0", 1, errors.New("failed"), time.Minute)
	w.noteHeld(2, "", "", 1, errors.New("undecodable"), time.Minute)
	awaitWaitState(t, pool, "g", waitState{held: "[1:1 2:1]"})
	rows, err := pool.Query(ctx, `select coalesce(scope, '<null>') || ' ' || coalesce(key, '<null>') from exactly_guard_held
where consumer_group = 'g' order by record_offset`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[jobs job:a0 <null> <null>]" {
		t.Errorf("held rows' scope and key: %q, want the keyed record's and nulls for the unkeyed one", got)
	}
}

// A held record that finished is not written back by the next
// reconciliation: the reconciliation writes the records held now, and a
// finished one is no longer among them.
func TestWaitWriterReconciliationLeavesFinishedRecordsOut(t *testing.T) {
	pool := testenv.DB(t)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	g := dedupe.New()
	ww := newWaitWriterEvery(pool, slog.New(slog.DiscardHandler), g.HeldTable().Sanitize(), g.PausedTable().Sanitize(), "g", "t", 0, "h", 20*time.Millisecond)
	defer ww.close()
	ww.hold(5, held(2))
	ww.hold(6, held(1))
	awaitWaitState(t, pool, "g", waitState{held: "[5:2 6:1]"})
	ww.forget([]int64{6})
	// A stale row the writer does not hold is gone once a reconciliation
	// ran; the writer's statements run one after another, so once a second
	// stale row is gone, the reconciliation that deleted the first has
	// written all it writes.
	for _, offset := range []int{11, 12} {
		if _, err := pool.Exec(ctx, `insert into exactly_guard_held (consumer_group, topic, partition, record_offset, handler, attempts, last_error, retry_at)
values ('g', 't', 0, $1, 'h', 7, 'stale', now())`, offset); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			var n int
			if err := pool.QueryRow(ctx, `select count(*) from exactly_guard_held where consumer_group = 'g' and record_offset = $1`, offset).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("stale held row %d still there after 30 s: no reconciliation ran", offset)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if got := readWaitState(t, pool, "g"); got != (waitState{held: "[5:2]"}) {
		t.Errorf("rows after a reconciliation: %+v, want only offset 5 held: offset 6 finished before it", got)
	}
}

// A writer closed before its goroutine took its first picture (a worker
// stopped as soon as it started) still clears the previous owner's rows:
// its first clearing is what it closes with.
func TestWaitWriterClosedBeforeItsFirstClearingClears(t *testing.T) {
	pool := testenv.DB(t)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`insert into exactly_guard_held (consumer_group, topic, partition, record_offset, handler, attempts, last_error, retry_at)
values ('g', 't', 0, 3, 'h', 9, 'the previous owner''s', now())`,
		`insert into exactly_guard_paused (consumer_group, topic, partition, reason, lowest_unfinished, handler) values ('g', 't', 0, 'held_limit', 3, 'h')`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	g := dedupe.New()
	ww := makeWaitWriter(pool, slog.New(slog.DiscardHandler), g.HeldTable().Sanitize(), g.PausedTable().Sanitize(), "g", "t", 0, "h", waitReconcileEvery)
	ww.mu.Lock()
	ww.closing = true // closed before run took anything
	ww.mu.Unlock()
	go ww.run()
	<-ww.done
	if got := readWaitState(t, pool, "g"); got != (waitState{held: "[]"}) {
		t.Errorf("rows after a writer closed before its first clearing: %+v, want the previous owner's cleared", got)
	}
}

// A held row's last error is bounded as log values are (redact.Bound): a
// handler failing with a megabyte of text writes a small row that still
// names it.
func TestHeldRowErrorIsBounded(t *testing.T) {
	pool := testenv.DB(t)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	w := &worker{c: &Consumer{log: slog.New(slog.DiscardHandler)}, waits: newTestWaitWriter(pool, "g")}
	defer w.waits.close()
	huge := strings.Repeat("x", 1<<20)
	w.noteHeld(1, "jobs", "job:a0", 1, errors.New(huge), time.Minute)
	awaitWaitState(t, pool, "g", waitState{held: "[1:1]"})
	var got string
	if err := pool.QueryRow(ctx, `select last_error from exactly_guard_held where consumer_group = 'g'`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := redact.Bound(huge); got != want {
		t.Errorf("held row's last error is %d bytes, want %d: bounded, ending %q", len(got), len(want), want[len(want)-40:])
	}
}

// A pause whose lowest unfinished record moves (the records before a held
// one committed) moves its row's lowest_unfinished and keeps its
// paused_since: the partition stayed paused. A move queued with the pause
// itself, before it was written, writes the pause at the new offset.
func TestWaitWriterMovesAPauseKeepingItsSince(t *testing.T) {
	pool := testenv.DB(t)
	ctx := context.Background()
	if err := dedupe.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	ww := newTestWaitWriter(pool, "g")
	defer ww.close()
	since := func() time.Time {
		t.Helper()
		var at time.Time
		if err := pool.QueryRow(ctx, `select paused_since from exactly_guard_paused where consumer_group = 'g'`).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	ww.hold(5, held(1))
	ww.pause(pausedOffsetGap, 5)
	awaitWaitState(t, pool, "g", waitState{held: "[5:1]", paused: "offset_gap@5"})
	first := since()
	ww.forget([]int64{5})
	ww.move(6)
	awaitWaitState(t, pool, "g", waitState{held: "[]", paused: "offset_gap@6"})
	if got := since(); !got.Equal(first) {
		t.Errorf("paused_since %v after the pause moved to offset 6, want %v kept", got, first)
	}

	unlock := lockHeld(t, pool)
	ww.hold(7, held(1))
	awaitWaiting(t, pool, "insert into")
	ww.resume()
	ww.pause(pausedHeldLimit, 7)
	ww.move(8)
	unlock()
	awaitWaitState(t, pool, "g", waitState{held: "[7:1]", paused: "held_limit@8"})
	if got := since(); !got.After(first) {
		t.Errorf("paused_since %v of a new pause, want later than the first pause's %v", got, first)
	}
}
