package outbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sync/errgroup"

	"github.com/exactly-go/exactly/internal/runtime/deferred"
	"github.com/exactly-go/exactly/outbox"
)

// listener is a connection LISTENing on an outbox's channel.
type listener struct {
	t    *testing.T
	conn *pgx.Conn
}

func (e *env) listen(t *testing.T, ob *outbox.Outbox) *listener {
	t.Helper()
	ctx := context.Background()
	pc, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn := pc.Hijack()
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "listen "+pgx.Identifier{ob.Channel()}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return &listener{t: t, conn: conn}
}

// next returns the next notification, failing the test after 10s.
func (l *listener) next() *pgconn.Notification {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := l.conn.WaitForNotification(ctx)
	if err != nil {
		l.t.Fatalf("waiting for a notification: %v", err)
	}
	return n
}

// marker notifies channel with payload "marker" in a transaction of its own.
func (e *env) marker(t *testing.T, ob *outbox.Outbox) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), "select pg_notify($1, 'marker')", ob.Channel()); err != nil {
		t.Fatal(err)
	}
}

// TestNoNotifyInWritingTransactions commits a direct Add (keyed and keyless)
// and a consumer-style buffered batch (deferred writes, as the executor does), then
// notifies a marker from another transaction: a listener receives
// notifications in commit order, so the marker must come first. A NOTIFY
// left in addSQL, addNoKeySQL or flushSQL fails this. Then Committed (what
// the executor runs after COMMIT) must send the wake-up notification.
func TestNoNotifyInWritingTransactions(t *testing.T) {
	e := setup(t, 1, "t")
	ctx := context.Background()
	l := e.listen(t, e.ob)

	e.add(t, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("direct")},
		outbox.Message{Topic: "t", Value: []byte("keyless")})
	tx := e.begin(t)
	buf := deferred.New(tx)
	if err := e.ob.Add(deferred.With(ctx, buf), tx, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("batched")}); err != nil {
		t.Fatal(err)
	}
	if err := buf.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.backlog(t); n != 3 {
		t.Fatalf("backlog = %d, want 3", n)
	}
	e.marker(t, e.ob)
	if n := l.next(); n.Payload != "marker" {
		t.Fatalf("first notification %q from pid %d, want the marker: a writing transaction notified", n.Payload, n.PID)
	}
	buf.Committed(e.pool)
	if n := l.next(); n.Payload != "" {
		t.Fatalf("notification after Committed = %q, want the relay's wake-up", n.Payload)
	}
}

// TestRelayWokenInProcess runs a relay whose poll interval is an hour:
// after its first (empty) read only a wake can make it read again. A direct
// Add followed by Wake(nil) (no notification at all) must be published.
func TestRelayWokenInProcess(t *testing.T) {
	e := setup(t, 1, "t")
	e.startHourlyRelay(t)
	e.add(t, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("v")})
	e.ob.Wake(nil)
	e.consume(t, "t").waitFor(1, 10*time.Second)
}

// TestRelayWokenByNotification runs the relay on one Outbox value and wakes
// through another value of the same table, as a writer in another process
// would: the relay must be woken by the notification Wake sends.
func TestRelayWokenByNotification(t *testing.T) {
	e := setup(t, 1, "t")
	e.startHourlyRelay(t)
	other := outbox.New()
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return other.Add(ctx, tx, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("v")})
	}); err != nil {
		t.Fatal(err)
	}
	other.Wake(e.pool)
	e.consume(t, "t").waitFor(1, 10*time.Second)
}

// TestWakeCoalescesNotifications wakes 200 times in a burst: the other
// processes' relays must get one or two notifications (the first at once,
// one more for the rest of the burst), not 200. The marker, sent 100ms
// after the burst, ends the count.
func TestWakeCoalescesNotifications(t *testing.T) {
	e := setup(t, 1, "t")
	l := e.listen(t, e.ob)
	for range 200 {
		e.ob.Wake(e.pool)
	}
	if n := l.next(); n.Payload != "" {
		t.Fatalf("first notification %q, want a wake-up", n.Payload)
	}
	time.Sleep(100 * time.Millisecond) // not synchronisation: bounds the count below
	e.marker(t, e.ob)
	count := 1
	for l.next().Payload != "marker" {
		count++
	}
	if count > 2 {
		t.Fatalf("%d notifications for one burst of 200 wakes, want at most 2", count)
	}
}

// TestRelayPollsSoonAfterRows checks the adaptive poll: with an hour's
// PollInterval and no wake-up at all, a row added right after the relay
// published one must be found within seconds (the relay reads again within
// 5ms after finding rows, backing off from there).
func TestRelayPollsSoonAfterRows(t *testing.T) {
	e := setup(t, 1, "t")
	cfg := e.fastConfig(t)
	cfg.PollInterval = time.Hour
	published := make(chan struct{}, 16)
	cfg.Hooks.OnPublished = func(int, []time.Duration) {
		select {
		case published <- struct{}{}:
		default:
		}
	}
	e.add(t, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("1")})
	e.startRelay(t, cfg)
	<-published
	e.add(t, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("2")})
	select {
	case <-published:
	case <-time.After(5 * time.Second):
		t.Fatal("a row added after a busy read was not found within 5s without a wake-up")
	}
}

