package apply

import (
	"context"

	"github.com/exactly-go/exactly/dedupe"
)

// Announce adds 0 to each of t's counters for handler reading topics: the
// records counter for every outcome and topic, the dead letters per topic,
// the retries per reason and the duplicate spikes. A counter then has its
// series from the start, so that a rate or increase over it (an alert on
// dead letters or duplicate spikes) sees the first event instead of only a
// series appearing. It does nothing on a nil t.
func (t *Telemetry) Announce(ctx context.Context, handler string, topics []string) {
	if t == nil {
		return
	}
	for _, topic := range topics {
		for _, o := range []dedupe.Outcome{dedupe.Applied, dedupe.Duplicate, dedupe.DeadLettered} {
			t.records.Add(ctx, 0, t.opts(measure{kind: measureRecords, handler: handler, value: string(o), topic: topic}).add...)
		}
		t.deadLetters.Add(ctx, 0, t.opts(measure{kind: measureDeadLetters, handler: handler, topic: topic}).add...)
	}
	for _, reason := range []string{"handler_error", retryTransient, retryContention, retryUnavailable} {
		t.retries.Add(ctx, 0, t.opts(measure{kind: measureRetries, handler: handler, value: reason}).add...)
	}
	t.spikeCount.Add(ctx, 0, t.opts(measure{kind: measureSpikes, handler: handler}).add...)
}
