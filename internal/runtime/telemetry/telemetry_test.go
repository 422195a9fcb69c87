package telemetry_test

import (
	"testing"
	"time"

	"github.com/exactly-go/exactly/internal/runtime/telemetry"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestDuplicateRate(t *testing.T) {
	c := &clock{t: time.Unix(1_000_000, 0)}
	d := telemetry.NewDuplicateRate(time.Minute, 0.25, 20, c.now)
	// A trickle: 1 duplicate in 20, every 6 s, for 10 minutes.
	for i := 0; i < 100; i++ {
		if _, _, spike := d.Observe(20, 1); spike {
			t.Fatalf("trickle reported as a spike at step %d", i)
		}
		c.t = c.t.Add(6 * time.Second)
	}
	// A burst: reported once, not on every batch.
	spikes := 0
	for i := 0; i < 10; i++ {
		if _, _, spike := d.Observe(20, 18); spike {
			spikes++
		}
	}
	if spikes != 1 {
		t.Fatalf("burst reported %d times, want 1", spikes)
	}
	// The burst slides out of the window; a new burst is reported again.
	c.t = c.t.Add(2 * time.Minute)
	if r, n := d.Ratio(); n != 0 || r != 0 {
		t.Fatalf("window after 2 minutes: ratio %v over %d records, want empty", r, n)
	}
	d.Observe(40, 0) // quiet: re-arms
	if _, _, spike := d.Observe(40, 40); !spike {
		t.Fatal("second burst not reported")
	}
	// Too few records is no spike.
	small := telemetry.NewDuplicateRate(time.Minute, 0.25, 20, c.now)
	if _, _, spike := small.Observe(5, 5); spike {
		t.Fatal("5 records reported as a spike with a minimum of 20")
	}
}
