package status

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/exactly-go/exactly/cmd/exactly/internal/deadletters"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/runtime/redact"
)

// sample is what the next report compares with.
type sample struct {
	lags     map[lagKey]Partition
	outcomes map[string]dedupe.Counts
}

type lagKey struct {
	group, topic string
	partition    int32
}

// beginError is a read-only transaction that could not begin: the
// database does not answer (or refuses the connection).
type beginError struct{ err error }

func (e *beginError) Error() string { return "beginning a read-only transaction: " + e.err.Error() }
func (e *beginError) Unwrap() error { return e.err }

// readOnly runs fn in a read-only transaction and rolls it back.
func readOnly(ctx context.Context, c *Collector, fn func(pgx.Tx) error) error {
	tx, err := c.cfg.Pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return &beginError{err}
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// A status read must never hold the database up: bound each statement.
	if _, err := tx.Exec(ctx, statementTimeoutSQL); err != nil {
		return fmt.Errorf("bounding the read's statement time: %w", err)
	}
	return fn(tx)
}

// The parts of a report that can fail to be read, as Report.Unread names
// them.
const (
	partGuard       = "guard"
	partOutbox      = "outbox"
	partRelay       = "relay"
	partOutcomes    = "outcomes"
	partHeld        = "held"
	partLag         = "lag"
	partDeadLetters = "dead_letters"
)

// unread records that part could not be read, what naming it for a person:
// its figures in r are unknown, not zero. The error is redacted of the
// connection string's secrets (redact.Error) and of any URL's password.
func (c *Collector) unread(r *Report, part, what string, err error) {
	r.Errors = append(r.Errors, fmt.Sprintf("%s: %s", what, ShowError(redact.Error(err, c.cfg.Database).Error())))
	r.errParts = append(r.errParts, part)
	if !slices.Contains(r.Unread, part) {
		r.Unread = append(r.Unread, part)
	}
}

func (c *Collector) readDatabase(ctx context.Context, r *Report, cur *sample) {
	fail := func(part, what string, err error) {
		if err != nil {
			c.unread(r, part, what, err)
		}
	}
	// Each part is read on its own, but once a transaction could not
	// begin (the database does not answer: each try waits for the
	// connection's timeout) the later parts report that error without
	// trying again.
	var down error
	readOnly := func(ctx context.Context, c *Collector, fn func(pgx.Tx) error) error {
		if down != nil {
			return down
		}
		err := readOnly(ctx, c, fn)
		var be *beginError
		if errors.As(err, &be) {
			down = err
		}
		return err
	}
	gt := c.cfg.Guard.Table()
	r.Guard = Guard{Table: gt.Sanitize(), Retention: c.cfg.Retention}
	fail(partGuard, "guard table "+gt.Sanitize(), readOnly(ctx, c, func(tx pgx.Tx) error {
		var err error
		if r.Guard.Rows, r.Guard.Oldest, err = guardSummary(ctx, tx, c.cfg.Guard); err != nil {
			return err
		}
		r.Guard.Violated = r.Guard.Oldest > c.cfg.Retention+c.cfg.RetentionGrace
		return nil
	}))

	ot := c.cfg.Outbox.Table()
	r.Outbox = Outbox{Table: ot.Sanitize(), Rows: []OutboxRow{}}
	fail(partOutbox, "outbox table "+ot.Sanitize(), readOnly(ctx, c, func(tx pgx.Tx) error {
		cols, err := columnsOf(ctx, tx, ot)
		if err != nil {
			return err
		}
		r.Outbox.ParkedKnown = cols[colOutboxParked]
		var micros int64
		if err := tx.QueryRow(ctx, outboxSummarySQL(ot, r.Outbox.ParkedKnown)).Scan(&r.Outbox.Backlog, &micros, &r.Outbox.Parked, &r.Outbox.Held); err != nil {
			return err
		}
		r.Outbox.Oldest = time.Duration(micros) * time.Microsecond
		r.Outbox.Rows, err = outboxRows(ctx, tx, ot, r.Outbox.ParkedKnown, c.cfg.Rows, nil)
		for i := range r.Outbox.Rows {
			r.Outbox.Rows[i].TraceURL = jaegerTraceURL(c.cfg.JaegerURL, r.Outbox.Rows[i].TraceID)
		}
		return err
	}))

	r.Relay = Relay{Holders: []RelayHolder{}}
	fail(partRelay, "the relay holder of "+ot.Sanitize(), readOnly(ctx, c, func(tx pgx.Tx) error {
		var err error
		r.Relay, err = readRelay(ctx, tx, ot)
		return err
	}))

	outt := c.cfg.Guard.OutcomeTable()
	cur.outcomes = map[string]dedupe.Counts{}
	r.Outcomes = []Outcomes{}
	fail(partOutcomes, "outcome counters "+outt.Sanitize(), readOnly(ctx, c, func(tx pgx.Tx) error {
		est, tables, self, err := uncountedRows(ctx, tx, c.cfg.Guard)
		if err != nil {
			return err
		}
		if self && est > c.estimateAbove {
			r.Outcomes, err = estimatedOutcomes(ctx, tx, c.cfg.Guard, tables)
			for _, o := range r.Outcomes {
				cur.outcomes[o.Scope] = dedupe.Counts{Applied: o.Applied, Duplicate: o.Duplicate, DeadLettered: o.DeadLettered}
			}
			return err
		}
		rows, err := c.cfg.Guard.OutcomeRows(ctx, tx)
		if err != nil {
			return err
		}
		for _, row := range rows {
			k := slices.IndexFunc(r.Outcomes, func(o Outcomes) bool { return o.Scope == row.Scope })
			if k < 0 {
				r.Outcomes = append(r.Outcomes, Outcomes{Scope: row.Scope})
				k = len(r.Outcomes) - 1
			}
			o := &r.Outcomes[k]
			o.Applied += row.Applied
			o.Duplicate += row.Duplicate
			o.DeadLettered += row.DeadLettered
		}
		for _, o := range r.Outcomes {
			cur.outcomes[o.Scope] = dedupe.Counts{Applied: o.Applied, Duplicate: o.Duplicate, DeadLettered: o.DeadLettered}
		}
		return nil
	}))

	r.Held = Held{Records: []HeldRecord{}, Paused: []PausedPartition{}}
	fail(partHeld, "held records "+c.cfg.Guard.HeldTable().Sanitize(), readOnly(ctx, c, func(tx pgx.Tx) error {
		held, err := readHeld(ctx, tx, c.cfg, "", "", c.cfg.Rows)
		if err == nil {
			r.Held = held
		}
		return err
	}))
}

