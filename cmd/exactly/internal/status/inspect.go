package status

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/deadletters"
)

// GuardRow is one guard row of a key. The fields after ProcessedAt come
// from guard migration 0004 and are empty when the table predates it.
type GuardRow struct {
	Scope string `json:"scope"`
	// Key is the guard key (the key asked for, or, when it matched as a
	// Kafka key, a guard key ending in ":" and it).
	Key         string    `json:"key"`
	ProcessedAt time.Time `json:"processed_at"`
	// State is "applied" or "dead_lettered" ("" before migration 0004).
	State     string `json:"state,omitempty"`
	Topic     string `json:"topic,omitempty"`
	Partition *int64 `json:"partition,omitempty"`
	Offset    *int64 `json:"offset,omitempty"`
	TraceID   string `json:"trace_id,omitempty"`
	Handler   string `json:"handler,omitempty"`
	// TraceURL is the trace in Jaeger when a Jaeger URL was given.
	TraceURL string `json:"trace_url,omitempty"`
}

// DeadLettered reports whether the row marks a dead-lettered record.
func (g GuardRow) DeadLettered() bool { return g.State == guardStateDeadLettered }

// How Inspect matched a key to guard rows (KeyReport.Matched).
const (
	// MatchedGuardKey: guard rows with exactly this key exist.
	MatchedGuardKey = "guard key"
	// MatchedKafkaKey: no guard row has the key, but some have a key ending
	// in ":" and the key, the form dedupe.Key(kind, kafkaKey) gives.
	MatchedKafkaKey = "kafka key"
	// MatchedNothing: no guard row has the key either way.
	MatchedNothing = "nothing"
)

// KeyReport is what Inspect found for one key.
type KeyReport struct {
	Key   string `json:"key"`
	Scope string `json:"scope,omitempty"`
	// Matched says how Key found its guard rows: MatchedGuardKey,
	// MatchedKafkaKey or MatchedNothing.
	Matched string     `json:"matched"`
	Guard   []GuardRow `json:"guard"`
	// MissingColumns are the guard columns of migration 0004 the table does
	// not have yet (their fields are then empty).
	MissingColumns []string `json:"missing_columns,omitempty"`
	// OutboxKey is the Kafka key the outbox rows were matched on.
	OutboxKey string      `json:"outbox_key"`
	Outbox    []OutboxRow `json:"outbox"`
	// OutboxParkedKnown is false when the outbox has no parked column yet.
	OutboxParkedKnown bool `json:"outbox_parked_known"`
	// DeadLetterKeys are the Kafka keys the dead letters were matched on
	// (see InspectOptions.Kafka); empty when Kafka was not read.
	DeadLetterKeys []string `json:"dead_letter_keys,omitempty"`
	// DeadLetters are every dead letter of the key, oldest first, from
	// every dead-letter topic; nil when Kafka was not read.
	DeadLetters []deadletters.Letter `json:"dead_letters"`
	// DeadLetterError says why the dead letters could not be read.
	DeadLetterError string `json:"dead_letter_error,omitempty"`
	// Held are the records of the key a consumer holds after a failed
	// attempt (their key is Key, or ends in ":" and Key), with their
	// attempts, last error and retry time; empty when none is held.
	// HeldKnown is false when the guard's held table does not exist yet.
	Held      []HeldRecord `json:"held"`
	HeldKnown bool         `json:"held_known"`
	// Effects are the rows of the guard's effects table whose key is Key
	// or a guard row's key: what an external call made for the key
	// returned (handler.NewWithCall, dedupe.Effects). EffectsKnown is false
	// when the effects table does not exist.
	Effects      []EffectRow `json:"effects"`
	EffectsKnown bool        `json:"effects_known"`
}

// InspectOptions narrow Inspect.
type InspectOptions struct {
	// Scope limits the guard rows to one scope; "" lists every scope.
	Scope string
	// OutboxKey is the Kafka key to match outbox rows on; nil means the
	// key itself.
	OutboxKey []byte
	// JaegerURL is Jaeger's base URL (http://localhost:16686); when set,
	// rows with a trace id get a TraceURL.
	JaegerURL string
	// Kafka, when set, reads every dead-letter topic (Config.DeadLetterSuffix)
	// whole for the key's dead letters: those whose Kafka key is the key
	// (matched as a Kafka key or not at all) or the part of a matched guard
	// key after its first ":" (dedupe.Key's kind), and those whose original
	// topic, partition and offset are a matched guard row's.
	Kafka *kgo.Client
}

