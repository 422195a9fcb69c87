package consumer

import (
	"testing"
	"time"
)

// The retry wait doubles from the base after each failure and stops at the
// cap; a base above the cap waits the cap.
func TestBackoffDoublesUpToTheCap(t *testing.T) {
	for _, tc := range []struct {
		n         int
		base, max time.Duration
		want      time.Duration
	}{
		{0, 100 * time.Millisecond, time.Second, 100 * time.Millisecond},
		{1, 100 * time.Millisecond, time.Second, 100 * time.Millisecond},
		{2, 100 * time.Millisecond, time.Second, 200 * time.Millisecond},
		{4, 100 * time.Millisecond, time.Second, 800 * time.Millisecond},
		{5, 100 * time.Millisecond, time.Second, time.Second},
		{1000, 100 * time.Millisecond, time.Second, time.Second},
		{1, 2 * time.Second, time.Second, time.Second},
	} {
		if got := backoff(tc.n, tc.base, tc.max); got != tc.want {
			t.Errorf("backoff(%d, %v, %v) = %v, want %v", tc.n, tc.base, tc.max, got, tc.want)
		}
	}
}
