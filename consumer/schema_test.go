package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// A plain Consumer (consumer.New(...).Run, not a Service) whose guard table
// is missing, or behind its migrations, fails at once with a *SchemaError
// naming it, without joining the group; after Migrate it joins and runs.
func TestConsumerRunFailsFastOnMissingGuardTable(t *testing.T) {
	pool := testenv.DB(t)
	kc := testenv.Kafka(t, 1, "credits")
	var joins atomic.Int32
	joined := make(chan struct{}, 1)
	for _, key := range []kmsg.Key{kmsg.JoinGroup, kmsg.ConsumerGroupHeartbeat} {
		kc.ControlKey(key.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
			kc.KeepControl()
			joins.Add(1)
			select {
			case joined <- struct{}{}:
			default:
			}
			return nil, nil, false
		})
	}
	cfg := testConfig(testenv.Brokers(kc), "g", "credits")
	cfg.GuardTable = "s.guard"
	g := dedupe.New(dedupe.WithTable("s", "guard"))
	ctx := context.Background()
	run := func(what string) *consumer.SchemaError {
		t.Helper()
		c, err := consumer.New(cfg, pool, consumer.Handle(creditHandler(0)))
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		err = c.Run(runCtx) // returns by itself: nothing cancels runCtx
		var se *consumer.SchemaError
		if !errors.As(err, &se) || se.Table != `"s"."guard"` {
			t.Fatalf("Run %s = %v, want a *SchemaError for \"s\".\"guard\"", what, err)
		}
		if runCtx.Err() != nil {
			t.Fatalf("Run %s waited for the deadline instead of failing fast", what)
		}
		if n := joins.Load(); n != 0 {
			t.Fatalf("Run %s sent %d join requests; it must fail before joining the group", what, n)
		}
		return se
	}

	if se := run("before Migrate"); !se.Missing || se.Current != 0 || se.Latest < 1 {
		t.Fatalf("before Migrate: %+v, want Missing at version 0", se)
	}
	if err := g.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// One version behind: the newest recorded version is forgotten.
	if _, err := pool.Exec(ctx, `delete from exactly_schema_migrations where component = 'dedupe:"s"."guard"'
		and version = (select max(version) from exactly_schema_migrations where component = 'dedupe:"s"."guard"')`); err != nil {
		t.Fatal(err)
	}
	if se := run("one version behind"); se.Missing || se.Current != se.Latest-1 {
		t.Fatalf("one version behind: %+v, want not Missing, Current = Latest-1", se)
	}
	// Ahead: a newer build migrated the table (a build that does not know
	// a schema's rules, such as checking the guard's sealed generations
	// before a claim, must not run on it).
	if _, err := pool.Exec(ctx, `insert into exactly_schema_migrations (component, version, name)
		values ('dedupe:"s"."guard"', 1000, '1000_future.sql')`); err != nil {
		t.Fatal(err)
	}
	if se := run("migrated by a newer build"); se.Missing || se.Current != 1000 || !strings.Contains(se.Error(), "newer than this build") {
		t.Fatalf("migrated by a newer build: %+v (%v), want Current 1000, saying it is newer", se, se)
	}
	if _, err := pool.Exec(ctx, `delete from exactly_schema_migrations where version = 1000`); err != nil {
		t.Fatal(err)
	}
	// Dropped after it was migrated: missing, though versions are recorded.
	if _, err := pool.Exec(ctx, `drop schema s cascade`); err != nil {
		t.Fatal(err)
	}
	if se := run("after drop schema"); !se.Missing || !strings.Contains(se.Error(), "run migrate") {
		t.Fatalf("after drop schema: %+v (%v), want Missing, saying to run migrate", se, se)
	}
	// Migrated again, it runs: it joins the group and returns when cancelled.
	if err := g.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(cfg, pool, consumer.Handle(creditHandler(0)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	select {
	case <-joined:
	case err := <-done:
		t.Fatalf("Run after Migrate returned %v without joining the group", err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run after Migrate did not join the group within 30 s")
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Run after Migrate, cancelled: %v, want nil or context.Canceled", err)
	}
}

// logCapture is a slog.Handler that keeps every record and wakes waiters.
type logCapture struct {
	mu      sync.Mutex
	records []slog.Record
	changed chan struct{}
}

func newLogCapture() *logCapture { return &logCapture{changed: make(chan struct{}, 1)} }

func (l *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCapture) WithAttrs([]slog.Attr) slog.Handler       { return &attrsCapture{l} }
func (l *logCapture) WithGroup(string) slog.Handler            { return &attrsCapture{l} }
func (l *logCapture) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.records = append(l.records, r.Clone())
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
	return nil
}

// attrsCapture drops the logger's attributes and groups; the tests read
// each record's own.
type attrsCapture struct{ *logCapture }

func (a *attrsCapture) WithAttrs([]slog.Attr) slog.Handler { return a }
func (a *attrsCapture) WithGroup(string) slog.Handler      { return a }

// matching returns the records whose message contains msg.
func (l *logCapture) matching(msg string) []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []slog.Record
	for _, r := range l.records {
		if strings.Contains(r.Message, msg) {
			out = append(out, r)
		}
	}
	return out
}

