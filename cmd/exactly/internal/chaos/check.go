package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/credit"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/notify"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/outbox"
)

// logRec is what the checker needs of one record: the guard key its
// consumer claims and the order it is about; for a dead letter, the
// original record's coordinates (as key), its key (as order), its
// message id and whether it was truncated.
type logRec struct {
	key, order string
	id         string
	truncated  bool
	attempts   string
}

// commandKey is the credit handler's key of a command record; a record
// it cannot key (undecodable) is marked by its coordinates when it is
// dead-lettered.
func commandKey(r *kgo.Record) logRec {
	var c credit.Command
	if err := json.Unmarshal(r.Value, &c); err != nil || c.OrderID == "" {
		return logRec{key: dedupe.NormalizeKey(dedupe.DeadLetterKey(r.Topic, r.Partition, r.Offset))}
	}
	return logRec{key: dedupe.NormalizeKey(credit.Key(c)), order: c.OrderID}
}

// deadLetterKey describes a dead letter: the original record's
// "partition/offset", its key, the dead letter's message id and whether it
// was truncated.
func deadLetterKey(r *kgo.Record) logRec {
	var part, off string
	l := logRec{order: string(r.Key)}
	for _, h := range r.Headers {
		switch h.Key {
		case outbox.HeaderOriginalPartition:
			part = string(h.Value)
		case outbox.HeaderOriginalOffset:
			off = string(h.Value)
		case outbox.HeaderTruncated:
			l.truncated = string(h.Value) == "true"
		case outbox.HeaderAttempts:
			l.attempts = string(h.Value)
		case notify.MessageIDHeader:
			l.id = string(h.Value)
		}
	}
	l.key = part + "/" + off
	return l
}

// eventKey is the notify handler's key of an event record: its message id.
func eventKey(r *kgo.Record) logRec {
	var e credit.Credited
	_ = json.Unmarshal(r.Value, &e)
	for _, h := range r.Headers {
		if h.Key == notify.MessageIDHeader {
			return logRec{key: dedupe.NormalizeKey(string(h.Value)), order: e.OrderID}
		}
	}
	return logRec{order: e.OrderID}
}

// logReader reads a topic from its start, outside any group, and remembers
// every record by partition and offset. It is used by one goroutine at a
// time.
type logReader struct {
	topic string
	cl    *kgo.Client
	keyOf func(*kgo.Record) logRec
	recs  []map[int64]logRec
	next  []int64
}

func newLogReader(brokers []string, topic string, partitions int, keyOf func(*kgo.Record) logRec) (*logReader, error) {
	offs := map[int32]kgo.Offset{}
	r := &logReader{topic: topic, keyOf: keyOf, recs: make([]map[int64]logRec, partitions), next: make([]int64, partitions)}
	for p := range partitions {
		offs[int32(p)] = kgo.NewOffset().AtStart()
		r.recs[p] = map[int64]logRec{}
	}
	// Committed records, as a consumer reads them (the relay publishes in
	// Kafka transactions; a fenced or killed relay's are aborted), with
	// the transaction markers, so that a partition ending in one is read
	// to its end offset.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offs}),
		kgo.FetchMaxWait(250*time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		return nil, fmt.Errorf("creating a reader of %s: %w", topic, err)
	}
	r.cl = cl
	return r, nil
}

func (r *logReader) close() { r.cl.Close() }

// counts returns the records read per partition (transaction markers,
// which hold offsets too, are not records).
func (r *logReader) counts() []int64 {
	out := make([]int64, len(r.recs))
	for p, m := range r.recs {
		out[p] = int64(len(m))
	}
	return out
}

// catchUp reads until every partition p has been read up to want[p], or
// ctx ends.
func (r *logReader) catchUp(ctx context.Context, want []int64) error {
	for {
		done := true
		for p, w := range want {
			if r.next[p] < w {
				done = false
			}
		}
		if done {
			return nil
		}
		fs := r.cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		fs.EachRecord(func(rec *kgo.Record) {
			p := int(rec.Partition)
			if p >= len(r.recs) {
				return
			}
			r.next[p] = max(r.next[p], rec.Offset+1)
			if !rec.Attrs.IsControl() {
				r.recs[p][rec.Offset] = r.keyOf(rec)
			}
		})
	}
}

// offsetCheck verifies, for one group, that no committed offset is ahead
// of the database: every record below a committed offset has its key in
// the guard table (its transaction, or its duplicate's, committed).
type offsetCheck struct {
	group, scope string
	r            *logReader
	checked      []int64 // offsets below these were verified
}

