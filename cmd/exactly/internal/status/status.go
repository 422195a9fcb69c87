package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/deadletters"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/runtime/redact"
	"github.com/exactly-go/exactly/outbox"
)

// DefaultRetentionGrace is how far past the retention the oldest guard row
// may be before retention counts as violated: the pruner runs every minute,
// so a row older than retention plus this means pruning is not happening.
const DefaultRetentionGrace = 10 * time.Minute

// DefaultOutboxProblemAfter is how old the oldest outbox row may be while
// no relay is active before a report counts it as a problem: a relay
// that stopped is replaced within seconds (a lease's expiry, a standby's
// next try), so a minute without one while rows wait is not a handover.
const DefaultOutboxProblemAfter = time.Minute

// DefaultRows is how many outbox rows a Report lists.
const DefaultRows = 20

// DefaultDeadLetters is how many of each dead-letter topic's newest dead
// letters a Report shows.
const DefaultDeadLetters = 5

// Config says where to look. Pool is required; Admin may be nil (no Kafka
// figures then).
type Config struct {
	// Pool reads the guard, outcome and outbox tables, always in read-only
	// transactions.
	Pool *pgxpool.Pool
	// Admin lists group offsets and topic offsets; nil skips Kafka.
	Admin *kadm.Client
	// Groups are the consumer groups to report; empty means every group
	// the cluster lists.
	Groups []string
	// Guard names the guard table (and so its outcome table); nil means
	// dedupe.New().
	Guard *dedupe.Guard
	// Outbox names the outbox table; nil means outbox.New().
	Outbox *outbox.Outbox
	// Retention is the guard retention the oldest row is held against;
	// 0 means dedupe.DefaultRetention.
	Retention time.Duration
	// RetentionGrace: see DefaultRetentionGrace; 0 means that.
	RetentionGrace time.Duration
	// HeldProblemAfter is how long a record may be held before it counts
	// as a problem; 0 means DefaultHeldProblemAfter.
	HeldProblemAfter time.Duration
	// OutboxProblemAfter is how old the oldest outbox row may be, with no
	// relay active, before it counts as a problem (and, with a relay
	// active, five times that); 0 means DefaultOutboxProblemAfter.
	OutboxProblemAfter time.Duration
	// DeadLetterSuffix marks dead-letter topics; "" means ".dlq".
	DeadLetterSuffix string
	// Rows bounds the outbox rows listed; 0 means DefaultRows.
	Rows int
	// Kafka reads the latest dead letters of each dead-letter topic (with
	// the cmd/exactly/internal/deadletters reader); nil lists only their
	// sizes (through Admin).
	Kafka *kgo.Client
	// DeadLetters is how many of each dead-letter topic's newest dead
	// letters a report shows; 0 means DefaultDeadLetters.
	DeadLetters int
	// JaegerURL is Jaeger's base URL (http://localhost:16686); when set,
	// dead letters and outbox rows with a trace id link to their trace.
	// NewCollector fails when it is not an absolute http(s) URL.
	JaegerURL string
	// Database is the connection string and Brokers the seed brokers, for
	// display only; reports show Database with its secrets redacted
	// (redact.URL, the module's one redaction rule).
	Database string
	Brokers  []string
}

func (c Config) withDefaults() Config {
	if c.Guard == nil {
		c.Guard = dedupe.New()
	}
	if c.Outbox == nil {
		c.Outbox = outbox.New()
	}
	if c.Retention == 0 {
		c.Retention = dedupe.DefaultRetention
	}
	if c.RetentionGrace == 0 {
		c.RetentionGrace = DefaultRetentionGrace
	}
	if c.HeldProblemAfter == 0 {
		c.HeldProblemAfter = DefaultHeldProblemAfter
	}
	if c.OutboxProblemAfter == 0 {
		c.OutboxProblemAfter = DefaultOutboxProblemAfter
	}
	if c.DeadLetterSuffix == "" {
		c.DeadLetterSuffix = ".dlq"
	}
	if c.Rows == 0 {
		c.Rows = DefaultRows
	}
	if c.DeadLetters == 0 {
		c.DeadLetters = DefaultDeadLetters
	}
	return c
}

// Partition is one group's position on one partition.
type Partition struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Committed is the group's committed offset, -1 when it has none.
	Committed int64 `json:"committed"`
	End       int64 `json:"end"`
	// Lag is End minus Committed (End when nothing is committed), -1 when
	// either could not be read (Error says why).
	Lag int64 `json:"lag"`
	// LagBefore is the lag at the first sample, -1 when unknown.
	LagBefore int64 `json:"lag_before"`
	// Stalled: the partition had lag at both samples and the group's
	// committed offset did not move between them: records wait and none
	// was committed over the whole interval (a record in flight commits
	// within the commit interval, a second by default, and does not count).
	// Only for groups with members: a stopped group's lag is its own
	// problem.
	Stalled bool   `json:"stalled"`
	Error   string `json:"error,omitempty"`
}

