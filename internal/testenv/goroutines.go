package testenv

import (
	"runtime"
	"strings"
)

// Goroutines returns the stack of every goroutine of the process, one
// string each, as runtime.Stack prints them: the first line names the
// goroutine and its state ("goroutine 7 [select]:"), the rest its calls.
// Tests count the goroutines of a mechanism with it (one left running
// after a stop, one more per call than expected). It never fails.
func Goroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// CountGoroutines returns how many goroutines have fn (a function as a
// stack prints it, "consumer.(*waitWriter).run(" say) in their stack,
// and how many of those are in state, the word in brackets on the first
// line ("select", "chan receive"; "" counts none).
func CountGoroutines(fn, state string) (all, inState int) {
	for _, g := range Goroutines() {
		if !strings.Contains(g, fn) {
			continue
		}
		all++
		if state != "" && strings.Contains(g[:max(strings.IndexByte(g, '\n'), 0)], " ["+state) {
			inState++
		}
	}
	return all, inState
}
