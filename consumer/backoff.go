package consumer

import "time"

// backoff returns the wait before attempt n+1 after n failures (of a
// handler, or of the database during an outage): exponential from base,
// capped at max.
func backoff(n int, base, max time.Duration) time.Duration {
	d := base
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return d
}