// await blocks until n records' messages contain msg, failing t after
// timeout, and returns them.
func (l *logCapture) await(t *testing.T, timeout time.Duration, n int, msg string) []slog.Record {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		if rs := l.matching(msg); len(rs) >= n {
			return rs
		}
		select {
		case <-l.changed:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %d log records saying %q", timeout, n, msg)
		}
	}
}

func attr(r slog.Record, key string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// The guard table dropped under a running consumer: the partition's
// batches fail on the claim, and the log says the table is missing and to
// run migrate (not that the database is down); the partition is held, its
// record neither dead-lettered nor skipped however many times it fails
// (MaxAttempts is 1). Migrate creates the table again and the record is
// applied. A column dropped from it (a table behind its migrations) is
// reported the same way.
func TestConsumerSaysGuardTableMissingWhileRunning(t *testing.T) {
	pool := testenv.DB(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `create table ledger(id bigserial primary key, order_id text not null, account bigint not null, amount bigint not null, topic text, part int, off bigint)`); err != nil {
		t.Fatal(err)
	}
	g := dedupe.New(dedupe.WithTable("s", "guard"))
	if err := g.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	ob := outbox.New()
	if err := ob.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	kc := testenv.Kafka(t, 1, "credits")
	brokers := testenv.Brokers(kc)
	cfg := testConfig(brokers, "g", "credits")
	cfg.GuardTable = "s.guard"
	cfg.MaxAttempts = 1
	logs := newLogCapture()
	o := newOutcomes()
	startConsumer(t, cfg, pool, consumer.Handle(creditHandler(0)), consumer.WithHooks(o.hooks()),
		consumer.WithLogger(slog.New(logs)), consumer.WithDeadLetters(outbox.DeadLetters(ob, cfg.DeadLetterSuffix)))
	produce := func(order string) {
		v, _ := json.Marshal(credit{OrderID: order, Account: 1, Amount: 100})
		testenv.Produce(t, brokers, &kgo.Record{Topic: "credits", Value: v})
	}
	produce("order-1")
	o.await(t, 30*time.Second, "the first record", func() bool { return o.get(string(dedupe.Applied)) == 1 })

	if _, err := pool.Exec(ctx, `drop schema s cascade`); err != nil {
		t.Fatal(err)
	}
	produce("order-2")
	const msg = "missing or behind: run migrate"
	rs := logs.await(t, 30*time.Second, 3, msg)
	for _, r := range rs {
		if r.Level != slog.LevelError || !strings.Contains(attr(r, "error"), `"s.guard" does not exist`) || attr(r, "guard_table") != `"s"."guard"` {
			t.Fatalf("log record %q at %v, error %q, guard_table %q; want an error naming the missing table", r.Message, r.Level, attr(r, "error"), attr(r, "guard_table"))
		}
	}
	if n := len(logs.matching("when the database is back")); n != 0 {
		t.Errorf("%d records blame a database outage for a missing table", n)
	}
	if got := o.snapshot(); got[string(dedupe.Applied)] != 1 || got[string(dedupe.DeadLettered)] != 0 || o.total() != 1 {
		t.Fatalf("outcomes while the table is missing = %v; want only the first record applied (the second held)", got)
	}

	if err := g.Migrate(ctx, pool); err != nil {
		t.Fatalf("Migrate after the drop: %v", err)
	}
	o.await(t, 30*time.Second, "the held record, once the table is back", func() bool { return o.get(string(dedupe.Applied)) == 2 })
	if got := count(t, pool, `select count(*) from ledger where order_id = 'order-2'`); got != 1 {
		t.Fatalf("order-2 applied %d times, want 1", got)
	}

	// A column a later migration added, gone (42703): the same message.
	if _, err := pool.Exec(ctx, `alter table s.guard drop column handler`); err != nil {
		t.Fatal(err)
	}
	before := len(logs.matching(msg))
	produce("order-3")
	rs = logs.await(t, 30*time.Second, before+2, msg)
	if e := attr(rs[len(rs)-1], "error"); !strings.Contains(e, "42703") {
		t.Fatalf("log record's error %q, want the undefined column (42703)", e)
	}
	if _, err := pool.Exec(ctx, `alter table s.guard add column handler text`); err != nil {
		t.Fatal(err)
	}
	o.await(t, 30*time.Second, "the held record, once the column is back", func() bool { return o.get(string(dedupe.Applied)) == 3 })
	if got := o.get(string(dedupe.DeadLettered)); got != 0 {
		t.Fatalf("%d records dead-lettered, want 0", got)
	}
}
