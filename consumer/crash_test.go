package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// Crash points of the child processes (see runChildConsumer, runChildRelay).
const (
	// crashAtEnv selects the child consumer's crash point: "before-commit"
	// (the first batch reaching offset crashOffsetEnv, just before its
	// COMMIT), "before-commit-await-offset-commit" (the same, after a
	// periodic offset commit; see awaitOffsetCommitThenDie) or "revoke" (in
	// the revoke callback, after in-flight work and before the offset
	// commit).
	crashAtEnv     = "EXACTLY_TEST_CRASH_AT"
	crashOffsetEnv = "EXACTLY_TEST_CRASH_OFFSET"
	// crashFileEnv names the file where the child writes where it died.
	crashFileEnv = "EXACTLY_TEST_CRASH_FILE"
	// relayChildEnv makes the test binary a relay that dies after its first
	// acknowledged batch, before deleting its rows.
	relayChildEnv = "EXACTLY_TEST_CHILD_RELAY"
)

// die writes what to the crash file and kills the process with SIGKILL: a
// real death, no deferred function, no graceful shutdown, no offset commit.
func die(what string) {
	if f := os.Getenv(crashFileEnv); f != "" {
		_ = os.WriteFile(f, []byte(what), 0o600)
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is not deliverable to a blocked handler: wait for it
}

// crashHooks returns the child consumer's hooks for crashAtEnv.
func crashHooks() consumer.Hooks {
	switch os.Getenv(crashAtEnv) {
	case "before-commit":
		at, _ := strconv.ParseInt(os.Getenv(crashOffsetEnv), 10, 64)
		return consumer.Hooks{BeforeDBCommit: func(_ context.Context, d consumer.CommitData) {
			first, last := d.FirstOffset, d.LastOffset
			if last >= at {
				die(fmt.Sprintf("%d %d", first, last))
			}
		}}
	case "before-commit-await-offset-commit":
		return awaitOffsetCommitThenDie()
	case "revoke":
		return consumer.Hooks{OnRevoke: func(_ context.Context, d consumer.RevokeData) {
			revoked := d.Revoked
			if len(revoked) > 0 {
				die("revoke")
			}
		}}
	}
	return consumer.Hooks{}
}

// startChild starts the test binary as a child process with env added
// (the child runs no tests: TestMain dispatches on the env). It is killed
// when t ends, if still alive.
func startChild(t *testing.T, env ...string) (wait func(timeout time.Duration) *os.ProcessState) {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), env...)
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = child.Wait(); close(exited) }()
	t.Cleanup(func() { _ = child.Process.Kill(); <-exited })
	return func(timeout time.Duration) *os.ProcessState {
		t.Helper()
		select {
		case <-exited:
			return child.ProcessState
		case <-time.After(timeout):
			t.Fatalf("child process did not die within %v", timeout)
			return nil
		}
	}
}

// killedBySIGKILL fails t unless ps is a death by SIGKILL.
func killedBySIGKILL(t *testing.T, ps *os.ProcessState) {
	t.Helper()
	ws, ok := ps.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want death by SIGKILL at the crash point", ps)
	}
}

// urlPool opens a pool on a fresh database whose URL a child can use too.
func urlPool(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := testenv.DBURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return url, pool
}

// A consumer process dies (SIGKILL) inside a batch's transaction, just
// before COMMIT: that batch's effects and guard rows are gone with it; the
// batches before it are kept; the successor applies exactly the rest and
// skips the kept ones as duplicates.
func TestCrashBeforeDBCommit(t *testing.T) {
	url, pool := urlPool(t)
	setupLedger(t, pool)
	const n = 40
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "credits"))
	produceCopies(t, brokers, "credits", n, 1, 1)

	crashFile := filepath.Join(t.TempDir(), "crash")
	wait := startChild(t, childEnv+"=1", crashAtEnv+"=before-commit", crashOffsetEnv+"="+strconv.Itoa(n/2),
		crashFileEnv+"="+crashFile, "DATABASE_URL="+url, "EXACTLY_KAFKA_BROKERS="+brokers[0],
		"EXACTLY_GROUP=crash-before", "EXACTLY_TOPICS=credits", "EXACTLY_BATCH_MAX_RECORDS=5",
		"EXACTLY_COMMIT_INTERVAL=1h", "EXACTLY_SESSION_TIMEOUT=6s")
	killedBySIGKILL(t, wait(60*time.Second))
	b, err := os.ReadFile(crashFile)
	if err != nil {
		t.Fatal(err)
	}
	var first, last int
	if _, err := fmt.Sscanf(string(b), "%d %d", &first, &last); err != nil || first > n/2 || last < n/2 {
		t.Fatalf("crash file %q: want the batch holding offset %d (%v)", b, n/2, err)
	}
	// Offsets 0..first-1 committed (one partition, in order); the batch
	// that died did not.
	if got := count(t, pool, `select count(*) from ledger`); got != first {
		t.Errorf("after the crash: ledger rows = %d, want %d (the batches before offset %d)", got, first, first)
	}
	if got := count(t, pool, `select count(*) from ledger where off >= $1`, first); got != 0 {
		t.Errorf("after the crash: %d ledger rows of the uncommitted batch", got)
	}
	if got := count(t, pool, `select count(*) from exactly_guard`); got != first {
		t.Errorf("after the crash: guard rows = %d, want %d", got, first)
	}

	o := newOutcomes()
	startConsumer(t, testConfig(brokers, "crash-before", "credits"), pool,
		consumer.Handle(creditHandler(0)), consumer.WithHooks(o.hooks()))
	o.await(t, 60*time.Second, "every record", func() bool { return o.total() >= n })
	if a, d := o.get("applied"), o.get("duplicate"); a != n-first || d != first {
		t.Errorf("successor: applied=%d duplicate=%d, want %d and %d", a, d, n-first, first)
	}
	if got := count(t, pool, `select count(*) from ledger`); got != n {
		t.Errorf("ledger rows = %d, want %d", got, n)
	}
	if got := count(t, pool, `select count(distinct order_id) from ledger`); got != n {
		t.Errorf("distinct orders in the ledger = %d, want %d", got, n)
	}
	if got := count(t, pool, `select count(*) from exactly_guard`); got != n {
		t.Errorf("guard rows = %d, want %d", got, n)
	}
	o.checkCommitsTrail(t)
}