// Member is one member of a consumer group, as the group coordinator
// describes it.
type Member struct {
	ClientID string `json:"client_id"`
	Host     string `json:"host"`
}

// Group is one consumer group: its state, its members and its lag.
type Group struct {
	Group string `json:"group"`
	// State is the coordinator's word for the group: Stable,
	// PreparingRebalance, CompletingRebalance, Empty or Dead ("" when the
	// group could not be described).
	State   string   `json:"state"`
	Members []Member `json:"members"`
	// Lag is the sum of its partitions' lag, -1 when a partition's lag
	// could not be read.
	Lag int64 `json:"lag"`
	// Stopped: the group has no members (Empty or Dead): nothing consumes
	// for it, so its lag is reported apart (Report.StoppedLag), not in the
	// headline Report.Lag.
	Stopped bool   `json:"stopped"`
	Error   string `json:"error,omitempty"`
}

// OutboxRow is one unpublished outbox row.
type OutboxRow struct {
	ID      int64             `json:"id"`
	Topic   string            `json:"topic"`
	Key     string            `json:"key"`
	Headers map[string]string `json:"headers,omitempty"`
	Age     time.Duration     `json:"age_ns"`
	Parked  bool              `json:"parked"`
	// Reason is why the relay parked the row ("" when not parked).
	Reason string `json:"reason,omitempty"`
	// Size is the row's key and value in bytes, as the relay counts them.
	Size int64 `json:"size"`
	// HeldBehind counts, for a parked row, the pending rows of its topic
	// and key the relay holds back until it is retried or dropped.
	HeldBehind int64 `json:"held_behind"`
	// Held: the row is pending but the relay skips it because a row of its
	// topic and key is parked.
	Held bool `json:"held"`
	// TraceID is the trace id of the row's traceparent header ("" without
	// one) and TraceURL its page in Jaeger (Config.JaegerURL set).
	TraceID  string `json:"trace_id,omitempty"`
	TraceURL string `json:"trace_url,omitempty"`
	// rawKey is the key's bytes, for ShowKey.
	rawKey []byte
}

// ShowKey is the row's Kafka key for a listing (see the package's
// ShowKey): quoted text, or hex:… for bytes that are not, bounded.
func (r OutboxRow) ShowKey() string { return ShowKey(r.rawKey) }

// State is "parked", "held" (behind a parked row of its topic and key) or
// "pending".
func (r OutboxRow) State() string {
	switch {
	case r.Parked:
		return "parked"
	case r.Held:
		return "held"
	}
	return "pending"
}

// Outbox is the outbox table's state.
type Outbox struct {
	Table   string        `json:"table"`
	Backlog int64         `json:"backlog"`
	Oldest  time.Duration `json:"oldest_ns"`
	Parked  int64         `json:"parked"`
	// Held counts the pending rows held behind a parked row of their topic
	// and key (Backlog includes them).
	Held int64 `json:"held"`
	// ParkedKnown is false when the table has no parked column yet (the
	// relay's migration has not run): Parked is then 0 by absence.
	ParkedKnown bool        `json:"parked_known"`
	Rows        []OutboxRow `json:"rows"`
}

// Guard is the guard table's state.
type Guard struct {
	Table     string        `json:"table"`
	Rows      int64         `json:"rows"`
	Oldest    time.Duration `json:"oldest_ns"`
	Retention time.Duration `json:"retention_ns"`
	Violated  bool          `json:"retention_violated"`
}

// DeadLetterTopic is one dead-letter topic's size and its latest dead
// letters.
type DeadLetterTopic struct {
	Topic   string `json:"topic"`
	Records int64  `json:"records"`
	// Latest are its newest dead letters, oldest first (at most
	// Config.DeadLetters of them), read by the dead-letter reader `exactly
	// deadletters` uses; nil (null in JSON) when Config.Kafka is nil or
	// they could not be read.
	Latest []deadletters.Letter `json:"latest"`
}

// Outcomes are one scope's delivery counters.
type Outcomes struct {
	Scope        string  `json:"scope"`
	Applied      int64   `json:"applied"`
	Duplicate    int64   `json:"duplicate"`
	DeadLettered int64   `json:"dead_lettered"`
	Ratio        float64 `json:"duplicate_ratio"`
	// Recent is the duplicate ratio of the deliveries counted between
	// the two samples, -1 when there were none.
	Recent float64 `json:"recent_duplicate_ratio"`
	// Estimated marks Applied (and so the ratios) as an estimate: above
	// a million guard rows still counting themselves, Applied is the
	// counter rows' sum plus the planner's estimate of the scope's
	// applied guard rows, so that a status read costs the same at any
	// size. Duplicate and DeadLettered stay exact.
	Estimated bool `json:"estimated"`
}