// sampler runs the offset checks every second during the run.
type sampler struct {
	h       *harness
	adm     *kadm.Client
	checks  []*offsetCheck
	samples int
}

func (s *sampler) loop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ok := true
		for _, oc := range s.checks {
			if err := s.sample(ctx, oc); err != nil {
				ok = false
				s.h.log.Debug("chaos: offset sample skipped", "group", oc.group, "error", err)
			}
		}
		if ok {
			s.samples++
		}
	}
}

// sample reads oc.group's committed offsets, then (so that the guard rows
// it reads are at least as new) the guard rows of the records below them
// not verified yet, and reports every record whose key is missing.
func (s *sampler) sample(ctx context.Context, oc *offsetCheck) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	offs, err := s.adm.FetchOffsets(ctx, oc.group)
	if err != nil {
		return err
	}
	if err := offs.Error(); err != nil {
		return err
	}
	want := make([]int64, len(oc.checked))
	for p := range want {
		if c, ok := offs.Lookup(oc.r.topic, int32(p)); ok && c.At > 0 {
			want[p] = c.At
		}
	}
	rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
	_ = oc.r.catchUp(rctx, want) // what is not read yet is checked next time
	rcancel()
	type pos struct {
		p         int
		o, commit int64
		rec       logRec
	}
	var todo []pos
	var keys []string
	upto := make([]int64, len(want))
	for p := range want {
		upto[p] = max(oc.checked[p], min(want[p], oc.r.next[p]))
		for o := oc.checked[p]; o < upto[p]; o++ {
			if rec, ok := oc.r.recs[p][o]; ok {
				todo = append(todo, pos{p, o, want[p], rec})
				keys = append(keys, rec.key)
			}
		}
	}
	if len(todo) == 0 {
		return nil
	}
	rows, err := s.h.pool.Query(ctx, guardKeysSQL, oc.scope, keys)
	if err != nil {
		return err
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	present := make(map[string]bool, len(have))
	for _, k := range have {
		present[k] = true
	}
	var bad []string
	for _, t := range todo {
		if !present[t.rec.key] {
			bad = append(bad, fmt.Sprintf("%s@%d/%d(commit %d)", t.rec.key, t.p, t.o, t.commit))
		}
	}
	if len(bad) > 0 {
		s.h.violation("committed offset ahead of the database: group %s committed past %d records whose key has no guard row (key@partition/offset): %s",
			oc.group, len(bad), keysList(bad))
	}
	copy(oc.checked, upto)
	return nil
}

// guardKeysSQL reads which of the keys $2 of scope $1 have a guard row in
// any generation: the current one or a sealed one.
var guardKeysSQL = `select key from ` + dedupe.New().Table().Sanitize() + ` where scope = $1 and key = any($2)
union all select key from ` + dedupe.New().SealedView().Sanitize() + ` where scope = $1 and key = any($2)`

// endOffsets returns topic's end offset per partition.
func endOffsets(ctx context.Context, adm *kadm.Client, topic string, partitions int) ([]int64, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	if err := ends.Error(); err != nil {
		return nil, err
	}
	out := make([]int64, partitions)
	ends.Each(func(o kadm.ListedOffset) {
		if int(o.Partition) < partitions {
			out[o.Partition] = o.Offset
		}
	})
	return out, nil
}

func sum(xs []int64) int64 {
	var n int64
	for _, x := range xs {
		n += x
	}
	return n
}

// check is the ledger checker: it runs after the services stopped and
// fills res, recording every violation. Its sections run in order; each
// is a method of checker, and the first that cannot read what it checks
// ends the check with its error.
func (h *harness) check(ctx context.Context, adm *kadm.Client, w *wl, samp *sampler, res *Result) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	ck := &checker{h: h, adm: adm, w: w, samp: samp, res: res, P: h.cfg.Partitions}
	for _, section := range []func(context.Context) error{
		ck.logs, ck.offsets, ck.generations, ck.ledger, ck.guard, ck.keyOrder, ck.outcomes, ck.deadLetters,
		ck.outboxDrained, ck.events, ck.audit, ck.notifications, ck.deadLetterTopicEmpty,
	} {
		if err := section(ctx); err != nil {
			return err
		}
	}
	return nil
}

// checker is one run of the ledger checker: its inputs, and what its
// earlier sections read for the later ones.
type checker struct {
	h    *harness
	adm  *kadm.Client
	w    *wl
	samp *sampler
	res  *Result
	P    int // partitions per topic

	cEnds, eEnds []int64    // end offsets of the commands and events topics (logs)
	cr, er       *logReader // their records (logs)
	good         []credit.Command
	gc           map[string]guardRow // guard rows of scope credit by key (guard)
	junk         []string            // guard keys of the undecodable records (guard)
}