// A member dies (SIGKILL) in its revoke callback, after its transactions
// committed and before it commits their offsets, when a second member
// joins: the second member gets every partition, every record again, and
// applies none of them twice.
func TestCrashDuringRevoke(t *testing.T) {
	url, pool := urlPool(t)
	setupLedger(t, pool)
	const parts, n = 4, 80
	brokers := testenv.Brokers(testenv.Kafka(t, parts, "credits"))
	produceCopies(t, brokers, "credits", n, 1, parts)

	crashFile := filepath.Join(t.TempDir(), "crash")
	wait := startChild(t, childEnv+"=1", crashAtEnv+"=revoke", crashFileEnv+"="+crashFile,
		"DATABASE_URL="+url, "EXACTLY_KAFKA_BROKERS="+brokers[0], "EXACTLY_GROUP=crash-revoke",
		"EXACTLY_TOPICS=credits", "EXACTLY_COMMIT_INTERVAL=1h", "EXACTLY_SESSION_TIMEOUT=6s")
	o := newOutcomes()
	o.await(t, 60*time.Second, "the child to commit every record to the database", func() bool {
		return count(t, pool, `select count(*) from ledger`) == n
	})

	// The second member's join makes the group take partitions from the
	// child, whose revoke callback kills it.
	startConsumer(t, testConfig(brokers, "crash-revoke", "credits"), pool,
		consumer.Handle(creditHandler(0)), consumer.WithHooks(o.hooks()))
	killedBySIGKILL(t, wait(60*time.Second))
	if b, err := os.ReadFile(crashFile); err != nil || string(b) != "revoke" {
		t.Fatalf("crash file: %q, %v; want the child to die in its revoke callback", b, err)
	}
	o.await(t, 90*time.Second, "every record redelivered", func() bool { return o.total() >= n })
	if a, d := o.get("applied"), o.get("duplicate"); a != 0 || d != n {
		t.Errorf("survivor: applied=%d duplicate=%d, want 0 and %d", a, d, n)
	}
	if got := count(t, pool, `select count(*) from ledger`); got != n {
		t.Errorf("ledger rows = %d, want %d", got, n)
	}
	if got := count(t, pool, `select count(*) from exactly_guard`); got != n {
		t.Errorf("guard rows = %d, want %d", got, n)
	}
	o.checkCommitsTrail(t)
}

