package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
)

// heldRow is a row of exactly_guard_held.
type heldRow struct {
	group, topic       string
	partition          int32
	offset             int64
	scope, key         *string
	handler, lastError string
	attempts           int
	heldFor, retryIn   time.Duration
}

// heldRows reads exactly_guard_held.
func heldRows(t testing.TB, pool *pgxpool.Pool) []heldRow {
	t.Helper()
	rows, err := pool.Query(context.Background(), `select consumer_group, topic, partition, record_offset, scope, key, handler, last_error, attempts,
	(extract(epoch from now() - held_since) * 1e6)::bigint, (extract(epoch from retry_at - now()) * 1e6)::bigint
from exactly_guard_held order by 1, 2, 3, 4`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (heldRow, error) {
		var h heldRow
		var heldFor, retryIn int64
		err := r.Scan(&h.group, &h.topic, &h.partition, &h.offset, &h.scope, &h.key, &h.handler, &h.lastError, &h.attempts, &heldFor, &retryIn)
		h.heldFor, h.retryIn = time.Duration(heldFor)*time.Microsecond, time.Duration(retryIn)*time.Microsecond
		return h, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// awaitRow polls what until cond holds of its rows, failing t after
// timeout; it returns the rows that satisfied cond.
func awaitRows[T any](t testing.TB, timeout time.Duration, what string, read func() []T, cond func([]T) bool) []T {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		rows := read()
		if cond(rows) {
			return rows
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; rows: %+v", timeout, what, rows)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// secretJob is heldJob whose held record's error names a connection
// string with a password, which its held row must not keep.
func secretJob(held string, release <-chan struct{}, attempts *atomic.Int32) *handler.Handler[job] {
	return failingJob(held, "try again later: postgres://app:hunter2@db.internal/app is down", release, attempts)
}

// A record whose handler fails is listed in the held table, with its
// group, partition, offset, scope, dedupe key, handler, attempts (rising
// with each failure), its last error (the password in it redacted) and a
// retry time, while it is held; the row goes once the record succeeded.
// With key concurrency and without (its sequential path).
func TestHeldRecordIsListedUntilItSucceeds(t *testing.T) {
	for _, kc := range []int{64, 1} {
		t.Run(fmt.Sprintf("key_concurrency=%d", kc), func(t *testing.T) {
			pool := testenv.DB(t)
			setupJobs(t, pool)
			brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
			recs := []*kgo.Record{jobRecord("k0", job{ID: "0"}), jobRecord("A", job{ID: "a0"})}
			for i := 1; i < 5; i++ {
				recs = append(recs, jobRecord(fmt.Sprintf("k%d", i), job{ID: fmt.Sprint(i)}))
			}
			testenv.Produce(t, brokers, recs...)

			var attempts atomic.Int32
			release := make(chan struct{})
			o := newOutcomes()
			cfg := testConfig(brokers, "held-rows", "jobs")
			cfg.KeyConcurrency = kc
			cfg.RetryBackoff, cfg.RetryBackoffMax = 50*time.Millisecond, time.Second
			startConsumer(t, cfg, pool, consumer.Handle(secretJob("a0", release, &attempts)), consumer.WithHooks(o.hooks()))
			rows := awaitRows(t, 60*time.Second, "a held row of offset 1 after 3 attempts", func() []heldRow { return heldRows(t, pool) },
				func(rs []heldRow) bool { return len(rs) == 1 && rs[0].attempts >= 3 })
			h := rows[0]
			if h.group != "held-rows" || h.topic != "jobs" || h.partition != 0 || h.offset != 1 || h.handler != "jobs" {
				t.Errorf("held row %+v, want group held-rows, jobs/0 offset 1, handler jobs", h)
			}
			if h.scope == nil || *h.scope != "jobs" || h.key == nil || *h.key != "job:a0" {
				t.Errorf("held row scope %v key %v, want jobs and job:a0", h.scope, h.key)
			}
			if !strings.Contains(h.lastError, "try again later") || strings.Contains(h.lastError, "hunter2") {
				t.Errorf("held row's last error %q: want the handler's error, its password redacted", h.lastError)
			}
			if h.retryIn > time.Second+time.Second/2 || h.heldFor < 0 {
				t.Errorf("held row: retry in %v (backoff max 1s), held for %v", h.retryIn, h.heldFor)
			}
			if n := count(t, pool, `select count(*) from exactly_guard_paused`); n != 0 {
				t.Errorf("%d paused rows while one record is held within the bounds", n)
			}

			close(release)
			o.await(t, 60*time.Second, "every record applied", func() bool { return o.get("applied") >= len(recs) })
			// Its deletion is queued before the record's outcome is
			// reported, and written by the partition's writer of wait rows.
			awaitRows(t, 30*time.Second, "no held row after the record succeeded", func() []heldRow { return heldRows(t, pool) },
				func(rs []heldRow) bool { return len(rs) == 0 })
		})
	}
}

// A partition paused at MaxOffsetGap behind a held record is listed in the
// paused table (reason offset_gap, its lowest unfinished offset) while it
// is paused, and no longer once it resumed.
func TestPausedPartitionIsListedUntilItResumes(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	recs := []*kgo.Record{jobRecord("A", job{ID: "a0"})}
	for i := range 30 {
		recs = append(recs, jobRecord(fmt.Sprintf("k%d", i), job{ID: fmt.Sprint(i)}))
	}
	testenv.Produce(t, brokers, recs...)

	type pausedRow struct {
		group, topic, reason, handler string
		partition                     int32
		lowest                        int64
	}
	paused := func() []pausedRow {
		rows, err := pool.Query(context.Background(), `select consumer_group, topic, partition, reason, lowest_unfinished, handler from exactly_guard_paused`)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pausedRow, error) {
			var p pausedRow
			return p, r.Scan(&p.group, &p.topic, &p.partition, &p.reason, &p.lowest, &p.handler)
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	var attempts atomic.Int32
	release := make(chan struct{})
	o := newOutcomes()
	cfg := testConfig(brokers, "paused-rows", "jobs")
	cfg.MaxOffsetGap = 10
	startConsumer(t, cfg, pool, consumer.Handle(heldJob("a0", release, &attempts)), consumer.WithHooks(o.hooks()))
	rows := awaitRows(t, 60*time.Second, "a paused row", paused, func(rs []pausedRow) bool { return len(rs) > 0 })
	want := pausedRow{group: "paused-rows", topic: "jobs", partition: 0, reason: "offset_gap", lowest: 0, handler: "jobs"}
	if len(rows) != 1 || rows[0] != want {
		t.Errorf("paused rows %+v, want [%+v]", rows, want)
	}
	if got := count(t, pool, `select count(*) from applied where off >= 10`); got != 0 {
		t.Errorf("%d records past the offset gap applied while the paused row is listed", got)
	}
	close(release)
	o.await(t, 60*time.Second, "every record applied", func() bool { return o.get("applied") >= len(recs) })
	awaitRows(t, 30*time.Second, "no paused row after the partition resumed", paused, func(rs []pausedRow) bool { return len(rs) == 0 })
}

// The rows of a partition are deleted when its owner stops (revoke at
// shutdown) and, for rows a killed process left, when the partition is
// assigned to the next owner.
func TestWaitRowsOfARevokedPartitionAreCleared(t *testing.T) {
	for _, kc := range []int{64, 1} {
		t.Run(fmt.Sprintf("key_concurrency=%d", kc), func(t *testing.T) {
			pool := testenv.DB(t)
			setupJobs(t, pool)
			brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
			testenv.Produce(t, brokers, jobRecord("A", job{ID: "a0"}), jobRecord("k", job{ID: "1"}))
			ctx := context.Background()
			// What a killed owner left: a held row and a paused row of
			// jobs/0, and a held row of another group that must stay.
			for _, q := range []string{
				`insert into exactly_guard_held (consumer_group, topic, partition, record_offset, handler, attempts, last_error, retry_at)
values ('revoked-rows', 'jobs', 0, 999, 'jobs', 7, 'left by a killed process', now())`,
				`insert into exactly_guard_held (consumer_group, topic, partition, record_offset, handler, attempts, last_error, retry_at)
values ('other-group', 'jobs', 0, 999, 'jobs', 7, 'another group''s', now())`,
				`insert into exactly_guard_paused (consumer_group, topic, partition, reason, lowest_unfinished, handler)
values ('revoked-rows', 'jobs', 0, 'held_limit', 999, 'jobs')`,
			} {
				if _, err := pool.Exec(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			var attempts atomic.Int32
			release := make(chan struct{})
			defer close(release)
			cfg := testConfig(brokers, "revoked-rows", "jobs")
			cfg.KeyConcurrency = kc
			stop := startConsumer(t, cfg, pool, consumer.Handle(heldJob("a0", release, &attempts)))
			own := func() []heldRow {
				var rs []heldRow
				for _, h := range heldRows(t, pool) {
					if h.group == "revoked-rows" {
						rs = append(rs, h)
					}
				}
				return rs
			}
			awaitRows(t, 60*time.Second, "the held row of offset 0 alone (the killed owner's row cleared)", own,
				func(rs []heldRow) bool { return len(rs) == 1 && rs[0].offset == 0 })
			if n := count(t, pool, `select count(*) from exactly_guard_paused`); n != 0 {
				t.Errorf("the killed owner's paused row is still listed (%d paused rows)", n)
			}
			stop()
			if rs := own(); len(rs) != 0 {
				t.Errorf("held rows of the group after its member stopped: %+v", rs)
			}
			if n := count(t, pool, `select count(*) from exactly_guard_held where consumer_group = 'other-group'`); n != 1 {
				t.Errorf("another group's held row was deleted (%d left)", n)
			}
		})
	}
}

// With KeyConcurrency 2 and the records of two keys failing, the
// partition pauses at the held limit: its paused row says held_limit, and
// goes once the records succeed.
func TestHeldLimitPauseIsListed(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	recs := []*kgo.Record{jobRecord("A", job{ID: "a0"}), jobRecord("B", job{ID: "b0"})}
	for i := range 5 {
		recs = append(recs, jobRecord(fmt.Sprintf("k%d", i), job{ID: fmt.Sprint(i)}))
	}
	testenv.Produce(t, brokers, recs...)
	release := make(chan struct{})
	h := handler.New("jobs", jobKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[job]) error {
		if msg.Value.ID == "a0" || msg.Value.ID == "b0" {
			select {
			case <-release:
			default:
				return errors.New("try again later")
			}
		}
		return insertJob(ctx, tx, msg, "")
	})
	o := newOutcomes()
	cfg := testConfig(brokers, "held-limit", "jobs")
	cfg.KeyConcurrency = 2
	startConsumer(t, cfg, pool, consumer.Handle(h), consumer.WithHooks(o.hooks()))
	reason := func() []string {
		rows, err := pool.Query(context.Background(), `select reason from exactly_guard_paused where consumer_group = 'held-limit'`)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	awaitRows(t, 60*time.Second, "a held_limit paused row", reason, func(rs []string) bool { return len(rs) == 1 && rs[0] == "held_limit" })
	if n := len(heldRows(t, pool)); n != 2 {
		t.Errorf("%d held rows, want 2", n)
	}
	close(release)
	o.await(t, 60*time.Second, "every record applied", func() bool { return o.get("applied") >= len(recs) })
	awaitRows(t, 30*time.Second, "no paused row after the held records succeeded", reason, func(rs []string) bool { return len(rs) == 0 })
}

// While the held table is locked from another connection (access
// exclusive: every write of a held row waits, up to its 2 s bound), a
// record of key A fails attempt after attempt, and records of other keys,
// produced one at a time on the same partition, each commit while A is
// held, all within far less than a held-row write per record would take:
// the dispatcher only queues the wait rows and never waits for their
// writes. Once the lock is released, A's held row appears (its latest
// attempt); once A succeeds, it goes; once the consumer stopped, no writer
// of wait rows is left running.
func TestStuckWaitRowWriteDoesNotHoldOtherKeys(t *testing.T) {
	pool := testenv.DB(t)
	setupJobs(t, pool)
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "jobs"))
	ctx := context.Background()

	var attempts atomic.Int32
	release := make(chan struct{})
	o := newOutcomes()
	cfg := testConfig(brokers, "stuck-wait-rows", "jobs")
	cfg.RetryBackoff, cfg.RetryBackoffMax = 10*time.Millisecond, 10*time.Millisecond
	stop := startConsumer(t, cfg, pool, consumer.Handle(heldJob("a0", release, &attempts)), consumer.WithHooks(o.hooks()))
	producer := mustClient(t, brokers)
	defer producer.Close()
	produce := func(r *kgo.Record) {
		t.Helper()
		if err := producer.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// A record of another key first, so that the consumer owns the
	// partition (and its owner cleared its rows) before the lock.
	produce(jobRecord("W", job{ID: "w"}))
	o.await(t, 60*time.Second, "the first record applied", func() bool { return o.get("applied") == 1 })

	lockConn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lockConn.Release()
	lock, err := lockConn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, `lock table exactly_guard_held in access exclusive mode`); err != nil {
		t.Fatal(err)
	}
	produce(jobRecord("A", job{ID: "a0"})) // offset 1
	o.await(t, 60*time.Second, "3 failed attempts of A", func() bool { return attempts.Load() >= 3 })
	// Each record of another key comes after A failed again (A's backoff is
	// 10 ms): a dispatcher that waits for A's held row, up to 2 s each
	// time, takes at least 16 s for these 8.
	const others = 8
	within := 8 * time.Second
	deadline := time.Now().Add(within)
	before := attempts.Load()
	for i := range others {
		produce(jobRecord(fmt.Sprintf("k%d", i), job{ID: fmt.Sprint(i)}))
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("%d of %d records of other keys committed in %v while A is held and the held table locked", i, others, within)
		}
		o.await(t, left, fmt.Sprintf("record %d of %d of other keys to commit within %v while A is held and the held table locked", i+1, others, within),
			func() bool { return o.get("applied") == 2+i })
	}
	t.Logf("%d records of other keys committed in %v with the held table locked; A failed %d more attempts meanwhile",
		others, within-time.Until(deadline), attempts.Load()-before)
	if got := count(t, pool, `select count(*) from applied where id = 'a0'`); got != 0 {
		t.Errorf("A applied while it fails")
	}

	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	lockConn.Release()
	rows := awaitRows(t, 30*time.Second, "A's held row once the held table is unlocked", func() []heldRow { return heldRows(t, pool) },
		func(rs []heldRow) bool { return len(rs) == 1 && rs[0].offset == 1 && rs[0].attempts > int(before) })
	if h := rows[0]; h.key == nil || *h.key != "job:a0" || h.group != "stuck-wait-rows" {
		t.Errorf("held row %+v, want A's (job:a0) of group stuck-wait-rows", h)
	}
	close(release)
	o.await(t, 60*time.Second, "A applied", func() bool { return o.get("applied") == 2+others })
	awaitRows(t, 30*time.Second, "no held row once A succeeded", func() []heldRow { return heldRows(t, pool) },
		func(rs []heldRow) bool { return len(rs) == 0 })
	stop()
	if n := waitWriters(); n != 0 {
		t.Errorf("%d writers of wait rows still running after the consumer stopped", n)
	}
}

// waitWriters counts the goroutines running a writer of wait rows.
func waitWriters() int {
	n, _ := testenv.CountGoroutines("consumer.(*waitWriter).run(", "")
	return n
}