// Report is what Collect found.
type Report struct {
	Taken    time.Time     `json:"taken"`
	Interval time.Duration `json:"interval_ns"`
	// Database is Config.Database with its secrets redacted.
	Database string   `json:"database"`
	Brokers  []string `json:"brokers,omitempty"`
	// Groups are the consumer groups, by name.
	Groups []Group `json:"groups"`
	// Lag is the lag of the groups that have members (the headline), and
	// StoppedLag that of the stopped (Empty or Dead) groups; each -1 when
	// the lag could not be read.
	Lag        int64       `json:"lag"`
	StoppedLag int64       `json:"stopped_lag"`
	Partitions []Partition `json:"partitions"`
	Outbox     Outbox      `json:"outbox"`
	// Relay is who publishes the outbox table (unknown when "relay" is in
	// Unread).
	Relay       Relay             `json:"relay"`
	Guard       Guard             `json:"guard"`
	DeadLetters []DeadLetterTopic `json:"dead_letters"`
	Outcomes    []Outcomes        `json:"outcomes"`
	// Held is what waits in the consumers: records held after a failed
	// attempt and partitions paused behind them (the guard's held and
	// paused tables, which the consumers keep best effort).
	Held Held `json:"held"`
	// History is the Collector's last HistorySize samples, this report's
	// last, oldest first.
	History []Point `json:"history"`
	// Problems says what needs a human; empty when all is well. A part
	// that could not be read is one: "could not read <part>: <error>".
	Problems []string `json:"problems"`
	// Errors are the parts that could not be read (the rest still is),
	// each with its error, secrets redacted; Problems lists them too.
	Errors []string `json:"errors,omitempty"`
	// Unread names the parts whose figures are unknown because they could
	// not be read: "guard", "outbox", "relay", "outcomes", "held" (the database), "lag" and
	// "dead_letters" (Kafka). Their fields hold zero values, not readings.
	Unread []string `json:"unread,omitempty"`
	// errParts names the part of each of Errors.
	errParts []string
}

// NeedsHuman reports whether the report lists a problem or a part that
// could not be read.
func (r *Report) NeedsHuman() bool { return len(r.Problems) > 0 || len(r.Errors) > 0 }

// Unknown reports whether part (a name in Unread) could not be read.
func (r *Report) Unknown(part string) bool { return slices.Contains(r.Unread, part) }

// JSON returns the report as indented JSON.
func (r *Report) JSON() ([]byte, error) {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("status: encoding the report as JSON: %w", err)
	}
	return b, nil
}

// Collect reads everything twice, interval apart, and returns the second
// report: lag growth and the recent duplicate ratio compare the two. A part
// that cannot be read is listed in Report.Errors and the rest is still
// reported; Collect itself fails only on a bad Config or when ctx ends
// while it waits.
func Collect(ctx context.Context, cfg Config, interval time.Duration) (*Report, error) {
	c, err := NewCollector(cfg)
	if err != nil {
		return nil, err
	}
	c.Collect(ctx)
	if interval > 0 {
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("status: waiting %v between samples: %w", interval, ctx.Err())
		case <-t.C:
		}
	}
	return c.Collect(ctx), nil
}

// Collector produces reports, each compared with the one before (the
// status page keeps one). It is not safe for concurrent use.
type Collector struct {
	cfg     Config
	prev    *sample
	prevAt  time.Time
	history ring
	// estimateAbove is outcomeEstimateAbove; tests lower it.
	estimateAbove int64
}

// NewCollector returns a Collector for cfg. It fails when cfg.Pool is nil
// or cfg.JaegerURL is set but not an absolute http(s) URL.
func NewCollector(cfg Config) (*Collector, error) {
	if cfg.Pool == nil {
		return nil, errors.New("status: Config.Pool is nil")
	}
	if err := checkJaegerURL(cfg.JaegerURL); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	return &Collector{cfg: cfg.withDefaults(), history: ring{size: HistorySize}, estimateAbove: outcomeEstimateAbove}, nil
}

// Collect reads everything and compares it with the previous call (the
// first call compares with nothing: no lag growth, no recent ratio).
// Failures of parts are listed in Report.Errors.
func (c *Collector) Collect(ctx context.Context) *Report {
	now := time.Now()
	r := &Report{Taken: now.UTC(), Database: redact.URL(c.cfg.Database), Brokers: c.cfg.Brokers}
	if c.prev != nil {
		r.Interval = now.Sub(c.prevAt).Round(time.Millisecond)
	}
	cur := &sample{}
	c.readDatabase(ctx, r, cur)
	c.readKafka(ctx, r, cur)
	c.compareOutcomes(r, cur)
	c.findProblems(r)
	c.history.add(c.point(r, cur))
	r.History = c.history.snapshot()
	c.prev, c.prevAt = cur, now
	return r
}