// logs reads the commands and events topics back to their end offsets and
// checks that every acknowledged command is in the commands topic.
func (ck *checker) logs(ctx context.Context) error {
	w, res, P, bad, samp, adm := ck.w, ck.res, ck.P, ck.h.violation, ck.samp, ck.adm
	// The logs.
	cEnds, err := endOffsets(ctx, adm, credit.CommandsTopic, P)
	if err != nil {
		return fmt.Errorf("chaos: reading end offsets of %s: %w", credit.CommandsTopic, err)
	}
	eEnds, err := endOffsets(ctx, adm, credit.EventsTopic, P)
	if err != nil {
		return fmt.Errorf("chaos: reading end offsets of %s: %w", credit.EventsTopic, err)
	}
	cr, er := samp.checks[0].r, samp.checks[1].r
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	err = cr.catchUp(rctx, cEnds)
	if err == nil {
		err = er.catchUp(rctx, eEnds)
	}
	rcancel()
	if err != nil {
		return fmt.Errorf("chaos: reading the topics back: %w", err)
	}
	res.Delivered = sum(cEnds)
	// The relay's transaction markers hold offsets too: count records.
	res.Events = 0
	for p := range P {
		res.Events += int64(len(er.recs[p]))
	}

	inLog := map[string]int{}
	for p := range P {
		for _, r := range cr.recs[p] {
			inLog[r.order]++
		}
	}
	var missing []string
	for _, c := range w.cmds {
		if inLog[c.OrderID] == 0 {
			missing = append(missing, c.OrderID)
		}
	}
	if len(missing) > 0 {
		bad("harness/broker: %d acknowledged commands are not in the commands topic: %s", len(missing), keysList(missing))
	}
	ck.cEnds, ck.eEnds, ck.cr, ck.er = cEnds, eEnds, cr, er
	return nil
}

// offsets takes a last sample of the committed offsets, with everything
// read, and checks that both groups have no lag left.
func (ck *checker) offsets(ctx context.Context) error {
	bad, samp, adm := ck.h.violation, ck.samp, ck.adm
	// Offsets: a last sample with everything read, then lag zero.
	for _, oc := range samp.checks {
		if err := samp.sample(ctx, oc); err != nil {
			return fmt.Errorf("chaos: checking the committed offsets of %s: %w", oc.group, err)
		}
	}
	for _, g := range []struct{ group, topic string }{{CreditGroup, credit.CommandsTopic}, {NotifyGroup, credit.EventsTopic}} {
		lag, err := groupLag(ctx, adm, g.group, g.topic)
		if err != nil {
			return fmt.Errorf("chaos: reading the lag of %s: %w", g.group, err)
		}
		if lag != 0 {
			bad("group %s has %d records of %s not committed after the drain", g.group, lag, g.topic)
		}
	}
	return nil
}

// generations reads the guard's generations: how many times the current
// one was sealed (a violation when the run asked for rotations and none
// happened) and each one's rows.
func (ck *checker) generations(ctx context.Context) error {
	g := dedupe.New()
	gens, err := g.Generations(ctx, ck.h.pool)
	if err != nil {
		return fmt.Errorf("chaos: reading the guard's generations: %w", err)
	}
	for _, gen := range gens {
		if !gen.Until.IsZero() {
			ck.res.Rotations++
		}
		ck.res.Generations = append(ck.res.Generations, fmt.Sprintf("%s=%d", gen.Name, gen.Rows))
	}
	if ck.h.cfg.GenerationSpan > 0 && ck.res.Rotations == 0 {
		ck.h.violation("guard generations: no rotation with a generation span of %s (the pruners never sealed the current generation)", ck.h.cfg.GenerationSpan)
	}
	return nil
}

