package apply_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
	"github.com/exactly-go/exactly/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type cmd struct {
	ID   string `json:"id"`
	Fail bool   `json:"fail"`
}

// fixture is an executor whose handler inserts one row per record into
// "effects" and fails for records whose payload says so; it counts calls.
type fixture struct {
	pool  *pgxpool.Pool
	exec  *apply.Executor
	mu    sync.Mutex
	calls map[string]int
}

func newFixture(tb testing.TB) *fixture {
	tb.Helper()
	ctx := context.Background()
	pool := testenv.DB(tb)
	guard := dedupe.New()
	if err := guard.Migrate(ctx, pool); err != nil {
		tb.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `create table effects (id text not null); create table dead (id text not null, reason text not null)`); err != nil {
		tb.Fatal(err)
	}
	f := &fixture{pool: pool, calls: map[string]int{}}
	h := handler.New("t", handler.FromPayload(func(c cmd) string { return dedupe.Key("t", c.ID) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[cmd]) error {
			f.mu.Lock()
			f.calls[msg.Value.ID]++
			f.mu.Unlock()
			if _, err := tx.Exec(ctx, `insert into effects (id) values ($1)`, msg.Value.ID); err != nil {
				return err
			}
			if msg.Value.Fail {
				return errors.New("handler says no")
			}
			return nil
		})
	f.exec = &apply.Executor{Pool: pool, Guard: guard, Handler: h, MaxAttempts: 3}
	return f
}

func items(tb testing.TB, attempt int, cmds ...cmd) []apply.Item {
	tb.Helper()
	out := make([]apply.Item, len(cmds))
	for i, c := range cmds {
		v, err := json.Marshal(c)
		if err != nil {
			tb.Fatal(err)
		}
		out[i] = apply.Item{Record: handler.Record{Topic: "t", Partition: 0, Offset: int64(i), Value: v}, Attempt: attempt}
	}
	return out
}

func (f *fixture) effects(t *testing.T) map[string]int {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `select id, count(*)::int from effects group by id`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { got[id] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	return got
}

// A handler failing in the middle of a batch rolls back alone: the records
// before it commit, with their effects once; its own effect and everything
// after it are not committed; its handler ran once for this attempt.
func TestFailingRecordRollsBackAlone(t *testing.T) {
	f := newFixture(t)
	res, herr, err := f.exec.Run(context.Background(), items(t, 1, cmd{ID: "a"}, cmd{ID: "b"}, cmd{ID: "c", Fail: true}, cmd{ID: "d"}))
	if err != nil {
		t.Fatal(err)
	}
	if herr == nil || herr.Index != 2 || len(res) != 2 {
		t.Fatalf("results %v, handler error %v; want 2 results and the error at index 2", res, herr)
	}
	for _, r := range res {
		if r.Outcome != dedupe.Applied {
			t.Errorf("outcome %v, want applied", r)
		}
	}
	if got := f.effects(t); fmt.Sprint(got) != "map[a:1 b:1]" {
		t.Errorf("effects %v, want a and b once", got)
	}
	if f.calls["c"] != 1 || f.calls["d"] != 0 {
		t.Errorf("calls %v: want c once, d never", f.calls)
	}
	// The retry from the failed record claims c and d afresh.
	f.calls = map[string]int{}
	res, herr, err = f.exec.Run(context.Background(), items(t, 2, cmd{ID: "c"}, cmd{ID: "d"}))
	if err != nil || herr != nil || len(res) != 2 || res[0].Outcome != dedupe.Applied || res[1].Outcome != dedupe.Applied {
		t.Fatalf("retry: %v %v %v", res, herr, err)
	}
}

// At its last attempt a failing record is dead-lettered in the batch's
// transaction, without its effect and with its guard row marked
// dead-lettered at the record's coordinates, and the
// records after it are applied in the same transaction.
func TestLastAttemptDeadLettersAndGoesOn(t *testing.T) {
	f := newFixture(t)
	f.exec.DeadLetter = func(ctx context.Context, tx pgx.Tx, rec handler.Record, _ string, _ int, reason error) error {
		_, err := tx.Exec(ctx, `insert into dead (id, reason) values ($1, $2)`, string(rec.Value), reason.Error())
		return err
	}
	res, herr, err := f.exec.Run(context.Background(), items(t, 3,
		cmd{ID: "a"}, cmd{ID: "b", Fail: true}, cmd{ID: "c"}, cmd{ID: "d", Fail: true}, cmd{ID: "e"}))
	if err != nil || herr != nil {
		t.Fatalf("handler error %v, error %v", herr, err)
	}
	checkOutcomes(t, res, dedupe.Applied, dedupe.DeadLettered, dedupe.Applied, dedupe.DeadLettered, dedupe.Applied)
	if res[1].Reason == nil || res[3].Reason == nil {
		t.Errorf("dead letters without reason: %v", res)
	}
	if got := f.effects(t); fmt.Sprint(got) != "map[a:1 c:1 e:1]" {
		t.Errorf("effects %v, want a, c and e once", got)
	}
	if f.calls["b"] != 1 || f.calls["d"] != 1 {
		t.Errorf("calls %v: want each failing handler once", f.calls)
	}
	var dead int
	if err := f.pool.QueryRow(context.Background(), `select count(*) from dead`).Scan(&dead); err != nil || dead != 2 {
		t.Errorf("%d dead letters (%v), want 2", dead, err)
	}
	for i, k := range []string{"b", "d"} {
		var state, topic string
		var offset int64
		err := f.pool.QueryRow(context.Background(), `select state, topic, kafka_offset from exactly_guard where scope = 't' and key = $1`,
			dedupe.NormalizeKey(dedupe.Key("t", k))).Scan(&state, &topic, &offset)
		if err != nil || state != "dead_lettered" || topic != "t" || offset != int64(1+2*i) {
			t.Errorf("guard row of dead-lettered %s: state %q at %s/%d (%v), want dead_lettered at t/%d", k, state, topic, offset, err, 1+2*i)
		}
	}
}

// A failure at the first record of a batch (the common case of a retry)
// returns at once, with nothing committed.
func TestFailureAtFirstRecord(t *testing.T) {
	f := newFixture(t)
	res, herr, err := f.exec.Run(context.Background(), items(t, 1, cmd{ID: "a", Fail: true}, cmd{ID: "b"}))
	if err != nil || herr == nil || herr.Index != 0 || len(res) != 0 {
		t.Fatalf("%v %v %v", res, herr, err)
	}
	if got := f.effects(t); len(got) != 0 {
		t.Errorf("effects %v, want none", got)
	}
	if st := f.pool.Stat(); st.AcquiredConns() != 0 {
		t.Errorf("%d connections still acquired after the failed batch", st.AcquiredConns())
	}
}

// A batch of one that fails does not keep its connection (it used to leak
// the connection of the second transaction it began).
func TestSingleFailureReleasesConnection(t *testing.T) {
	f := newFixture(t)
	for attempt := 1; attempt <= 2; attempt++ {
		_, herr, err := f.exec.Run(context.Background(), items(t, attempt, cmd{ID: "a", Fail: true}))
		if err != nil || herr == nil {
			t.Fatalf("%v %v", herr, err)
		}
	}
	if st := f.pool.Stat(); st.AcquiredConns() != 0 {
		t.Errorf("%d connections still acquired", st.AcquiredConns())
	}
}

// releases counts the releases of a prepared record, passing them on.
type releases struct {
	n     int
	inner interface{ Release() }
}

func (r *releases) Release() { r.n++; r.inner.Release() }

// A run releases only the prepared records it made itself, once each and
// after its end: the ones its caller gave it (the consumer's window keeps
// them until the record is settled) are the caller's to release.
func TestRunReleasesOnlyWhatItPrepared(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	given := items(t, 1, cmd{ID: "a"}, cmd{ID: "b"})
	counts := make([]*releases, len(given))
	for i := range given {
		p, err := f.exec.Prepare(given[i].Record)
		if err != nil {
			t.Fatal(err)
		}
		if p.Release == nil {
			t.Fatal("a handler's prepared record has no Release")
		}
		counts[i] = &releases{inner: p.Release}
		p.Release = counts[i]
		given[i].Prepared = &p
	}
	if _, herr, err := f.exec.Run(ctx, given); herr != nil || err != nil {
		t.Fatalf("run: %v, %v", herr, err)
	}
	for i, c := range counts {
		if c.n != 0 {
			t.Errorf("record %d, given prepared, was released %d times by the run", i, c.n)
		}
	}
	if got := f.effects(t); got["a"] != 1 || got["b"] != 1 {
		t.Fatalf("effects %v, want a and b once", got)
	}
}
