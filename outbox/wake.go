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

// notifyGrace is how long a wake waits for a consumer transaction to
// carry its notification after its COMMIT (see Outbox.QueueNotify) before
// the notifying goroutine sends one itself, while transactions do carry
// them (one was claimed in the last notifyCarried). A commit's
// notification is then sent at most notifyGrace after it, one
// notifyInterval plus a carrying transaction's commit in the usual case.
const notifyGrace = 2 * notifyInterval

// notifyCarried is how recently a transaction must have carried a
// notification for wakes to wait notifyGrace for the next one; otherwise
// (no consumer writes to the table, or none lately) a wake is notified at
// once, as Wake's callers outside a consumer expect.
const notifyCarried = 100 * time.Millisecond

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
	waited  bool          // wait handed out woken since it was made
	pool    *pgxpool.Pool // the pool the pending notification goes through
	sending bool          // a notifying goroutine runs
	pending bool          // a wake arrived that no notification covers yet
	active  int           // relays built from this value that are active
	// since is no later than the first wake no notification covers yet,
	// last the latest wake; claimed is when the latest notification was
	// claimed (by a transaction, see claim, or by the goroutine), carried
	// when a transaction last claimed one, sent when the goroutine last
	// sent one.
	since, last, claimed, carried, sent time.Time
}

func newWaker(channel string) *waker {
	return &waker{channel: channel, woken: make(chan struct{})}
}

// wait returns a channel closed by the next wake. Take it before reading
// the table, so a wake between the read and the wait is not missed.
func (w *waker) wait() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waited = true
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
	now := time.Now()
	w.last = now
	if !w.pending {
		w.pending, w.since = true, now
	}
	w.pool = pool
	if !w.sending {
		w.sending = true
		go w.notify()
	}
}

// claim takes the notification for a transaction about to be sent, to run
// after its COMMIT (Outbox.QueueNotify): when no relay built from this
// value is active (they are woken in-process) and none was claimed in the
// last notifyInterval. It returns the claim's time, which notified is
// given once the COMMIT has succeeded.
func (w *waker) claim() (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	if w.active > 0 || now.Sub(w.claimed) < notifyInterval {
		return time.Time{}, false
	}
	w.claimed, w.carried = now, now
	return now, true
}

// notified records that the notification claimed at the given time ran
// after a COMMIT: it wakes this process's relays, and covers every wake
// before that time (its commit came before the notification), for which
// the goroutine then sends nothing.
func (w *waker) notified(at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.signalLocked()
	if !w.pending {
		return
	}
	if w.last.Before(at) {
		w.pending = false
		return
	}
	if w.since.Before(at) {
		w.since = at // the wakes left are later
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
	if !w.waited {
		return // nobody holds the channel: no wait to end, none to make
	}
	close(w.woken)
	w.woken, w.waited = make(chan struct{}), false
}

// notify sends notifications while wakes no notification covers keep
// arriving, at most one of its own per notifyInterval and, while
// transactions carry them, only for a wake none covered within
// notifyGrace; it returns once no wake is pending.
func (w *waker) notify() {
	for {
		w.mu.Lock()
		if !w.pending {
			w.sending = false
			w.mu.Unlock()
			return
		}
		if wait := time.Until(w.dueLocked(time.Now())); wait > 0 {
			w.mu.Unlock()
			time.Sleep(wait)
			continue
		}
		pool := w.pool
		now := time.Now()
		w.pending, w.pool, w.claimed, w.sent = false, nil, now, now
		w.mu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
		// An error (the pool closed, the database down) is not reported:
		// the relays' polling finds the rows.
		_, _ = pool.Exec(ctx, notifySQL, w.channel)
		cancel()
	}
}

// dueLocked returns when the goroutine sends for the pending wakes, at
// now: one notifyInterval after its last send and, while transactions
// carry notifications, notifyGrace after the first uncovered wake. It
// depends on the pending wakes and its own sends alone: a claim is a
// promise until its transaction commits, and claims that keep coming must
// not keep putting the send off. w.mu is held.
func (w *waker) dueLocked(now time.Time) time.Time {
	due := w.sent.Add(notifyInterval)
	if now.Sub(w.carried) < notifyCarried {
		due = latest(due, w.since.Add(notifyGrace))
	}
	return due
}

// latest returns the later of a and b.
func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Wake tells the relays of o's table that rows were committed. Relays built
// from o (RelayConfig.Outbox) in this process read the table at once. When
// pool is not nil and none of them is the table's active relay, the relays
// of other processes (and of other Outbox values) are notified on o's
// channel through pool, in a transaction of its own, at most once every few
// milliseconds however often Wake is called: at once, or, while consumer
// transactions carry the notifications after their COMMIT (QueueNotify),
// by the next of them, or on its own within about 10 ms. Wake never blocks
// on the database and cannot fail: a lost wake-up delays publication until
// the relay's next poll (RelayConfig.PollInterval), nothing more.
//
// An exactly consumer calls it (or QueueNotify's function) after every
// transaction that added rows to o's table, on the Outbox value of the transaction's first Add: share one
// value between your handlers and the relay (consumer.Service's Outbox) for
// the in-process wake; the package-level Add, AddJSON and AddValue (on the
// default table, through a fresh Outbox) wake the relay through the
// notification only. Call it yourself
// after committing a transaction in which you called Add outside a
// consumer. Call it only after COMMIT: called inside the transaction, it
// wakes the relay before the rows are visible.
func (o *Outbox) Wake(pool *pgxpool.Pool) { o.wk().wake(pool) }

// QueueNotify queues on batch the notification Wake would send, to run in
// the batch's round trip after the COMMIT that batch already ends with,
// when one is due: none of o's relays in this process is the table's
// active relay, and none was queued or sent in the last few milliseconds.
// It returns the function to call once that COMMIT has succeeded (it wakes
// o's relays in this process and records the notification as sent), or
// nil when it queued nothing: call Wake after the commit then, as usual.
//
// The statement runs in a transaction of its own, after the COMMIT, and
// does not run when the COMMIT fails. Read its result without failing
// the committed transaction on its error, and call Wake instead of the
// returned function when there was one: Wake then notifies on its own. An exactly consumer does this
// for every transaction whose COMMIT it pipelines, so that a notification
// costs neither a round trip nor a connection of the pool.
func (o *Outbox) QueueNotify(batch *pgx.Batch) (notified func()) {
	w := o.wk()
	at, ok := w.claim()
	if !ok {
		return nil
	}
	batch.Queue(notifySQL, o.channel)
	return func() { w.notified(at) }
}

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