// TestWakeSkipsNotificationWhileRelayActiveHere runs the active relay from
// e.ob: a Wake of e.ob then wakes it in-process and sends no notification
// (the marker, sent after, arrives first), while a Wake of another value of
// the same table still notifies.
func TestWakeSkipsNotificationWhileRelayActiveHere(t *testing.T) {
	e := setup(t, 1, "t")
	cfg := e.fastConfig(t)
	active := make(chan bool, 4)
	cfg.Hooks.OnActive = func(a bool) { active <- a }
	polled := make(chan int, 1)
	cfg.Hooks.OnPoll = func(n int) {
		select {
		case polled <- n:
		default:
		}
	}
	e.startRelay(t, cfg)
	if !<-active {
		t.Fatal("relay reported inactive first")
	}
	<-polled // listening: the first read follows LISTEN
	l := e.listen(t, e.ob)
	e.ob.Wake(e.pool)
	e.marker(t, e.ob)
	if n := l.next(); n.Payload != "marker" {
		t.Fatalf("first notification %q, want the marker: Wake notified although the active relay is woken in-process", n.Payload)
	}
	outbox.New().Wake(e.pool)
	if n := l.next(); n.Payload != "" {
		t.Fatalf("notification %q, want the wake-up of another Outbox value", n.Payload)
	}
}

// insertParked writes a parked row straight into the table, as the relay
// would have left it.
func (e *env) insertParked(t *testing.T, topic string, key, value []byte) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), `insert into exactly_outbox (topic, key, value, parked_at, park_reason)
values ($1, $2, $3, now(), 'test')`, topic, key, value); err != nil {
		t.Fatal(err)
	}
}