// Inspect reads, in one read-only transaction, the guard rows of key, the
// outbox rows (pending or parked) whose Kafka key matches, the records
// of the key a consumer holds after a failed attempt and the key's
// recorded external-call results (the effects table); then, with
// opts.Kafka, the key's dead letters. The key is first taken as a guard key
// (credit:order-1); when no guard row has it, as a Kafka key (order-1):
// the guard rows whose key ends in ":order-1" (at most 100 rows; with
// generations, among the newest 32 MiB of the current generation, so the
// read is bounded at any guard size: pass the guard key for older rows). KeyReport.Matched says which. It fails on an empty key,
// a JaegerURL that is not an absolute http(s) URL, or a database error
// (wrapped, naming the table); a failure to read the dead letters is
// reported in KeyReport.DeadLetterError instead.
func Inspect(ctx context.Context, cfg Config, key string, opts InspectOptions) (*KeyReport, error) {
	if key == "" {
		return nil, errors.New("status: inspect: empty key")
	}
	if cfg.Pool == nil {
		return nil, errors.New("status: inspect: Config.Pool is nil")
	}
	if err := checkJaegerURL(opts.JaegerURL); err != nil {
		return nil, fmt.Errorf("status: inspect: %w", err)
	}
	cfg = cfg.withDefaults()
	c := &Collector{cfg: cfg}
	outboxKey := opts.OutboxKey
	if outboxKey == nil {
		outboxKey = []byte(key)
	}
	rep := &KeyReport{Key: key, Scope: opts.Scope, OutboxKey: Printable(outboxKey), Guard: []GuardRow{}}
	err := readOnly(ctx, c, func(tx pgx.Tx) error {
		gt := cfg.Guard.Table()
		cols, err := columnsOf(ctx, tx, gt)
		if err != nil {
			return err
		}
		for _, col := range guardOptional() {
			if !cols[col] {
				rep.MissingColumns = append(rep.MissingColumns, col)
			}
		}
		rep.Matched = MatchedGuardKey
		if err := readGuardRows(ctx, tx, gt, cols, key, false, opts, rep); err != nil {
			return err
		}
		if len(rep.Guard) == 0 {
			rep.Matched = MatchedKafkaKey
			if err := readGuardRows(ctx, tx, gt, cols, ":"+key, true, opts, rep); err != nil {
				return err
			}
		}
		if len(rep.Guard) == 0 {
			rep.Matched = MatchedNothing
		}

		ot := cfg.Outbox.Table()
		ocols, err := columnsOf(ctx, tx, ot)
		if err != nil {
			return err
		}
		rep.OutboxParkedKnown = ocols[colOutboxParked]
		if rep.Outbox, err = outboxRows(ctx, tx, ot, rep.OutboxParkedKnown, cfg.Rows, outboxKey); err != nil {
			return fmt.Errorf("reading the outbox rows of Kafka key %q from %s: %w", rep.OutboxKey, ot.Sanitize(), err)
		}
		for i := range rep.Outbox {
			rep.Outbox[i].TraceURL = jaegerTraceURL(opts.JaegerURL, rep.Outbox[i].TraceID)
		}
		held, err := readHeld(ctx, tx, cfg, key, opts.Scope, maxSuffixRows)
		if err != nil {
			return err
		}
		rep.Held, rep.HeldKnown = held.Records, held.Known
		return readEffects(ctx, tx, cfg, opts.Scope, rep)
	})
	if err != nil {
		return nil, fmt.Errorf("status: inspect %q: %w", key, err)
	}
	if opts.Kafka != nil {
		keyDeadLetters(ctx, opts.Kafka, cfg.DeadLetterSuffix, opts.JaegerURL, rep)
	}
	return rep, nil
}

// readGuardRows appends to rep the guard rows whose key is match (or, with
// bySuffix, ends in it).
func readGuardRows(ctx context.Context, tx pgx.Tx, gt pgx.Identifier, cols map[string]bool, match string, bySuffix bool, opts InspectOptions, rep *KeyReport) error {
	sealed, err := sealedView(ctx, tx, gt)
	if err != nil {
		return err
	}
	sql, present := guardRowSQL(gt, cols, opts.Scope != "", bySuffix, sealed)
	args := []any{match}
	if opts.Scope != "" {
		args = append(args, opts.Scope)
	}
	if bySuffix && sealed != nil {
		var start string
		if err := tx.QueryRow(ctx, suffixStartSQL, gt.Sanitize(), maxSuffixPages).Scan(&start); err != nil {
			return fmt.Errorf("reading the size of %s: %w", gt.Sanitize(), err)
		}
		args = append(args, start)
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("reading the guard rows of %q from %s: %w", rep.Key, gt.Sanitize(), err)
	}
	defer rows.Close()
	for rows.Next() {
		var g GuardRow
		opt := make([]*string, len(present))
		dest := []any{&g.Scope, &g.Key, &g.ProcessedAt}
		for i := range opt {
			dest = append(dest, &opt[i])
		}
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("reading the guard rows of %q from %s: %w", rep.Key, gt.Sanitize(), err)
		}
		for i, col := range present {
			if opt[i] != nil {
				g.set(col, *opt[i])
			}
		}
		g.TraceURL = jaegerTraceURL(opts.JaegerURL, g.TraceID)
		rep.Guard = append(rep.Guard, g)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading the guard rows of %q from %s: %w", rep.Key, gt.Sanitize(), err)
	}
	return nil
}