// ledger checks one ledger row per valid key, none for a key that must be
// dead-lettered, none for an order never sent, and the balances.
func (ck *checker) ledger(ctx context.Context) error {
	h, w, res, bad := ck.h, ck.w, ck.res, ck.h.violation
	// The ledger: one row per valid key, none for a key that must be
	// dead-lettered.
	rows, err := h.pool.Query(ctx, `select order_id, count(*) from ledger group by order_id`)
	if err != nil {
		return fmt.Errorf("chaos: reading the ledger: %w", err)
	}
	ledger := map[string]int64{}
	var order string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&order, &n}, func() error { ledger[order] = n; return nil }); err != nil {
		return fmt.Errorf("chaos: reading the ledger: %w", err)
	}
	want := map[string]bool{}
	var good []credit.Command
	var badApplied []string
	for _, c := range w.cmds {
		want[c.OrderID] = true
		if w.bad(c.OrderID) {
			if ledger[c.OrderID] > 0 {
				badApplied = append(badApplied, c.OrderID)
			}
			continue
		}
		good = append(good, c)
		switch m := ledger[c.OrderID]; {
		case m == 0:
			res.Lost = append(res.Lost, c.OrderID)
		case m > 1:
			res.Doubled = append(res.Doubled, fmt.Sprintf("%s(x%d)", c.OrderID, m))
		}
	}
	var stray []string
	for o, m := range ledger {
		res.Effects += m
		if !want[o] {
			stray = append(stray, o)
		}
	}
	if len(res.Lost) > 0 {
		bad("lost: %d keys have no ledger row: %s", len(res.Lost), keysList(res.Lost))
	}
	if len(res.Doubled) > 0 {
		bad("doubled: %d keys have more than one ledger row: %s", len(res.Doubled), keysList(res.Doubled))
	}
	if len(badApplied) > 0 {
		bad("applied: %d keys whose handler swallows an error or emits an oversized event have a ledger row: %s", len(badApplied), keysList(badApplied))
	}
	if len(stray) > 0 {
		bad("ledger rows for orders never sent: %s", keysList(stray))
	}
	expected := map[int64]int64{}
	for _, c := range good {
		expected[c.Account] += c.Amount
	}
	rows, err = h.pool.Query(ctx, `select account, sum(amount)::bigint from ledger group by account`)
	if err != nil {
		return fmt.Errorf("chaos: reading balances: %w", err)
	}
	var acct, bal int64
	var wrong []string
	if _, err := pgx.ForEachRow(rows, []any{&acct, &bal}, func() error {
		if bal != expected[acct] {
			wrong = append(wrong, fmt.Sprintf("account %d: %d, want %d", acct, bal, expected[acct]))
		}
		return nil
	}); err != nil {
		return fmt.Errorf("chaos: reading balances: %w", err)
	}
	if len(wrong) > 0 {
		bad("balances wrong: %s", keysList(wrong))
	}
	ck.good = good
	return nil
}

// guard checks the guard rows of scope credit: one per key sent, applied
// or dead_lettered as the key requires, and the marks by coordinates of
// the undecodable and other dead-lettered records.
func (ck *checker) guard(ctx context.Context) error {
	h, w, P, bad, cr := ck.h, ck.w, ck.P, ck.h.violation, ck.cr
	// The guard: a row per key, exactly the keys sent (plus the marks of
	// undecodable records); applied for a valid key, dead_lettered for
	// the others, with the coordinates of the record dead-lettered.
	gc, err := h.guardRows(ctx, "credit", ck.res)
	if err != nil {
		return fmt.Errorf("chaos: reading guard rows: %w", err)
	}
	var noGuard, wrongState []string
	for _, c := range w.cmds {
		k := dedupe.NormalizeKey(credit.Key(c))
		g, ok := gc[k]
		switch wantState := map[bool]string{false: "applied", true: "dead_lettered"}[w.bad(c.OrderID)]; {
		case !ok:
			noGuard = append(noGuard, credit.Key(c))
		case g.state != wantState:
			wrongState = append(wrongState, fmt.Sprintf("%s=%s(want %s)", k, g.state, wantState))
		}
	}
	// The marks by coordinates: one per undecodable record (from the
	// log), and one per other record dead-lettered; each dead_lettered.
	var junk []string // guard keys of the undecodable records
	for p := range P {
		for _, r := range cr.recs[p] {
			if r.order == "" {
				junk = append(junk, r.key)
				if _, ok := gc[r.key]; !ok {
					noGuard = append(noGuard, r.key)
				}
			}
		}
	}
	marks := 0
	for k, g := range gc {
		if strings.HasPrefix(k, "dead-letter:") {
			marks++
			if g.state != "dead_lettered" {
				wrongState = append(wrongState, fmt.Sprintf("%s=%s(want dead_lettered)", k, g.state))
			}
		}
	}
	if len(gc)-marks != len(w.cmds) || len(noGuard) > 0 {
		bad("guard rows of scope credit: %d (and %d marks by coordinates) for %d keys; missing: %s", len(gc)-marks, marks, len(w.cmds), keysList(noGuard))
	}
	if len(wrongState) > 0 {
		bad("guard rows of scope credit in the wrong state: %s", keysList(wrongState))
	}
	ck.gc, ck.junk = gc, junk
	return nil
}

