package consumer

import "sync"

// callRunners runs the instance's pre-transaction calls on goroutines
// kept between calls: a call (an HTTP client's, say) grows its goroutine's
// stack, and a goroutine per call grew it again every time (2.7 % of the
// I/O-bound bench row's CPU). A call goes to an idle goroutine when one
// waits, or to a new one while there are fewer than max (the instance's
// Config.MaxCallsInFlight); at max, it waits for one to be idle, which is
// at once: a call starts only once another released its slot, so one of
// the max goroutines has finished its call and is on its way back. stop
// ends the idle ones.
//
// A job reports whether its goroutine goes on: a call abandoned at a
// revoke or shutdown (see dispatch.close) returns false once it ends, and
// its goroutine exits then. The dispatcher gives such goroutines up with
// abandon when it abandons their calls: they count neither against max
// nor in what stop waits for, so a call that ignores its context holds
// neither later calls nor Run.
type callRunners struct {
	jobs chan func() bool
	wg   sync.WaitGroup
	max  int

	mu   sync.Mutex
	n    int           // goroutines running, but abandoned ones
	quit chan struct{} // closed by stop; a fresh one for the goroutines after
}

func newCallRunners(max int) *callRunners {
	return &callRunners{jobs: make(chan func() bool), quit: make(chan struct{}), max: max}
}

// run calls f on an idle goroutine, or on a new one while there are fewer
// than max.
func (r *callRunners) run(f func() bool) {
	select {
	case r.jobs <- f:
		return
	default:
	}
	r.mu.Lock()
	if r.n >= r.max {
		r.mu.Unlock()
		r.jobs <- f // one is back from its call in a moment
		return
	}
	r.n++
	quit := r.quit
	r.mu.Unlock()
	r.wg.Add(1)
	go r.loop(f, quit)
}

// abandon gives up k goroutines whose calls were abandoned: each exits,
// uncounted, when its call ends (its job returns false).
func (r *callRunners) abandon(k int) {
	if k == 0 {
		return
	}
	r.mu.Lock()
	r.n -= k
	r.mu.Unlock()
	r.wg.Add(-k)
}

// loop calls f, then the calls it is handed, until quit is closed or a
// call was abandoned.
func (r *callRunners) loop(f func() bool, quit chan struct{}) {
	for {
		if !f() {
			return // abandoned: counted out by abandon
		}
		select {
		case f = <-r.jobs:
		case <-quit:
			r.mu.Lock()
			r.n--
			r.mu.Unlock()
			r.wg.Done()
			return
		}
	}
}

// stop ends the idle goroutines and waits for them; a call running then
// ends first (an abandoned one is not waited for). Calls run after stop
// start goroutines afresh.
func (r *callRunners) stop() {
	r.mu.Lock()
	close(r.quit)
	r.quit = make(chan struct{})
	r.mu.Unlock()
	r.wg.Wait()
}
