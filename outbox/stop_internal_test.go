package outbox

import (
	"context"
	"testing"
	"time"
)

// A context from outliving lives on while its parent does, without the
// parent's deadline, however long that takes; it ends a grace after its
// parent ends, and at once when released.
func TestOutlivingEndsAGraceAfterItsParent(t *testing.T) {
	const grace = 200 * time.Millisecond
	parent, cancelParent := context.WithTimeout(context.Background(), time.Hour)
	defer cancelParent()
	octx, release := outliving(parent, grace)
	defer release()
	if _, ok := octx.Deadline(); ok {
		t.Fatal("it carries its parent's deadline")
	}
	select {
	case <-octx.Done():
		t.Fatal("it ended while its parent lives")
	case <-time.After(2 * grace): // a bounded look for an end that must not come
	}
	ended := time.Now()
	cancelParent()
	select {
	case <-octx.Done():
		if d := time.Since(ended); d < grace {
			t.Fatalf("it ended %v after its parent, want the grace (%v) at least", d, grace)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("it lives 10s after its parent ended, with a grace of %v", grace)
	}

	released, release2 := outliving(context.Background(), time.Hour)
	release2()
	if released.Err() == nil {
		t.Fatal("it lives on after its release")
	}
}
