package consumer_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testenv"
)

// awaitOffsetCommitThenDie returns the hooks of the child consumer's
// "before-commit-await-offset-commit" crash point: the first batch reaching
// offset crashOffsetEnv waits, just before its COMMIT, until the group's
// committed offset of its partition, polled from the broker, has reached
// the batch's first offset (the periodic commit of the batches before it
// landed; at most 30 s), then for one more periodic commit, or one second
// when there is nothing left to commit; then the process dies by SIGKILL.
// The crash file holds the batch's first and last offsets and the
// committed offset last read from the broker (-1 when none landed within
// the 30 s).
func awaitOffsetCommitThenDie() consumer.Hooks {
	at, _ := strconv.ParseInt(os.Getenv(crashOffsetEnv), 10, 64)
	var (
		mu      sync.Mutex
		waiting chan int64 // set while the crash batch waits
	)
	return consumer.Hooks{
		BeforeDBCommit: func(ctx context.Context, d consumer.CommitData) {
			first, last := d.FirstOffset, d.LastOffset
			if last < at {
				return
			}
			ch := make(chan int64, 1)
			mu.Lock()
			waiting = ch
			mu.Unlock()
			committed := func() int64 {
				cl, err := kgo.NewClient(kgo.SeedBrokers(os.Getenv("EXACTLY_KAFKA_BROKERS")))
				if err != nil {
					return -1
				}
				defer cl.Close()
				offsets, err := kadm.NewClient(cl).FetchOffsets(ctx, os.Getenv("EXACTLY_GROUP"))
				if err != nil {
					return -1
				}
				if o, ok := offsets.Lookup(d.Topic, d.Partition); ok && o.Err == nil {
					return o.At
				}
				return -1
			}
			seen := committed()
			for deadline := time.Now().Add(30 * time.Second); seen < first; seen = committed() {
				if time.Now().After(deadline) {
					die(fmt.Sprintf("%d %d %d", first, last, int64(-1)))
				}
				time.Sleep(10 * time.Millisecond) // polling the broker for the awaited commit
			}
			select {
			case <-ch:
			case <-time.After(time.Second):
			}
			die(fmt.Sprintf("%d %d %d", first, last, committed()))
		},
		OnOffsetsCommitted: func(_ context.Context, d consumer.OffsetsCommittedData) {
			offsets := d.Offsets
			mu.Lock()
			ch := waiting
			mu.Unlock()
			if ch == nil {
				return
			}
			for _, parts := range offsets {
				for _, off := range parts {
					select {
					case ch <- off:
					default:
					}
				}
			}
		},
	}
}

// A consumer commits offsets every 10 ms and dies (SIGKILL) inside a
// batch's transaction, just before its COMMIT, after a periodic offset
// commit ran while the batch was open: the group's committed offset, read
// from the broker, is not past the batch's first record; the batch's
// records are not in the ledger, and a successor applies them.
func TestCrashAfterPeriodicCommitDuringOpenBatch(t *testing.T) {
	url, pool := urlPool(t)
	setupLedger(t, pool)
	const n, at = 40, 20
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "credits"))
	produceCopies(t, brokers, "credits", n, 1, 1)

	crashFile := filepath.Join(t.TempDir(), "crash")
	wait := startChild(t, childEnv+"=1", crashAtEnv+"=before-commit-await-offset-commit",
		crashOffsetEnv+"="+strconv.Itoa(at), crashFileEnv+"="+crashFile, "DATABASE_URL="+url,
		"EXACTLY_KAFKA_BROKERS="+brokers[0], "EXACTLY_GROUP=crash-trail", "EXACTLY_TOPICS=credits",
		"EXACTLY_BATCH_MAX_RECORDS=5", "EXACTLY_COMMIT_INTERVAL=10ms", "EXACTLY_SESSION_TIMEOUT=6s")
	killedBySIGKILL(t, wait(60*time.Second))
	b, err := os.ReadFile(crashFile)
	if err != nil {
		t.Fatal(err)
	}
	var first, last, seen int64
	if _, err := fmt.Sscanf(string(b), "%d %d %d", &first, &last, &seen); err != nil || first > at || last < at {
		t.Fatalf("crash file %q: want the batch holding offset %d (%v)", b, at, err)
	}
	if seen < 0 {
		t.Fatalf("died in the batch %d..%d with no offset committed within 30 s: the test checked nothing", first, last)
	}
	t.Logf("died in the batch %d..%d; the group's committed offset read during it was %d", first, last, seen)
	if seen > first {
		t.Fatalf("a periodic commit during the open batch %d..%d committed offset %d, past its first record", first, last, seen)
	}

	adm := kadm.NewClient(mustClient(t, brokers))
	defer adm.Close()
	offsets, err := adm.FetchOffsets(context.Background(), "crash-trail")
	if err != nil {
		t.Fatal(err)
	}
	o, ok := offsets.Lookup("credits", 0)
	if !ok || o.Err != nil {
		t.Fatalf("no committed offset for credits/0 (%v): want the batches before offset %d committed", o.Err, first)
	}
	if o.At > first {
		t.Errorf("committed offset %d is past the unfinished batch %d..%d", o.At, first, last)
	}
	if got := count(t, pool, `select count(*) from ledger where off >= $1`, first); got != 0 {
		t.Errorf("%d ledger rows of the batch that died before COMMIT", got)
	}

	out := newOutcomes()
	startConsumer(t, testConfig(brokers, "crash-trail", "credits"), pool,
		consumer.Handle(creditHandler(0)), consumer.WithHooks(out.hooks()))
	out.await(t, 60*time.Second, "the rest applied", func() bool {
		return count(t, pool, `select count(*) from ledger`) == n
	})
	if got := count(t, pool, `select count(distinct order_id) from ledger`); got != n {
		t.Errorf("distinct orders in the ledger = %d, want %d", got, n)
	}
}