// keyOrder checks that each key's records applied in offset order: the
// consumers run records of different keys of a partition concurrently
// (key concurrency is on in the services), but of one key's copies in a
// partition the lowest offset must be the one that claimed the key, so the
// guard row of each valid key holds the lowest offset of its copies in the
// guard row's partition.
func (ck *checker) keyOrder(context.Context) error {
	w, P, bad, cr, gc := ck.w, ck.P, ck.h.violation, ck.cr, ck.gc
	first := map[string][]int64{} // key -> lowest offset per partition (-1: none)
	for p := range P {
		for off, r := range cr.recs[p] {
			if r.order == "" {
				continue
			}
			f := first[r.key]
			if f == nil {
				f = make([]int64, P)
				for i := range f {
					f[i] = -1
				}
				first[r.key] = f
			}
			if f[p] < 0 || off < f[p] {
				f[p] = off
			}
		}
	}
	var outOfOrder []string
	for _, c := range w.cmds {
		if w.bad(c.OrderID) {
			continue
		}
		k := dedupe.NormalizeKey(credit.Key(c))
		g, ok := gc[k]
		if !ok || g.state != "applied" || int(g.partition) >= P || g.partition < 0 {
			continue // the guard section reports it
		}
		if low := first[k]; low != nil && low[g.partition] >= 0 && low[g.partition] != g.offset {
			outOfOrder = append(outOfOrder, fmt.Sprintf("%s(applied at %d/%d, first copy at %d)", k, g.partition, g.offset, low[g.partition]))
		}
	}
	if len(outOfOrder) > 0 {
		bad("keys whose later copy applied before their first in its partition: %s", keysList(outOfOrder))
	}
	return nil
}

// outcomes checks that the outcome counters account for every delivery.
func (ck *checker) outcomes(ctx context.Context) error {
	h, res, P, bad, good := ck.h, ck.res, ck.P, ck.h.violation, ck.good
	// Outcome counters: every delivery accounted for.
	perPart := map[string][]Counts{"credit": make([]Counts, P), "notify": make([]Counts, P)}
	counted, err := dedupe.New().OutcomeRows(ctx, h.pool)
	if err != nil {
		return fmt.Errorf("chaos: reading outcome counters: %w", err)
	}
	var strayCounts []string
	for _, o := range counted {
		pp, ok := perPart[o.Scope]
		if !ok || int(o.Partition) >= P || (o.Scope == "credit") != (o.Topic == credit.CommandsTopic) || (o.Scope == "notify") != (o.Topic == credit.EventsTopic) {
			strayCounts = append(strayCounts, fmt.Sprintf("%s/%s/%d", o.Scope, o.Topic, o.Partition))
			continue
		}
		pp[o.Partition] = Counts{Applied: o.Applied, Duplicate: o.Duplicate, DeadLettered: o.DeadLettered}
	}
	if len(strayCounts) > 0 {
		bad("outcome counters for unexpected scope/topic/partition: %s", keysList(strayCounts))
	}
	for _, s := range []struct {
		scope string
		ends  []int64
		into  *Counts
	}{{"credit", ck.cr.counts(), &res.Credit}, {"notify", ck.er.counts(), &res.Notify}} {
		var short []string
		for p, c := range perPart[s.scope] {
			s.into.Applied += c.Applied
			s.into.Duplicate += c.Duplicate
			s.into.DeadLettered += c.DeadLettered
			if c.Total() < s.ends[p] {
				short = append(short, fmt.Sprintf("partition %d: %d counted < %d in the log", p, c.Total(), s.ends[p]))
			}
		}
		if len(short) > 0 {
			bad("scope %s: deliveries not accounted for: %s", s.scope, keysList(short))
		}
	}
	if res.Notify.DeadLettered > 0 {
		bad("scope notify: %d deliveries dead-lettered, though every event is valid (an outage was taken for poison?)", res.Notify.DeadLettered)
	}
	res.Redelivered = res.Credit.Total() - res.Delivered
	if res.Credit.Applied != int64(len(good)) {
		bad("scope credit: applied=%d, want %d (one per valid key)", res.Credit.Applied, len(good))
	}
	return nil
}