// TestRetryAndDropNotifyOutsideTheirStatement runs Retry and Drop inside a
// transaction, commits it, then notifies a marker: a listener receives
// notifications in commit order, so the marker must come first (a pg_notify
// inside retrySQL or dropSQL fails this). Run through the pool, each must
// then send the wake-up notification after its statement.
func TestRetryAndDropNotifyOutsideTheirStatement(t *testing.T) {
	e := setup(t, 1, "t")
	ctx := context.Background()
	l := e.listen(t, e.ob)
	for _, k := range []string{"r1", "d1", "r2", "d2"} {
		e.insertParked(t, "t", []byte(k), []byte("v"))
	}
	tx := e.begin(t)
	if got, err := e.ob.Retry(ctx, tx, outbox.ParkFilter{Key: []byte("r1")}); err != nil || len(got) != 1 {
		t.Fatalf("Retry in a transaction = %+v, %v; want one row", got, err)
	}
	if got, err := e.ob.Drop(ctx, tx, outbox.ParkFilter{Key: []byte("d1")}); err != nil || len(got) != 1 {
		t.Fatalf("Drop in a transaction = %+v, %v; want one row", got, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.marker(t, e.ob)
	if n := l.next(); n.Payload != "marker" {
		t.Fatalf("first notification %q, want the marker: Retry or Drop notified inside its statement", n.Payload)
	}
	if got, err := e.ob.Retry(ctx, e.pool, outbox.ParkFilter{Key: []byte("r2")}); err != nil || len(got) != 1 {
		t.Fatalf("Retry = %+v, %v; want one row", got, err)
	}
	if n := l.next(); n.Payload != "" {
		t.Fatalf("notification after Retry = %q, want the relay's wake-up", n.Payload)
	}
	if got, err := e.ob.Drop(ctx, e.pool, outbox.ParkFilter{Key: []byte("d2")}); err != nil || len(got) != 1 {
		t.Fatalf("Drop = %+v, %v; want one row", got, err)
	}
	if n := l.next(); n.Payload != "" {
		t.Fatalf("notification after Drop = %q, want the relay's wake-up", n.Payload)
	}
}

// TestRetryAndDropWakeTheRelay runs a relay whose poll interval is an hour,
// so that after its first read only a wake makes it read again. Retry
// through another Outbox value (as "exactly outbox retry" in another
// process) must wake it by notification; Drop through the relay's own value
// must wake it in-process (no notification is sent while it is active).
func TestRetryAndDropWakeTheRelay(t *testing.T) {
	e := setup(t, 1, "t")
	ctx := context.Background()
	e.insertParked(t, "t", []byte("r"), []byte("retried"))
	e.insertParked(t, "t", []byte("d"), []byte("dropped"))
	e.add(t, outbox.Message{Topic: "t", Key: []byte("d"), Value: []byte("held")})
	e.startHourlyRelay(t) // every row is parked or held
	c := e.consume(t, "t")
	if got, err := outbox.New().Retry(ctx, e.pool, outbox.ParkFilter{Key: []byte("r")}); err != nil || len(got) != 1 {
		t.Fatalf("Retry = %+v, %v; want one row", got, err)
	}
	if recs := c.waitFor(1, 10*time.Second); string(recs[0].Value) != "retried" {
		t.Fatalf("published %q, want retried", recs[0].Value)
	}
	if got, err := e.ob.Drop(ctx, e.pool, outbox.ParkFilter{Key: []byte("d")}); err != nil || len(got) != 1 {
		t.Fatalf("Drop = %+v, %v; want one row", got, err)
	}
	if recs := c.waitFor(2, 10*time.Second); string(recs[1].Value) != "held" {
		t.Fatalf("published %q, want held", recs[1].Value)
	}
}

// startHourlyRelay starts a relay that polls only once an hour and returns
// after its first read, which must find nothing to publish: from then on
// only a wake (in-process, or a notification) makes it read again.
func (e *env) startHourlyRelay(t *testing.T) {
	t.Helper()
	cfg := e.fastConfig(t)
	cfg.PollInterval = time.Hour
	polled := make(chan int, 16)
	cfg.Hooks.OnPoll = func(n int) {
		select {
		case polled <- n:
		default:
		}
	}
	e.startRelay(t, cfg)
	if n := <-polled; n != 0 {
		t.Fatalf("first read found %d rows, want 0", n)
	}
}

// Every commit is followed by a wake-up notification, however writers
// interleave the ways they wake the relays: a transaction that carries
// the notification after its COMMIT (QueueNotify, then the returned
// function), one whose carried notification failed (Wake instead), one
// that claimed the notification and rolled back (its claim is void), and
// one that calls Wake after its COMMIT. Each writer's transaction
// notifies its own payload in its commit; a listener receives
// notifications in commit order, so a wake-up notification after a
// commit's payload was sent after that commit, and the relays reading on
// it see the commit's rows. In each of many rounds, concurrent writers
// commit bursts of random size, spacing and kind, and the round ends only
// when a wake-up notification follows every one of its commits; a commit
// left uncovered (a lost wake) ends nothing, and fails the test after 5
// seconds.
func TestEveryCommitIsFollowedByAWakeUp(t *testing.T) {
	e := setup(t, 1, "t")
	ctx := context.Background()
	l := e.listen(t, e.ob)
	got := make(chan string, 1024)
	lctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := l.conn.WaitForNotification(lctx)
			if err != nil {
				return
			}
			got <- n.Payload
		}
	}()
	t.Cleanup(func() { stop(); <-done })

	ch := e.ob.Channel()
	commit := func(payload string, kind int) error {
		b := &pgx.Batch{}
		b.Queue("begin")
		b.Queue("select pg_notify($1, $2)", ch, payload)
		switch kind {
		case 0: // carries the notification after its COMMIT
			b.Queue("commit")
			notified := e.ob.QueueNotify(b)
			if err := e.pool.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			if notified != nil {
				// A caller slow to report its COMMIT: wakes of commits
				// after the notification ran must stay pending.
				time.Sleep(2 * time.Millisecond)
				notified()
			} else {
				e.ob.Wake(e.pool)
			}
		case 1: // its carried notification failed: the claim is taken, the statement never runs
			b.Queue("commit")
			notified := e.ob.QueueNotify(&pgx.Batch{})
			if err := e.pool.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			_ = notified // not called: the notification did not run
			e.ob.Wake(e.pool)
		case 2: // claimed, then rolled back: no commit, nothing to wake
			b.Queue("rollback")
			e.ob.QueueNotify(&pgx.Batch{})
			return e.pool.SendBatch(ctx, b).Close()
		default: // Wake after COMMIT
			b.Queue("commit")
			if err := e.pool.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			e.ob.Wake(e.pool)
		}
		return nil
	}

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for round := range 12 {
		writers, perWriter := 1+rng.IntN(4), 1+rng.IntN(6)
		kinds := make([][]int, writers)
		gaps := make([][]time.Duration, writers)
		committed := 0
		for w := range writers {
			for range perWriter {
				k := rng.IntN(4)
				kinds[w] = append(kinds[w], k)
				gaps[w] = append(gaps[w], time.Duration(rng.IntN(4000))*time.Microsecond)
				if k != 2 {
					committed++
				}
			}
		}
		var g errgroup.Group
		for w := range writers {
			g.Go(func() error {
				for i, k := range kinds[w] {
					time.Sleep(gaps[w][i]) // spacing of the workload, not synchronisation
					if err := commit(fmt.Sprintf("commit-%d-%d-%d", round, w, i), k); err != nil {
						return err
					}
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		if committed == 0 {
			continue // every writer rolled back: nothing to wake
		}
		seen := 0
		deadline := time.After(5 * time.Second)
	round:
		for {
			select {
			case p := <-got:
				switch {
				case strings.HasPrefix(p, fmt.Sprintf("commit-%d-", round)):
					seen++
				case strings.HasPrefix(p, "commit-"):
					t.Fatalf("round %d: notification %q of another round", round, p)
				case p == "" && seen == committed:
					break round
				}
			case <-deadline:
				t.Fatalf("round %d (%d writers, kinds %v): %d of %d commits seen and no wake-up notification after the last within 5s",
					round, writers, kinds, seen, committed)
			}
		}
		// Rounds start in every state the waker can be in: right after a
		// notification, while transactions carry them, and after that lapsed.
		time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
	}
}