// outboxRows lists up to limit rows of table t, parked first, then held;
// with key
// non-nil only the rows of that Kafka key.
func outboxRows(ctx context.Context, tx pgx.Tx, t pgx.Identifier, parked bool, limit int, key []byte) ([]OutboxRow, error) {
	args := []any{limit}
	if key != nil {
		args = append(args, key)
	}
	rows, err := tx.Query(ctx, outboxRowsSQL(t, parked, key != nil), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []OutboxRow{}
	now := time.Now()
	for rows.Next() {
		var (
			row     OutboxRow
			k       []byte
			headers []byte
			created time.Time
		)
		if err := rows.Scan(&row.ID, &row.Topic, &k, &headers, &created, &row.Parked,
			&row.Reason, &row.Size, &row.HeldBehind, &row.Held); err != nil {
			return nil, err
		}
		row.Key, row.rawKey = Printable(k), k
		row.Age = now.Sub(created).Round(time.Millisecond)
		if len(headers) > 0 {
			var hs []struct {
				Key   string `json:"key"`
				Value []byte `json:"value"`
			}
			if err := json.Unmarshal(headers, &hs); err != nil {
				return nil, fmt.Errorf("decoding the headers of outbox row %d: %w", row.ID, err)
			}
			row.Headers = make(map[string]string, len(hs))
			for _, h := range hs {
				row.Headers[h.Key] = Printable(h.Value)
				if h.Key == "traceparent" {
					row.TraceID = deadletters.TraceIDOf(string(h.Value))
				}
			}
		}
		out = append(out, row)
	}
	return out, rows.Err()
}

// Printable renders bytes for a person: as text when they are valid UTF-8
// without control characters, otherwise as 0x-prefixed hex; nil is "(null)".
// Escaping for HTML is the page template's job, not this function's.
func Printable(b []byte) string {
	if b == nil {
		return "(null)"
	}
	if utf8.Valid(b) && strings.IndexFunc(string(b), unicode.IsControl) < 0 {
		return string(b)
	}
	return "0x" + hex.EncodeToString(b)
}

func (c *Collector) readKafka(ctx context.Context, r *Report, cur *sample) {
	cur.lags = map[lagKey]Partition{}
	r.Partitions, r.DeadLetters, r.Groups = []Partition{}, []DeadLetterTopic{}, []Group{}
	if c.cfg.Admin == nil {
		r.Lag, r.StoppedLag = -1, -1 // not read: no data
		return
	}
	defer r.sumLag()
	groups := c.cfg.Groups
	if len(groups) == 0 {
		listed, err := c.cfg.Admin.ListGroups(ctx)
		if err != nil {
			c.unread(r, partLag, "listing consumer groups", err)
		}
		groups = listed.Groups()
	}
	if len(groups) > 0 {
		lags, err := c.cfg.Admin.Lag(ctx, groups...)
		if err != nil {
			c.unread(r, partLag, fmt.Sprintf("reading the lag of groups %q", groups), err)
		}
		for _, g := range lags.Sorted() {
			grp := Group{Group: g.Group, State: g.State, Members: []Member{}, Stopped: groupStopped(g.State)}
			for _, m := range g.Members {
				grp.Members = append(grp.Members, Member{ClientID: m.ClientID, Host: m.ClientHost})
			}
			if err := g.Error(); err != nil {
				c.unread(r, partLag, fmt.Sprintf("group %q", g.Group), err)
				grp.Error, grp.Lag = err.Error(), -1
				r.Groups = append(r.Groups, grp)
				continue
			}
			for _, l := range g.Lag.Sorted() {
				p := Partition{Group: g.Group, Topic: l.Topic, Partition: l.Partition,
					Committed: l.Commit.At, End: l.End.Offset, Lag: l.Lag, LagBefore: -1}
				if l.Err != nil {
					p.Error = l.Err.Error()
				}
				k := lagKey{g.Group, l.Topic, l.Partition}
				if before, ok := c.prev.lag(k); ok {
					p.LagBefore = before.Lag
					p.Stalled = !grp.Stopped && before.Lag > 0 && p.Lag > 0 && p.Committed == before.Committed
				}
				cur.lags[k] = p
				r.Partitions = append(r.Partitions, p)
				if p.Lag < 0 || grp.Lag < 0 {
					grp.Lag = -1
				} else {
					grp.Lag += p.Lag
				}
			}
			r.Groups = append(r.Groups, grp)
		}
	}
	c.deadLetters(ctx, r)
}

// groupStopped reports whether a group in state has nobody consuming for
// it: Empty (no members, offsets kept) or Dead (no members, no metadata).
func groupStopped(state string) bool { return state == "Empty" || state == "Dead" }

// sumLag sets r.Lag and r.StoppedLag from r.Groups: -1 when the lag could
// not be read or a counted group's lag is unknown.
func (r *Report) sumLag() {
	r.Lag, r.StoppedLag = 0, 0
	if r.Unknown(partLag) {
		r.Lag, r.StoppedLag = -1, -1
		return
	}
	for _, g := range r.Groups {
		sum := &r.Lag
		if g.Stopped {
			sum = &r.StoppedLag
		}
		if g.Lag < 0 || *sum < 0 {
			*sum = -1
			continue
		}
		*sum += g.Lag
	}
}

func (s *sample) lag(k lagKey) (Partition, bool) {
	if s == nil {
		return Partition{}, false
	}
	p, ok := s.lags[k]
	return p, ok
}

// deadLetterReadTimeout bounds the reading of the latest dead letters.
const deadLetterReadTimeout = 15 * time.Second

func (c *Collector) deadLetters(ctx context.Context, r *Report) {
	if c.cfg.Kafka != nil {
		rctx, cancel := context.WithTimeout(ctx, deadLetterReadTimeout)
		defer cancel()
		topics, err := deadletters.Read(rctx, c.cfg.Kafka, deadletters.Options{Suffix: c.cfg.DeadLetterSuffix, Latest: c.cfg.DeadLetters})
		if err != nil {
			c.unread(r, partDeadLetters, "the dead-letter topics", err)
			return
		}
		for _, t := range topics {
			for i := range t.Letters {
				t.Letters[i].TraceURL = jaegerTraceURL(c.cfg.JaegerURL, t.Letters[i].TraceID)
			}
			r.DeadLetters = append(r.DeadLetters, DeadLetterTopic{Topic: t.Topic, Records: t.Records, Latest: t.Letters})
		}
		return
	}
	topics, err := c.cfg.Admin.ListTopics(ctx)
	if err != nil {
		c.unread(r, partDeadLetters, "listing topics (for the dead-letter topics)", err)
		return
	}
	var dlq []string
	for _, t := range topics.Names() {
		if strings.HasSuffix(t, c.cfg.DeadLetterSuffix) {
			dlq = append(dlq, t)
		}
	}
	if len(dlq) == 0 {
		return
	}
	starts, err := c.cfg.Admin.ListStartOffsets(ctx, dlq...)
	if err != nil {
		c.unread(r, partDeadLetters, fmt.Sprintf("listing start offsets of %q", dlq), err)
		return
	}
	ends, err := c.cfg.Admin.ListEndOffsets(ctx, dlq...)
	if err != nil {
		c.unread(r, partDeadLetters, fmt.Sprintf("listing end offsets of %q", dlq), err)
		return
	}
	sizes := map[string]int64{}
	ends.Each(func(e kadm.ListedOffset) {
		if e.Err != nil {
			c.unread(r, partDeadLetters, fmt.Sprintf("end offset of %s/%d", e.Topic, e.Partition), e.Err)
			return
		}
		s, ok := starts.Lookup(e.Topic, e.Partition)
		if !ok || s.Err != nil {
			err := errors.New("missing")
			if ok {
				err = s.Err
			}
			c.unread(r, partDeadLetters, fmt.Sprintf("start offset of %s/%d", e.Topic, e.Partition), err)
			return
		}
		sizes[e.Topic] += e.Offset - s.Offset
	})
	for _, t := range dlq {
		r.DeadLetters = append(r.DeadLetters, DeadLetterTopic{Topic: t, Records: sizes[t]})
	}
}

func (c *Collector) compareOutcomes(r *Report, cur *sample) {
	for i := range r.Outcomes {
		o := &r.Outcomes[i]
		if t := o.Applied + o.Duplicate + o.DeadLettered; t > 0 {
			o.Ratio = float64(o.Duplicate) / float64(t)
		}
		o.Recent = -1
		if c.prev == nil {
			continue
		}
		before := c.prev.outcomes[o.Scope]
		d := dedupe.Counts{Applied: o.Applied - before.Applied, Duplicate: o.Duplicate - before.Duplicate,
			DeadLettered: o.DeadLettered - before.DeadLettered}
		if d.Total() > 0 {
			o.Recent = float64(d.Duplicate) / float64(d.Total())
		}
	}
}

// problem is a problem for a person: what is wrong, then what to do
// (a command to run) and where the runbook says more (a section of
// docs/operations.md).
func problem(what, do, section string) string {
	return what + " -> do: " + do + " (docs/operations.md#" + section + ")"
}

// findProblems lists what needs a human, each with what to do: a part
// that could not be read (its figures are unknown, not zero: a blind spot
// is not health), a partition whose lag could not be read, a group with
// lag and no members, a partition whose committed offset stood still
// while it had lag over the whole interval, no relay active while outbox
// rows wait, more than one relay, the oldest outbox row old, parked
// outbox rows, retention violated, paused partitions and records held
// longer than Config.HeldProblemAfter (see heldProblems).
func (c *Collector) findProblems(r *Report) {
	r.Problems = []string{}
	for i, e := range r.Errors {
		do, section := "check the database: psql \"$DATABASE_URL\" -c 'select 1'", "exactlydatabaseunreachable"
		if part := r.errParts[i]; part == partLag || part == partDeadLetters {
			do, section = "check the brokers: kcat -L -b \"$EXACTLY_KAFKA_BROKERS\"", "inspect-and-status"
		}
		r.Problems = append(r.Problems, problem("could not read "+e+" (its figures are unknown, not zero)", do, section))
	}
	for _, p := range r.Partitions {
		if p.Error != "" {
			r.Problems = append(r.Problems, problem(fmt.Sprintf("could not read the lag of %s %s/%d: %s",
				ShowText(p.Group), ShowText(p.Topic), p.Partition, ShowError(redact.Error(errors.New(p.Error), c.cfg.Database).Error())),
				"check the brokers: kcat -L -b \"$EXACTLY_KAFKA_BROKERS\"", "inspect-and-status"))
		}
	}
	for _, g := range r.Groups {
		if g.Stopped && g.Lag > 0 {
			r.Problems = append(r.Problems, problem(fmt.Sprintf("group %s has %d records of lag and no members: nothing consumes them",
				ShowText(g.Group), g.Lag),
				"start the group's service; if the group is retired, delete it (kafka-consumer-groups --delete --group NAME) or leave it out with -groups",
				"exactlygrouplagnomembers"))
		}
	}
	var stalled []string
	for _, p := range r.Partitions {
		if p.Stalled {
			stalled = append(stalled, fmt.Sprintf("%s %s/%d (lag %d -> %d, committed %d)", ShowText(p.Group), ShowText(p.Topic), p.Partition, p.LagBefore, p.Lag, p.Committed))
		}
	}
	sort.Strings(stalled)
	if len(stalled) > 0 {
		r.Problems = append(r.Problems, problem(fmt.Sprintf("no offset committed over %v while records waited: %s",
			r.Interval, strings.Join(stalled, ", ")),
			"look at the held records above and the members' logs; rerun exactly status with a longer -interval to confirm",
			"exactlyconsumerstalled"))
	}
	c.relayProblems(r)
	if r.Outbox.Parked > 0 {
		r.Problems = append(r.Problems, problem(fmt.Sprintf("outbox %s: %d parked rows (the relay gave up on their topic and key), %d rows held behind them",
			r.Outbox.Table, r.Outbox.Parked, r.Outbox.Held),
			"exactly outbox parked; fix the cause; exactly outbox retry (or drop)", "exactlyoutboxrowsparked"))
	}
	c.heldProblems(r)
	if r.Guard.Violated {
		r.Problems = append(r.Problems, problem(fmt.Sprintf("guard %s: oldest row is %v old, retention is %v: the pruner is not keeping up",
			r.Guard.Table, r.Guard.Oldest.Round(time.Second), r.Guard.Retention),
			"make sure a consumer.Service or exactly prune runs against the table; look for \"dedupe: prune failed\" in its logs",
			"exactlyguardretentionatrisk"))
	}
}

// relayProblems: no relay active while the oldest outbox row is older than
// Config.OutboxProblemAfter, more than one holder, and the oldest row
// older than five times that with a relay active (it does not publish).
func (c *Collector) relayProblems(r *Report) {
	if r.Unknown(partRelay) || r.Unknown(partOutbox) {
		return
	}
	old := r.Outbox.Backlog > 0 && r.Outbox.Oldest > c.cfg.OutboxProblemAfter
	switch {
	case len(r.Relay.Holders) > 1:
		var hs []string
		for _, h := range r.Relay.Holders {
			hs = append(hs, h.String())
		}
		r.Problems = append(r.Problems, problem(fmt.Sprintf("outbox %s: more than one relay holds the %s: %s",
			r.Outbox.Table, r.Relay.Mechanism, strings.Join(hs, "; ")),
			"compare the relays' outbox table, schema and DATABASE_URL; restart the relays that should not be active",
			"exactlymorethanonerelay"))
	case !r.Relay.Active && old:
		last := "no relay ever held it"
		if len(r.Relay.Holders) == 1 {
			last = "last held by " + r.Relay.Holders[0].String()
		}
		r.Problems = append(r.Problems, problem(fmt.Sprintf("outbox %s: no relay is active (%s, %s) and %d rows wait, the oldest for %v",
			r.Outbox.Table, r.Relay.Mechanism, last, r.Outbox.Backlog, r.Outbox.Oldest.Round(time.Second)),
			"start a relay (exactly relay, or a consumer.Service); if one runs, read its logs for \"reconnecting\"; an expired lease is taken over within seconds",
			"exactlynoactiverelay"))
		return
	}
	if r.Relay.Active && r.Outbox.Backlog > 0 && r.Outbox.Oldest > 5*c.cfg.OutboxProblemAfter {
		r.Problems = append(r.Problems, problem(fmt.Sprintf("outbox %s: the relay is active but the oldest of %d rows waits for %v",
			r.Outbox.Table, r.Outbox.Backlog, r.Outbox.Oldest.Round(time.Second)),
			"read the active relay's logs (publish errors, broker reachability); exactly outbox parked",
			"exactlyoutboxoldestrowold"))
	}
}

// String names the holder for a person: who, since when, and the lease's
// epoch or the session's pid, client and application_name.
func (h RelayHolder) String() string {
	var b strings.Builder
	b.WriteString(ShowText(h.Holder))
	if !h.Since.IsZero() {
		fmt.Fprintf(&b, " since %s", h.Since.UTC().Format(time.RFC3339))
	}
	if h.Epoch > 0 {
		fmt.Fprintf(&b, " epoch %d owner %s", h.Epoch, h.Owner)
	}
	if h.Expired {
		b.WriteString(" (lease EXPIRED)")
	} else if h.Expires != nil {
		fmt.Fprintf(&b, " until %s", h.Expires.UTC().Format(time.RFC3339))
	}
	if h.Client != "" {
		fmt.Fprintf(&b, " client %s", ShowText(h.Client))
	}
	if h.Application != "" {
		fmt.Fprintf(&b, " application_name %s", ShowText(h.Application))
	}
	return b.String()
}