// deadLetters checks the commands' dead-letter topic: one dead letter per
// record dead-lettered, never two, at the last attempt, none for a valid
// key.
func (ck *checker) deadLetters(ctx context.Context) error {
	h, w, res, P, bad, adm, gc, junk := ck.h, ck.w, ck.res, ck.P, ck.h.violation, ck.adm, ck.gc, ck.junk
	// Dead letters: one per record dead-lettered, never two. Every
	// undecodable record has one (truncated: it is over the limit with
	// the dead-letter headers); every key that must be dead-lettered has
	// one for the record its guard row names; no valid key has one.
	dEnds, err := endOffsets(ctx, adm, credit.CommandsTopic+DeadLetterSuffix, P)
	if err != nil {
		return fmt.Errorf("chaos: reading end offsets of %s: %w", credit.CommandsTopic+DeadLetterSuffix, err)
	}
	dr, err := newLogReader(h.addrs, credit.CommandsTopic+DeadLetterSuffix, P, deadLetterKey)
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	defer dr.close()
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	err = dr.catchUp(rctx, dEnds)
	rcancel()
	if err != nil {
		return fmt.Errorf("chaos: reading %s back: %w", dr.topic, err)
	}
	res.DeadLetters = sum(dr.counts())
	dlIDs := map[string]map[string]bool{} // coordinates -> message ids
	dlOrder := map[string]string{}        // coordinates -> original key
	var dlNoID, dlAttempts []string
	for p := range P {
		for o, r := range dr.recs[p] {
			if r.id == "" {
				dlNoID = append(dlNoID, fmt.Sprintf("%d/%d", p, o))
			}
			// A handler's failure (swallowed or returned) is retried:
			// dead-lettered at its last attempt, not as poison at once.
			if w.bad(r.order) && r.attempts != strconv.Itoa(serviceMaxAttempts) {
				dlAttempts = append(dlAttempts, fmt.Sprintf("%s(%s attempts)", r.order, r.attempts))
			}
			if dlIDs[r.key] == nil {
				dlIDs[r.key] = map[string]bool{}
			}
			dlIDs[r.key][r.id] = true
			dlOrder[r.key] = r.order
			if r.truncated {
				res.Truncated++
			}
		}
	}
	if len(dlNoID) > 0 {
		bad("dead letters without a message-id header (partition/offset): %s", keysList(dlNoID))
	}
	if len(dlAttempts) > 0 {
		bad("dead letters of failing handlers not at their last attempt (%d): %s", serviceMaxAttempts, keysList(dlAttempts))
	}
	var dlDoubled, dlGood, dlMissing []string
	var dlDistinct int64
	for at, ids := range dlIDs {
		dlDistinct += int64(len(ids))
		if len(ids) > 1 {
			dlDoubled = append(dlDoubled, fmt.Sprintf("%s(%s x%d)", at, dlOrder[at], len(ids)))
		}
		if o := dlOrder[at]; o != "" && !w.bad(o) {
			dlGood = append(dlGood, fmt.Sprintf("%s(%s)", o, at))
		}
	}
	for _, c := range w.cmds {
		if g, ok := gc[dedupe.NormalizeKey(credit.Key(c))]; ok && w.bad(c.OrderID) {
			if at := fmt.Sprintf("%d/%d", g.partition, g.offset); len(dlIDs[at]) == 0 {
				dlMissing = append(dlMissing, fmt.Sprintf("%s(%s)", c.OrderID, at))
			}
		}
	}
	for k, g := range gc {
		// Every record marked dead-lettered by its coordinates (the
		// undecodable ones included, checked above to be marked) has its
		// dead letter.
		if strings.HasPrefix(k, "dead-letter:") && len(dlIDs[fmt.Sprintf("%d/%d", g.partition, g.offset)]) == 0 {
			dlMissing = append(dlMissing, k)
		}
	}
	if len(dlDoubled) > 0 {
		bad("dead letters doubled: %d records were dead-lettered more than once (partition/offset): %s", len(dlDoubled), keysList(dlDoubled))
	}
	if len(dlGood) > 0 {
		bad("dead letters of valid commands (an outage taken for poison?): %s", keysList(dlGood))
	}
	if len(dlMissing) > 0 {
		bad("dead letters missing for records that must be dead-lettered: %s", keysList(dlMissing))
	}
	if res.Truncated < int64(len(junk)) {
		bad("dead letters: %d truncated, want at least %d (one per undecodable record of %d bytes)", res.Truncated, len(junk), UndecodableBytes)
	}
	if res.Credit.DeadLettered != dlDistinct {
		bad("scope credit: dead_lettered=%d, but %s holds %d distinct dead letters", res.Credit.DeadLettered, dr.topic, dlDistinct)
	}
	return nil
}

// outboxDrained checks that the outbox is empty once the parked rows were
// retried.
func (ck *checker) outboxDrained(ctx context.Context) error {
	h, bad := ck.h, ck.h.violation
	// The outbox: empty once the parked rows were retried.
	var backlog, parked int64
	if err := h.pool.QueryRow(ctx, `select count(*), count(*) filter (where parked_at is not null) from `+outbox.New().Table().Sanitize()).Scan(&backlog, &parked); err != nil {
		return fmt.Errorf("chaos: reading the outbox: %w", err)
	}
	if backlog != 0 {
		bad("outbox: %d rows never published (%d of them parked)", backlog, parked)
	}
	return nil
}

