package outbox

import (
	"testing"
	"time"
)

// A transaction claims the notification only while no relay of the value
// is active, and at most once per notifyInterval.
func TestClaimOncePerIntervalAndNotWhileActive(t *testing.T) {
	w := newWaker("ch")
	at1, ok1 := w.claim()
	at2, ok2 := w.claim()
	if !ok1 {
		t.Fatal("the first claim was refused")
	}
	if ok2 && at2.Sub(at1) < notifyInterval {
		t.Fatalf("a second claim %v after the first was granted, want none within %v", at2.Sub(at1), notifyInterval)
	}
	w.claimed = time.Time{} // as if the interval had passed
	release := w.activate()
	if _, ok := w.claim(); ok {
		t.Fatal("claimed while a relay of this value is active (it is woken in-process)")
	}
	release()
	if _, ok := w.claim(); !ok {
		t.Fatal("claim refused once the interval passed and no relay is active")
	}
}

// A carried notification covers the wakes before its claim: none of them
// is left pending for the goroutine, but a later one is, from the claim's
// time on. Either way it wakes this process's relays.
func TestNotifiedCoversTheWakesBeforeItsClaim(t *testing.T) {
	t0 := time.Now()
	for _, tc := range []struct {
		name        string
		last        time.Time
		wantPending bool
	}{
		{"all wakes before the claim", t0.Add(time.Millisecond), false},
		{"a wake after the claim", t0.Add(3 * time.Millisecond), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWaker("ch")
			woken := w.wait()
			w.pending, w.since, w.last = true, t0, tc.last
			at := t0.Add(2 * time.Millisecond)
			w.notified(at)
			if w.pending != tc.wantPending {
				t.Fatalf("pending %v after the notification claimed at +2ms (last wake at %v), want %v", w.pending, tc.last.Sub(t0), tc.wantPending)
			}
			if tc.wantPending && !w.since.Equal(at) {
				t.Fatalf("the wakes left pending date from %v, want the claim's time", w.since.Sub(t0))
			}
			select {
			case <-woken:
			default:
				t.Fatal("notified did not wake this process's relays")
			}
		})
	}
}

// The goroutine's send for a pending wake is due notifyGrace after it
// while transactions carry notifications, at once otherwise, and never
// later because claims keep coming (a claim is void until its
// transaction commits).
func TestNotifyDueIsBoundedByThePendingWake(t *testing.T) {
	now := time.Now()
	w := newWaker("ch")
	w.pending, w.since, w.last = true, now.Add(-time.Millisecond), now
	if due := w.dueLocked(now); due.After(now) {
		t.Fatalf("due in %v with no notification carried lately, want at once", due.Sub(now))
	}
	w.carried, w.claimed = now, now
	if due, want := w.dueLocked(now), w.since.Add(notifyGrace); !due.Equal(want) {
		t.Fatalf("due %v after the wake while transactions carry notifications, want notifyGrace (%v)", due.Sub(w.since), notifyGrace)
	}
	later := now.Add(notifyGrace)
	w.claimed, w.carried = later, later // claims keep coming, none committed
	if due := w.dueLocked(later); due.After(w.since.Add(notifyGrace)) {
		t.Fatalf("a later claim put the send off to %v after the wake, want at most %v", due.Sub(w.since), notifyGrace)
	}
	w.sent = later
	if due := w.dueLocked(later); !due.Equal(later.Add(notifyInterval)) {
		t.Fatalf("due %v after the goroutine's last send, want notifyInterval", due.Sub(later))
	}
}

// A wake that nobody waits for leaves the channel as it is (no channel
// made per commit); one that somebody waits for closes it.
func TestWakeReplacesTheChannelOnlyWhenWaitedFor(t *testing.T) {
	w := newWaker("ch")
	first := w.woken
	w.wake(nil)
	w.wake(nil)
	if w.woken != first {
		t.Fatal("a wake nobody waited for replaced the channel")
	}
	ch := w.wait()
	w.wake(nil)
	select {
	case <-ch:
	default:
		t.Fatal("the wake did not end the wait")
	}
	if w.wait() == ch {
		t.Fatal("the next wait got the closed channel")
	}
}
