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
type callRunners struct {
	jobs chan func()
	wg   sync.WaitGroup
	max  int

	mu   sync.Mutex
	n    int           // goroutines running
	quit chan struct{} // closed by stop; a fresh one for the goroutines after
}

func newCallRunners(max int) *callRunners {
	return &callRunners{jobs: make(chan func()), quit: make(chan struct{}), max: max}
}

// run calls f on an idle goroutine, or on a new one while there are fewer
// than max.
func (r *callRunners) run(f func()) {
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

// loop calls f, then the calls it is handed, until quit is closed.
func (r *callRunners) loop(f func(), quit chan struct{}) {
	defer r.wg.Done()
	for {
		f()
		select {
		case f = <-r.jobs:
		case <-quit:
			r.mu.Lock()
			r.n--
			r.mu.Unlock()
			return
		}
	}
}

// stop ends the idle goroutines and waits for them; a call running then
// ends first. Calls run after stop start goroutines afresh.
func (r *callRunners) stop() {
	r.mu.Lock()
	close(r.quit)
	r.quit = make(chan struct{})
	r.mu.Unlock()
	r.wg.Wait()
}