// events checks that every valid credit was published under one id.
func (ck *checker) events(ctx context.Context) error {
	h, w, res, er := ck.h, ck.w, ck.res, ck.er
	// The events: every valid credit published, under one id; nothing
	// for a dead-lettered key.
	res.EventIDs = h.checkPublished(er, credit.EventsTopic, w, func(credit.Command) bool { return true })
	return nil
}

// audit checks the audit events (the denied topic): published once each
// after the retry.
func (ck *checker) audit(ctx context.Context) error {
	h, w, res, P, adm := ck.h, ck.w, ck.res, ck.P, ck.adm
	// The audit events (the denied topic): published once each after the
	// retry.
	aEnds, err := endOffsets(ctx, adm, AuditTopic, P)
	if err != nil {
		return fmt.Errorf("chaos: reading end offsets of %s: %w", AuditTopic, err)
	}
	ar, err := newLogReader(h.addrs, AuditTopic, P, eventKey)
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	defer ar.close()
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	err = ar.catchUp(rctx, aEnds)
	rcancel()
	if err != nil {
		return fmt.Errorf("chaos: reading %s back: %w", AuditTopic, err)
	}
	res.Audit = sum(aEnds)
	res.AuditIDs = h.checkPublished(ar, AuditTopic, w, func(c credit.Command) bool { return c.Account < 2 })
	return nil
}

// notifications checks one notification per valid credit, and the guard
// rows of scope notify.
func (ck *checker) notifications(ctx context.Context) error {
	h, w, res, bad, good := ck.h, ck.w, ck.res, ck.h.violation, ck.good
	// Notifications: one per valid credit.
	rows, err := h.pool.Query(ctx, `select order_id, count(*) from notifications group by order_id`)
	if err != nil {
		return fmt.Errorf("chaos: reading notifications: %w", err)
	}
	notes := map[string]int64{}
	var order string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&order, &n}, func() error { notes[order] = n; return nil }); err != nil {
		return fmt.Errorf("chaos: reading notifications: %w", err)
	}
	var noNote, twoNotes, badNote []string
	for _, c := range w.cmds {
		m := notes[c.OrderID]
		switch {
		case w.bad(c.OrderID):
			if m > 0 {
				badNote = append(badNote, c.OrderID)
			}
		case m == 0:
			noNote = append(noNote, c.OrderID)
		case m > 1:
			twoNotes = append(twoNotes, fmt.Sprintf("%s(x%d)", c.OrderID, m))
		}
	}
	for _, m := range notes {
		res.Notifications += m
	}
	if len(noNote) > 0 {
		bad("notifications missing for %d credits: %s", len(noNote), keysList(noNote))
	}
	if len(twoNotes) > 0 {
		bad("notifications doubled for %d credits: %s", len(twoNotes), keysList(twoNotes))
	}
	if len(badNote) > 0 {
		bad("notifications for %d dead-lettered commands: %s", len(badNote), keysList(badNote))
	}
	if res.Notifications != int64(len(good)) {
		bad("notifications: %d, want %d (one per valid credit)", res.Notifications, len(good))
	}
	gn, err := h.guardRows(ctx, "notify", res)
	if err != nil {
		return fmt.Errorf("chaos: reading guard rows: %w", err)
	}
	if int64(len(gn)) != res.EventIDs || res.Notify.Applied != res.EventIDs {
		bad("scope notify: %d guard rows and applied=%d for %d distinct message ids", len(gn), res.Notify.Applied, res.EventIDs)
	}
	return nil
}

// deadLetterTopicEmpty checks that the events' dead-letter topic stays
// empty: every event is valid.
func (ck *checker) deadLetterTopicEmpty(ctx context.Context) error {
	P, bad, adm := ck.P, ck.h.violation, ck.adm
	// The events' dead-letter topic stays empty: every event is valid.
	t := credit.EventsTopic + DeadLetterSuffix
	ends, err := endOffsets(ctx, adm, t, P)
	if err != nil {
		return fmt.Errorf("chaos: reading end offsets of %s: %w", t, err)
	}
	if m := sum(ends); m > 0 {
		bad("dead-letter topic %s holds %d records", t, m)
	}
	return nil
}