// sealedView returns the sealed generations' view of guard table gt, or
// nil when the table is not migrated to generations.
func sealedView(ctx context.Context, tx pgx.Tx, gt pgx.Identifier) (pgx.Identifier, error) {
	v := append(gt[:len(gt)-1:len(gt)-1], gt[len(gt)-1]+"_sealed")
	var exists bool
	if err := tx.QueryRow(ctx, tableExistsSQL, v.Sanitize()).Scan(&exists); err != nil {
		return nil, fmt.Errorf("looking up %s: %w", v.Sanitize(), err)
	}
	if !exists {
		return nil, nil
	}
	return v, nil
}

// keyDeadLetters reads every dead-letter topic for the dead letters of
// rep's key (see InspectOptions.Kafka) into rep.
func keyDeadLetters(ctx context.Context, cl *kgo.Client, suffix, jaegerURL string, rep *KeyReport) {
	keys := map[string]bool{}
	type coord struct {
		topic     string
		partition int64
		offset    int64
	}
	coords := map[coord]bool{}
	if rep.Matched == MatchedGuardKey {
		for _, g := range rep.Guard {
			if _, id, ok := strings.Cut(g.Key, ":"); ok && id != "" {
				keys[id] = true
			}
			if g.Topic != "" && g.Partition != nil && g.Offset != nil {
				coords[coord{g.Topic, *g.Partition, *g.Offset}] = true
			}
		}
	} else {
		keys[rep.Key] = true
	}
	for k := range keys {
		rep.DeadLetterKeys = append(rep.DeadLetterKeys, k)
	}
	sort.Strings(rep.DeadLetterKeys)
	match := func(l deadletters.Letter) bool {
		if l.RawKey != nil && keys[string(l.RawKey)] {
			return true
		}
		return l.OriginalPartition != nil && l.OriginalOffset != nil &&
			coords[coord{l.OriginalTopic, *l.OriginalPartition, *l.OriginalOffset}]
	}
	topics, err := deadletters.Read(ctx, cl, deadletters.Options{Suffix: suffix, Latest: -1, Match: match})
	if err != nil {
		rep.DeadLetterError = err.Error()
		return
	}
	rep.DeadLetters = []deadletters.Letter{}
	for _, t := range topics {
		for _, l := range t.Letters {
			l.TraceURL = jaegerTraceURL(jaegerURL, l.TraceID)
			rep.DeadLetters = append(rep.DeadLetters, l)
		}
	}
	sort.SliceStable(rep.DeadLetters, func(i, j int) bool { return rep.DeadLetters[i].At.Before(rep.DeadLetters[j].At) })
}

// checkJaegerURL accepts "" (no links) or an absolute http(s) URL, Jaeger's
// base address.
func checkJaegerURL(base string) error {
	if base == "" {
		return nil
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("the Jaeger URL %q is not an absolute http(s) URL", base)
	}
	return nil
}

// jaegerTraceURL is the page of trace traceID in the Jaeger UI at base (a
// URL checkJaegerURL accepted), the id path-escaped; "" when either is
// empty. The one place the module builds Jaeger links.
func jaegerTraceURL(base, traceID string) string {
	if base == "" || traceID == "" {
		return ""
	}
	return strings.TrimRight(base, "/") + "/trace/" + url.PathEscape(traceID)
}

func (g *GuardRow) set(col, v string) {
	switch col {
	case colGuardState:
		g.State = v
	case colGuardTopic:
		g.Topic = v
	case colGuardPartition:
		g.Partition = parseInt(v)
	case colGuardOffset:
		g.Offset = parseInt(v)
	case colGuardTraceID:
		g.TraceID = strings.TrimPrefix(v, `\x`) // a bytea column casts to \x-prefixed hex
	case colGuardHandler:
		g.Handler = v
	}
}

func parseInt(v string) *int64 {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return nil
	}
	return &n
}