// runChildRelay is the relay process TestRelayCrashAfterAckBeforeDelete
// kills: after its first batch is acknowledged by the broker, and before
// the batch's rows are deleted, it writes the rows' ids to the crash file
// and dies by SIGKILL.
func runChildRelay() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	relay, err := outbox.NewRelay(pool, strings.Split(os.Getenv("EXACTLY_KAFKA_BROKERS"), ","), outbox.RelayConfig{
		BatchSize: 10,
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Hooks: outbox.RelayHooks{AfterAck: func(_ context.Context, ids []int64) error {
			s := make([]string, len(ids))
			for i, id := range ids {
				s[i] = strconv.FormatInt(id, 10)
			}
			die(strings.Join(s, " "))
			return nil
		}},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := relay.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	return 1 // Run returns only on error here: the hook never returns
}

// The relay process dies between the broker's ack and the delete of the
// rows: the rows stay, the next relay publishes them again with the same
// message ids, and a downstream exactly consumer keyed on the message id
// records one effect per event.
func TestRelayCrashAfterAckBeforeDelete(t *testing.T) {
	url, pool := urlPool(t)
	setupLedger(t, pool)
	ctx := context.Background()
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `create table notifications(message_id text primary key, order_id text not null)`); err != nil {
		t.Fatal(err)
	}
	const n = 30
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "credits", "credited"))
	produceCopies(t, brokers, "credits", n, 1, 1)

	// Upstream: each credit applied once, with its event in the outbox.
	emit := creditEmitter(nil)
	up := newOutcomes()
	stopUp := startConsumer(t, testConfig(brokers, "emit", "credits"), pool, consumer.Handle(emit), consumer.WithHooks(up.hooks()))
	up.await(t, 60*time.Second, "every credit applied", func() bool { return up.get("applied") == n })
	stopUp()
	if got := count(t, pool, `select count(*) from exactly_outbox`); got != n {
		t.Fatalf("outbox rows = %d, want %d", got, n)
	}

	crashFile := filepath.Join(t.TempDir(), "crash")
	wait := startChild(t, relayChildEnv+"=1", crashFileEnv+"="+crashFile, "DATABASE_URL="+url, "EXACTLY_KAFKA_BROKERS="+brokers[0])
	killedBySIGKILL(t, wait(60*time.Second))
	b, err := os.ReadFile(crashFile)
	if err != nil {
		t.Fatal(err)
	}
	acked := map[string]bool{}
	for _, id := range strings.Fields(string(b)) {
		acked[id] = true
	}
	k := len(acked)
	if k == 0 || k > 10 {
		t.Fatalf("the child acknowledged %d rows (%q), want 1..10", k, b)
	}
	if got := count(t, pool, `select count(*) from exactly_outbox`); got != n {
		t.Fatalf("after the crash: outbox rows = %d, want %d (nothing deleted)", got, n)
	}

	// A healthy relay publishes everything, the acked rows again.
	relay, err := outbox.NewRelay(pool, brokers, outbox.RelayConfig{PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); _ = relay.Run(rctx) }()
	t.Cleanup(func() { stopRelay(); <-relayDone; relay.Close() })

	eventuallyZero(t, pool, `select count(*) from exactly_outbox`)
	// Every published record: n distinct message ids, the k acked rows
	// twice, each copy with its first publication's id and value.
	recs := testenv.ReadTopic(t, brokers, "credited", n+k)
	byOutboxID := map[string][]*kgo.Record{}
	ids := map[string]bool{}
	for _, r := range recs {
		oid, mid := recHeader(r, outbox.HeaderOutboxID), recHeader(r, outbox.HeaderMessageID)
		if mid == "" {
			t.Fatalf("record at offset %d has no message id", r.Offset)
		}
		byOutboxID[oid] = append(byOutboxID[oid], r)
		ids[mid] = true
	}
	if len(ids) != n || len(byOutboxID) != n {
		t.Errorf("distinct message ids = %d, outbox ids = %d, want %d", len(ids), len(byOutboxID), n)
	}
	var twice []string
	for oid, rs := range byOutboxID {
		if len(rs) == 1 {
			continue
		}
		twice = append(twice, oid)
		for _, r := range rs[1:] {
			if recHeader(r, outbox.HeaderMessageID) != recHeader(rs[0], outbox.HeaderMessageID) || string(r.Value) != string(rs[0].Value) {
				t.Errorf("outbox row %s republished with another message id or value", oid)
			}
		}
	}
	sort.Strings(twice)
	if len(twice) != k {
		t.Errorf("rows published twice: %v, want the %d acked before the crash (%q)", twice, k, b)
	}
	for _, oid := range twice {
		if !acked[oid] {
			t.Errorf("row %s published twice but was not acked before the crash", oid)
		}
	}

	// Downstream: keyed on the message id, one notification per event.
	notify := handler.New("notify", handler.FromHeader[credit](outbox.HeaderMessageID),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			_, err := tx.Exec(ctx, `insert into notifications(message_id, order_id) values($1,$2)`, msg.Key, msg.Value.OrderID)
			return err
		})
	down := newOutcomes()
	startConsumer(t, testConfig(brokers, "notify", "credited"), pool, consumer.Handle(notify), consumer.WithHooks(down.hooks()))
	down.await(t, 60*time.Second, "every published record", func() bool { return down.total() >= n+k })
	if a, d := down.get("applied"), down.get("duplicate"); a != n || d != k {
		t.Errorf("downstream: applied=%d duplicate=%d, want %d and %d", a, d, n, k)
	}
	if got := count(t, pool, `select count(*) from notifications`); got != n {
		t.Errorf("notifications = %d, want %d", got, n)
	}
	if got := count(t, pool, `select count(*) from exactly_guard where scope = 'notify'`); got != n {
		t.Errorf("downstream guard rows = %d, want %d", got, n)
	}
	if got := count(t, pool, `select count(*) from ledger`); got != n {
		t.Errorf("ledger rows = %d, want %d", got, n)
	}
	if got := count(t, pool, `select count(*) from exactly_guard where scope = 'credit-emit'`); got != n {
		t.Errorf("upstream guard rows = %d, want %d", got, n)
	}
}

func recHeader(r *kgo.Record, name string) string {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if r.Headers[i].Key == name {
			return string(r.Headers[i].Value)
		}
	}
	return ""
}

// eventuallyZero polls sql until it counts 0, failing t after 30 seconds.
func eventuallyZero(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for count(t, pool, sql) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not 0 after 30s", sql)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