// guardRowsSQL reads the guard rows of scope $1 of every generation, the
// current one (named "current") and the sealed ones.
var guardRowsSQL = `select key, state, coalesce(kafka_partition, -1), coalesce(kafka_offset, -1), 'current' from ` + dedupe.New().Table().Sanitize() + ` where scope = $1
union all select key, state, coalesce(kafka_partition, -1), coalesce(kafka_offset, -1), generation from ` + dedupe.New().SealedView().Sanitize() + ` where scope = $1`

// guardRows reads the guard rows of scope by key, from every generation,
// and returns each key's row that decides it: its applied row, otherwise
// its newest (a key that sealed generations hold only dead-lettered by
// other records is taken over in the current generation, by design). A
// key applied in more than one generation was applied again across a
// generation boundary: it is recorded in res.CrossGeneration and reported
// as a violation. Keys with rows in several generations are counted in
// res.SeveralGenerations.
func (h *harness) guardRows(ctx context.Context, scope string, res *Result) (map[string]guardRow, error) {
	rows, err := h.pool.Query(ctx, guardRowsSQL, scope)
	if err != nil {
		return nil, err
	}
	type genRow struct {
		gen string
		guardRow
	}
	in := map[string][]genRow{}
	var k string
	var r genRow
	if _, err := pgx.ForEachRow(rows, []any{&k, &r.state, &r.partition, &r.offset, &r.gen}, func() error {
		in[k] = append(in[k], r)
		return nil
	}); err != nil {
		return nil, err
	}
	m := make(map[string]guardRow, len(in))
	var cross []string
	for k, rs := range in {
		// Oldest first: sealed generations' names end in their seal
		// time; the current generation is the newest.
		slices.SortFunc(rs, func(a, b genRow) int {
			return strings.Compare(strings.Replace(a.gen, "current", "~", 1), strings.Replace(b.gen, "current", "~", 1))
		})
		m[k] = rs[len(rs)-1].guardRow
		var applied []string
		for _, r := range rs {
			if r.state == "applied" {
				m[k] = r.guardRow
				applied = append(applied, r.gen)
			}
		}
		if len(rs) > 1 {
			res.SeveralGenerations++
		}
		if len(applied) > 1 {
			cross = append(cross, fmt.Sprintf("%s(%s)", k, strings.Join(applied, ",")))
		}
	}
	if len(cross) > 0 {
		res.CrossGeneration = append(res.CrossGeneration, cross...)
		h.violation("scope %s: %d keys applied in more than one guard generation (applied again across a generation boundary): %s", scope, len(cross), keysList(cross))
	}
	return m, nil
}

// serviceMaxAttempts is the services' EXACTLY_MAX_ATTEMPTS (its default).
const serviceMaxAttempts = 5

// guardRow is a guard row's state and the coordinates of its record.
type guardRow struct {
	state     string
	partition int32
	offset    int64
}

// checkPublished checks the events read by r: every valid command that
// emits (per emits) has exactly one message id in the topic, a command
// that must be dead-lettered or does not emit has none. It returns the
// distinct message ids.
func (h *harness) checkPublished(r *logReader, name string, w *wl, emits func(credit.Command) bool) int64 {
	idsOf := map[string]map[string]bool{}
	ids := map[string]bool{}
	var noID []string
	for p := range r.recs {
		for o, rec := range r.recs[p] {
			if rec.key == "" {
				noID = append(noID, fmt.Sprintf("%d/%d", p, o))
				continue
			}
			ids[rec.key] = true
			if idsOf[rec.order] == nil {
				idsOf[rec.order] = map[string]bool{}
			}
			idsOf[rec.order][rec.key] = true
		}
	}
	if len(noID) > 0 {
		h.violation("%s: events without a message-id header (partition/offset): %s", name, keysList(noID))
	}
	var unpublished, multi, unwanted []string
	for _, c := range w.cmds {
		m := len(idsOf[c.OrderID])
		switch {
		case w.bad(c.OrderID) || !emits(c):
			if m > 0 {
				unwanted = append(unwanted, c.OrderID)
			}
		case m == 0:
			unpublished = append(unpublished, c.OrderID)
		case m > 1:
			multi = append(multi, fmt.Sprintf("%s(x%d)", c.OrderID, m))
		}
	}
	if len(unpublished) > 0 {
		h.violation("%s never published for %d keys: %s", name, len(unpublished), keysList(unpublished))
	}
	if len(multi) > 0 {
		h.violation("%s emitted under several message ids (a doubled effect) for %d keys: %s", name, len(multi), keysList(multi))
	}
	if len(unwanted) > 0 {
		h.violation("%s published for %d commands that emit none (dead-lettered, or not audited): %s", name, len(unwanted), keysList(unwanted))
	}
	return int64(len(ids))
}
