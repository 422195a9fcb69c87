package outbox

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// notifyInterval is the shortest time between two notifications one Outbox
// sends on its channel: wakes in between are coalesced into one
// notification sent when the interval ends.
const notifyInterval = 5 * time.Millisecond

// notifyTimeout bounds one notification; a lost one only delays the relays
// of other processes until their next poll.
const notifyTimeout = 5 * time.Second

// notifySQL notifies in its own (autocommit) transaction, never a writing
// one. PostgreSQL serialises the commits of notifying transactions on a
// cluster-wide lock held through the commit's WAL flush; this transaction
// writes nothing and, with synchronous_commit off for itself, does not wait
// for the flush, so it holds that lock only briefly. A notification lost in
// a server crash costs a relay one poll interval.
const notifySQL = `select set_config('synchronous_commit', 'off', true), pg_notify($1, '')`

// waker wakes the relays of one Outbox value: those built from the same
// value in this process at once (through a channel closed on every wake),
// and those in other processes (or built from another Outbox value) through
// a notification on the table's channel, sent outside any writing
// transaction, at most once per notifyInterval.
type waker struct {
	channel string

	mu      sync.Mutex
	woken   chan struct{} // closed by the next wake, then replaced
	pool    *pgxpool.Pool // the pool the pending notification goes through
	sending bool          // a notifying goroutine runs
	pending bool          // a wake arrived since that goroutine last notified
	active  int           // relays built from this value that are active
}

func newWaker(channel string) *waker {
	return &waker{channel: channel, woken: make(chan struct{})}
}

// wait returns a channel closed by the next wake. Take it before reading
// the table, so a wake between the read and the wait is not missed.
func (w *waker) wait() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.woken
}

// activate records that a relay built from this value became the table's
// active relay, until release is called: while one is, wakes send no
// notification (the only relay that reads the table is woken in-process).
func (w *waker) activate() (release func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.active++
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.active--
	}
}

// wake wakes this process's relays at once and, when pool is not nil and
// none of them is the active relay, has a notification sent through pool:
// now if none was sent in the last notifyInterval, else once the interval
// ends (one for all the wakes in between). It never blocks on the database.
func (w *waker) wake(pool *pgxpool.Pool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.signalLocked()
	if pool == nil || w.active > 0 {
		return
	}
	w.pool, w.pending = pool, true
	if !w.sending {
		w.sending = true
		go w.notify()
	}
}

// wakeLocal wakes this process's relays at once and reports whether a
// notification is needed for the others: none of this value's relays is
// the table's active relay.
func (w *waker) wakeLocal() (notify bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.signalLocked()
	return w.active == 0
}

// signalLocked ends the current wait (see wait); w.mu is held.
func (w *waker) signalLocked() {
	close(w.woken)
	w.woken = make(chan struct{})
}

// notify sends notifications while wakes keep arriving, at most one per
// notifyInterval, and returns once an interval passed without a wake.
func (w *waker) notify() {
	for {
		w.mu.Lock()
		if !w.pending {
			w.sending = false
			w.mu.Unlock()
			return
		}
		pool := w.pool
		w.pending, w.pool = false, nil
		w.mu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
		// An error (the pool closed, the database down) is not reported:
		// the relays' polling finds the rows.
		_, _ = pool.Exec(ctx, notifySQL, w.channel)
		cancel()
		time.Sleep(notifyInterval)
	}
}

// Wake tells the relays of o's table that rows were committed. Relays built
// from o (RelayConfig.Outbox) in this process read the table at once. When
// pool is not nil and none of them is the table's active relay, the relays
// of other processes (and of other Outbox values) are notified on o's
// channel through pool, in a transaction of its own, at most once every few
// milliseconds however often Wake is called. Wake never blocks on the
// database and cannot fail: a lost wake-up delays publication until the
// relay's next poll (RelayConfig.PollInterval), nothing more.
//
// An exactly consumer calls it after every transaction that added rows to
// o's table, on the Outbox value of the transaction's first Add: share one
// value between your handlers and the relay (consumer.Service's Outbox) for
// the in-process wake; the package-level Add, AddJSON and AddValue (on the
// default table, through a fresh Outbox) wake the relay through the
// notification only. Call it yourself
// after committing a transaction in which you called Add outside a
// consumer. Call it only after COMMIT: called inside the transaction, it
// wakes the relay before the rows are visible.
func (o *Outbox) Wake(pool *pgxpool.Pool) { o.wk().wake(pool) }

// wakeAfter wakes the relays after a statement run through q (Retry, Drop)
// changed what they may publish. Inside a transaction (q a pgx.Tx) it does
// nothing: the caller wakes after COMMIT. Otherwise the statement has
// committed: it wakes o's relays in this process and, when none of them is
// active, notifies through q at once, in a statement of its own, rather
// than in the background as Wake does, so that a command that exits right
// after ("exactly outbox retry") does not lose the notification. A failed
// notification is ignored: the relays' polling finds the rows.
func (o *Outbox) wakeAfter(ctx context.Context, q Querier) {
	if _, inTx := q.(pgx.Tx); inTx {
		return
	}
	if !o.wk().wakeLocal() {
		return
	}
	nctx, cancel := context.WithTimeout(ctx, notifyTimeout)
	defer cancel()
	_, _ = q.Exec(nctx, notifySQL, o.channel)
}
