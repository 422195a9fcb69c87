package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/tools/workload/credit"
	"github.com/exactly-go/exactly/internal/tools/workload/notify"
	"github.com/exactly-go/exactly/outbox"
)

// logRec is what the checker needs of one record: the guard key its
// consumer claims and the order it is about.
type logRec struct{ key, order string }

// commandKey is the credit handler's key of a command record.
func commandKey(r *kgo.Record) logRec {
	var c credit.Command
	if err := json.Unmarshal(r.Value, &c); err != nil {
		return logRec{}
	}
	return logRec{key: dedupe.NormalizeKey(credit.Key(c)), order: c.OrderID}
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
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offs}),
		kgo.FetchMaxWait(250*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("creating a reader of %s: %w", topic, err)
	}
	r.cl = cl
	return r, nil
}

func (r *logReader) close() { r.cl.Close() }

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
			r.recs[p][rec.Offset] = r.keyOf(rec)
			r.next[p] = max(r.next[p], rec.Offset+1)
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
	rows, err := s.h.pool.Query(ctx, `select key from exactly_guard where scope = $1 and key = any($2)`, oc.scope, keys)
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
// fills res, recording every violation.
func (h *harness) check(ctx context.Context, adm *kadm.Client, w *wl, samp *sampler, res *Result) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	P := h.cfg.Partitions
	bad := h.violation

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
	res.Events = sum(eEnds)

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

	// The ledger: one row per key.
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
	for _, c := range w.cmds {
		want[c.OrderID] = true
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
	if len(stray) > 0 {
		bad("ledger rows for orders never sent: %s", keysList(stray))
	}
	expected := map[int64]int64{}
	for _, c := range w.cmds {
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

	// The guard: one row per key, exactly the keys sent.
	guardKeys := func(scope string) (map[string]bool, error) {
		rows, err := h.pool.Query(ctx, `select key from exactly_guard where scope = $1`, scope)
		if err != nil {
			return nil, err
		}
		ks, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, err
		}
		m := make(map[string]bool, len(ks))
		for _, k := range ks {
			m[k] = true
		}
		return m, nil
	}
	gc, err := guardKeys("credit")
	if err != nil {
		return fmt.Errorf("chaos: reading guard rows: %w", err)
	}
	var noGuard []string
	for _, c := range w.cmds {
		if !gc[dedupe.NormalizeKey(credit.Key(c))] {
			noGuard = append(noGuard, credit.Key(c))
		}
	}
	if len(gc) != len(w.cmds) || len(noGuard) > 0 {
		bad("guard rows of scope credit: %d for %d keys; missing: %s", len(gc), len(w.cmds), keysList(noGuard))
	}

	// Outcome counters: every delivery accounted for.
	perPart := map[string][]Counts{"credit": make([]Counts, P), "notify": make([]Counts, P)}
	rows, err = h.pool.Query(ctx, `select scope, topic, partition, sum(applied)::bigint, sum(duplicate)::bigint, sum(dead_lettered)::bigint
		from exactly_guard_outcomes group by scope, topic, partition`)
	if err != nil {
		return fmt.Errorf("chaos: reading outcome counters: %w", err)
	}
	var scope, topic string
	var part int32
	var cnt Counts
	var strayCounts []string
	if _, err := pgx.ForEachRow(rows, []any{&scope, &topic, &part, &cnt.Applied, &cnt.Duplicate, &cnt.DeadLettered}, func() error {
		pp, ok := perPart[scope]
		if !ok || int(part) >= P || (scope == "credit") != (topic == credit.CommandsTopic) || (scope == "notify") != (topic == credit.EventsTopic) {
			strayCounts = append(strayCounts, fmt.Sprintf("%s/%s/%d", scope, topic, part))
			return nil
		}
		pp[part] = cnt
		return nil
	}); err != nil {
		return fmt.Errorf("chaos: reading outcome counters: %w", err)
	}
	if len(strayCounts) > 0 {
		bad("outcome counters for unexpected scope/topic/partition: %s", keysList(strayCounts))
	}
	for _, s := range []struct {
		scope string
		ends  []int64
		into  *Counts
	}{{"credit", cEnds, &res.Credit}, {"notify", eEnds, &res.Notify}} {
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
		if s.into.DeadLettered > 0 {
			bad("scope %s: %d deliveries dead-lettered, though every record is valid (an outage was taken for poison?)", s.scope, s.into.DeadLettered)
		}
	}
	res.Redelivered = res.Credit.Total() - res.Delivered
	if res.Credit.Applied != int64(len(w.cmds)) {
		bad("scope credit: applied=%d, want %d (one per key)", res.Credit.Applied, len(w.cmds))
	}

	// The outbox and the events: every credit published, under one id.
	var backlog int64
	if err := h.pool.QueryRow(ctx, `select count(*) from `+outbox.New().Table().Sanitize()).Scan(&backlog); err != nil {
		return fmt.Errorf("chaos: reading the outbox: %w", err)
	}
	if backlog != 0 {
		bad("outbox: %d rows never published", backlog)
	}
	idsOf := map[string]map[string]bool{}
	ids := map[string]bool{}
	var noID []string
	for p := range P {
		for o, r := range er.recs[p] {
			if r.key == "" {
				noID = append(noID, fmt.Sprintf("%d/%d", p, o))
				continue
			}
			ids[r.key] = true
			if idsOf[r.order] == nil {
				idsOf[r.order] = map[string]bool{}
			}
			idsOf[r.order][r.key] = true
		}
	}
	res.EventIDs = int64(len(ids))
	if len(noID) > 0 {
		bad("events without a message-id header (partition/offset): %s", keysList(noID))
	}
	var unpublished, multi []string
	for _, c := range w.cmds {
		switch m := len(idsOf[c.OrderID]); {
		case m == 0:
			unpublished = append(unpublished, c.OrderID)
		case m > 1:
			multi = append(multi, fmt.Sprintf("%s(x%d)", c.OrderID, m))
		}
	}
	if len(unpublished) > 0 {
		bad("account-credited never published for %d keys: %s", len(unpublished), keysList(unpublished))
	}
	if len(multi) > 0 {
		bad("account-credited emitted under several message ids (a doubled effect) for %d keys: %s", len(multi), keysList(multi))
	}

	// Notifications: one per credit.
	rows, err = h.pool.Query(ctx, `select order_id, count(*) from notifications group by order_id`)
	if err != nil {
		return fmt.Errorf("chaos: reading notifications: %w", err)
	}
	notes := map[string]int64{}
	if _, err := pgx.ForEachRow(rows, []any{&order, &n}, func() error { notes[order] = n; return nil }); err != nil {
		return fmt.Errorf("chaos: reading notifications: %w", err)
	}
	var noNote, twoNotes []string
	for _, c := range w.cmds {
		switch m := notes[c.OrderID]; {
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
	if res.Notifications != int64(len(w.cmds)) {
		bad("notifications: %d, want %d (one per credit)", res.Notifications, len(w.cmds))
	}
	gn, err := guardKeys("notify")
	if err != nil {
		return fmt.Errorf("chaos: reading guard rows: %w", err)
	}
	if int64(len(gn)) != res.EventIDs || res.Notify.Applied != res.EventIDs {
		bad("scope notify: %d guard rows and applied=%d for %d distinct message ids", len(gn), res.Notify.Applied, res.EventIDs)
	}

	// Dead-letter topics stay empty: every record is valid.
	for _, t := range []string{credit.CommandsTopic + DeadLetterSuffix, credit.EventsTopic + DeadLetterSuffix} {
		ends, err := endOffsets(ctx, adm, t, P)
		if err != nil {
			return fmt.Errorf("chaos: reading end offsets of %s: %w", t, err)
		}
		if m := sum(ends); m > 0 {
			bad("dead-letter topic %s holds %d records", t, m)
		}
	}
	return nil
}
