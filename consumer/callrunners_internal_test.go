package consumer

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/exactly-go/exactly/internal/testenv"
)

// runners counts the goroutines of callRunners, and those of them waiting
// for a call.
func runners() (all, idle int) {
	return testenv.CountGoroutines("consumer.(*callRunners).loop(", "select")
}

// runnerGoroutines awaits every runner goroutine being idle (back from its
// last call) and returns how many there are.
func runnerGoroutines(t *testing.T) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		all, idle := runners()
		if all == idle {
			return all
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d runner goroutines still busy after 10s", all-idle, all)
		}
		runtime.Gosched()
	}
}

// Calls run on goroutines kept between calls: a second wave of calls, no
// larger than the first, starts no goroutine, and stop ends them all.
func TestCallRunnersReuseTheirGoroutines(t *testing.T) {
	r := newCallRunners(8)
	wave := func(n int) {
		var started, done sync.WaitGroup
		release := make(chan struct{})
		started.Add(n)
		done.Add(n)
		for range n {
			r.run(func() bool {
				started.Done()
				<-release
				done.Done()
				return true
			})
		}
		started.Wait() // n calls at once: n goroutines
		close(release)
		done.Wait()
		runnerGoroutines(t) // back from their calls, waiting for the next
	}
	wave(4)
	if got := runnerGoroutines(t); got != 4 {
		t.Fatalf("%d runner goroutines after 4 calls at once, want 4", got)
	}
	for range 3 {
		wave(4)
	}
	if got := runnerGoroutines(t); got != 4 {
		t.Errorf("%d runner goroutines after three more waves of 4 calls, want the same 4", got)
	}
	r.stop()
	if got := runnerGoroutines(t); got != 0 {
		t.Errorf("%d runner goroutines after stop, want 0", got)
	}
	wave(2) // runners work again after stop
	r.stop()
	if got := runnerGoroutines(t); got != 0 {
		t.Errorf("%d runner goroutines after the second stop, want 0", got)
	}
}

// Never more goroutines than max: a call that finds none idle and max of
// them running waits for one back from its call, even when none is yet
// waiting for the next (here every one of them is held just after its
// call, as a goroutine the scheduler has not run again would be).
func TestCallRunnersStayWithinMax(t *testing.T) {
	r := newCallRunners(3)
	defer r.stop()
	var finished sync.WaitGroup
	hold := make(chan struct{})
	var holdOnce sync.Once
	release := func() { holdOnce.Do(func() { close(hold) }) }
	defer release() // before stop, even when the test fails early
	finished.Add(3)
	for range 3 {
		r.run(func() bool {
			finished.Done() // the call is over (its slot would be released)
			<-hold          // but its goroutine is not back yet
			return true
		})
	}
	finished.Wait()
	ran := make(chan struct{})
	go r.run(func() bool { close(ran); return true })
	select {
	case <-ran:
		t.Fatal("a fourth call ran while 3 goroutines, the max, were all busy")
	case <-time.After(100 * time.Millisecond): // the absence of an event: bounded wait
	}
	if all, _ := runners(); all != 3 {
		t.Errorf("%d runner goroutines, want the max 3", all)
	}
	release()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("the fourth call did not run once a goroutine was back")
	}
	if got := runnerGoroutines(t); got != 3 {
		t.Errorf("%d runner goroutines after the fourth call, want 3", got)
	}
}
