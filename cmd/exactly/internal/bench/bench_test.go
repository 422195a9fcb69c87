package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/naive"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/credit"
	"github.com/exactly-go/exactly/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// counts returns the rows of the fixture's guard, ledger and outbox tables.
func counts(t *testing.T, pool *pgxpool.Pool, f tables) (guard, ledger, events int) {
	t.Helper()
	ctx := context.Background()
	for _, c := range []struct {
		table pgx.Identifier
		n     *int
	}{{f.guard.Table(), &guard}, {f.svc.Ledger(), &ledger}, {f.ob.Table(), &events}} {
		if err := pool.QueryRow(ctx, `select count(*) from `+c.table.Sanitize()).Scan(c.n); err != nil {
			t.Fatal(err)
		}
	}
	return guard, ledger, events
}

// Each limit shape writes one guard row, one ledger row and one outbox row
// per record; the row-wise and set-based shapes write nothing for a batch
// whose keys are already claimed.
func TestLimitShapesWriteOneEffectPerRecord(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	batch := workload.Commands(100, 7)
	for _, shape := range []string{shapeRowWise, shapePipelined, shapeSetBased} {
		t.Run(shape, func(t *testing.T) {
			f := fixture("bench_test_"+shape, "events")
			if err := f.migrate(ctx, pool); err != nil {
				t.Fatal(err)
			}
			b := newBusiness(f)
			if err := b.writeBatch(ctx, pool, shape, batch); err != nil {
				t.Fatal(err)
			}
			if g, l, e := counts(t, pool, f); g != 100 || l != 100 || e != 100 {
				t.Fatalf("after one batch: %d guard, %d ledger, %d outbox rows; want 100 of each", g, l, e)
			}
			if shape == shapePipelined {
				return // queued with the claim, its inserts cannot depend on it
			}
			if err := b.writeBatch(ctx, pool, shape, batch); err != nil {
				t.Fatal(err)
			}
			if g, l, e := counts(t, pool, f); g != 100 || l != 100 || e != 100 {
				t.Errorf("after the same batch again: %d guard, %d ledger, %d outbox rows; want 100 of each", g, l, e)
			}
		})
	}
}

// The hand-written loop, every command delivered twice on two partitions:
// with the guard each order has one ledger row, without it two. Committing
// by marks (kgo.AutoCommitMarks) or per slice, the group's committed
// offsets reach the end of every partition once every record committed.
func TestNaiveLoopAppliesOnceOnlyWithTheGuard(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := testenv.DB(t)
	const n, partitions = 50, 3
	for _, tc := range []struct {
		name         string
		guard, marks bool
	}{{"guarded", true, true}, {"guarded_slices", true, false}, {"unguarded", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			topic := "credit-" + tc.name
			brokers := testenv.Brokers(testenv.Kafka(t, partitions, topic))
			if err := workload.Produce(ctx, brokers, topic, partitions, workload.Commands(n, 7), 2); err != nil {
				t.Fatal(err)
			}
			f := fixture("bench_test_naive_"+tc.name, "events")
			if err := f.migrate(ctx, pool); err != nil {
				t.Fatal(err)
			}
			b := newBusiness(f)
			var committed atomic.Int64
			done := make(chan struct{})
			runCtx, stop := context.WithCancel(ctx)
			errc := make(chan error, 1)
			group := "g-" + tc.name
			go func() {
				errc <- naive.Run(runCtx, naive.Config{Brokers: brokers, Group: group, Topics: []string{topic}, Pool: pool,
					Marks: tc.marks, KafkaOptions: []kgo.Opt{kgo.AutoCommitInterval(100 * time.Millisecond)},
					Apply: func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
						var c credit.Command
						if err := json.Unmarshal(rec.Value, &c); err != nil {
							return err
						}
						return b.applyOne(ctx, tx, c, tc.guard)
					},
					OnRecord: func(*kgo.Record) {
						if committed.Add(1) == 2*n {
							close(done)
						}
					}})
			}()
			select {
			case <-done:
			case err := <-errc:
				t.Fatalf("the loop ended after %d of %d deliveries: %v", committed.Load(), 2*n, err)
			case <-ctx.Done():
				t.Fatalf("%d of %d deliveries committed", committed.Load(), 2*n)
			}
			adm := kadm.NewClient(workload.Client(brokers))
			defer adm.Close()
			lagErr := workload.AwaitLagZero(ctx, adm, group, topic, partitions)
			stop()
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if lagErr != nil {
				t.Errorf("the group's offsets did not reach the end of the topic while the loop ran: %v", lagErr)
			}
			_, ledger, events := counts(t, pool, f)
			want := n
			if !tc.guard {
				want = 2 * n
			}
			if ledger != want || events != want {
				t.Errorf("%d ledger rows and %d events for %d orders delivered twice; want %d of each", ledger, events, n, want)
			}
		})
	}
}

// The last line has its documented form (docs/performance.md), with n/a for the handler forms
// this build lacks and the scenarios that did not run.
func TestReportLastLine(t *testing.T) {
	results := []Result{
		{ID: idLimit, Rate: 40000},
		{ID: idPipeLimit, Rate: 90000},
		{ID: idSetLimit, Rate: 110000},
		{ID: idGuarded, Rate: 5000, Deadlocks: 0},
		{ID: idExactly1, Rate: 4500},
		{ID: idExactly, Rate: 20000},
		{ID: idPipelined, Missing: true},
		{ID: idSetBased, Missing: true},
		{ID: idHotRow, Rate: 50, Deadlocks: 30},
	}
	var out bytes.Buffer
	report(&out, Config{}, results)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := "bench: exactly=20000 limit=40000 ratio=0.50 naive=5000 batch1=4500 pipelined=n/a pipelimit=90000 setbased=n/a setlimit=110000 hotrow=50 hotrow_b1=n/a iobound=n/a ioideal=n/a"
	if got := lines[len(lines)-1]; got != want {
		t.Errorf("last line\n%s\nwant\n%s", got, want)
	}
	if !strings.Contains(out.String(), "target n/a    pipelined handler ≥ 0.7 × pipelimit: its handler form is not in this build") {
		t.Errorf("no n/a target for the pipelined handler in\n%s", out.String())
	}
}

// The CPU figures compare each handler form's process CPU per record with
// its limit's, whatever the record counts; they are printed, not judged.
func TestReportCPUFigures(t *testing.T) {
	results := []Result{
		{ID: idPipeLimit, Records: 100000, Rate: 40000, CPU: 0.6},
		{ID: idSetLimit, Records: 100000, Rate: 50000, CPU: 0.5},
		{ID: idPipelined, Records: 100000, Rate: 30000, CPU: 1.3},
		{ID: idSetBased, Records: 10000, Rate: 30000, CPU: 0.07},
	}
	var out bytes.Buffer
	report(&out, Config{}, results)
	for _, want := range []string{
		"info          pipelined handler CPU per record: 2.17 × pipelimit's (13.0 µs against 6.0 µs)",
		"info          set-based handler CPU per record: 1.40 × setlimit's (7.0 µs against 5.0 µs)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no line %q in\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "CPU per record ≤") {
		t.Errorf("a CPU target is judged in\n%s", out.String())
	}
}

// The tail target compares exactly's paced p99 with the paced guarded
// loop's from the same run, met up to twice the loop's.
func TestReportTailTarget(t *testing.T) {
	for _, c := range []struct {
		exactly, loop float64
		want          string
	}{
		{40, 25, "target met    exactly p99 produce-to-commit ≤ 2 × the guarded loop's at 1000 records/s: 1.60 (40 ms against 25 ms; p50 2.0 against 1.5 ms)"},
		{60, 25, "target MISSED exactly p99 produce-to-commit ≤ 2 × the guarded loop's at 1000 records/s: 2.40 (60 ms against 25 ms; p50 2.0 against 1.5 ms)"},
	} {
		var out bytes.Buffer
		report(&out, Config{PaceRate: 1000}, []Result{
			{ID: idPacedLoop, Records: 5000, Rate: 1000, P50: 1.5, P99: c.loop},
			{ID: idPaced, Records: 5000, Rate: 1000, P50: 2, P99: c.exactly},
		})
		if !strings.Contains(out.String(), c.want) {
			t.Errorf("no line %q in\n%s", c.want, out.String())
		}
	}
	var out bytes.Buffer
	report(&out, Config{PaceRate: 1000}, []Result{{ID: idPaced, Records: 5000, Rate: 1000, P50: 2, P99: 40}})
	if !strings.Contains(out.String(), "target n/a    exactly p99 produce-to-commit ≤ 2 × the guarded loop's at 1000 records/s: the paced loop did not run") {
		t.Errorf("no n/a tail target without the paced loop in\n%s", out.String())
	}
}

// Every hot-row transfer moves money between two different accounts.
func TestTransfersTouchTwoAccounts(t *testing.T) {
	for _, tr := range transfers(1000) {
		if tr.From == tr.To || tr.From < 0 || tr.To < 0 || tr.From >= hotAccounts || tr.To >= hotAccounts {
			t.Fatalf("transfer %+v: want two different accounts below %d", tr, hotAccounts)
		}
	}
}

// batchSizes records the largest record batch a consumer decoded.
type batchSizes struct{ largest atomic.Int64 }

// OnFetchBatchRead implements kgo.HookFetchBatchRead.
func (b *batchSizes) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	for {
		cur := b.largest.Load()
		if int64(m.NumRecords) <= cur || b.largest.CompareAndSwap(cur, int64(m.NumRecords)) {
			return
		}
	}
}

// The backlog topic is produced in calls of the small topic's size, so its
// record batches are no larger than the small topic's: a consumer's floor is
// a whole batch per partition, and the peak-RSS comparison must measure the
// backlog, not the batch size. 6,000 commands in one call give batches of
// ~3,000 records on 2 partitions; in calls of 1,000, at most 500.
func TestBacklogBatchesAreTheSmallTopics(t *testing.T) {
	ctx := context.Background()
	kc := testenv.Kafka(t, 2, "backlog")
	brokers := testenv.Brokers(kc)
	const n, chunk = 6000, 1000
	if err := produceChunked(ctx, brokers, "backlog", 2, workload.Commands(n, 10), chunk); err != nil {
		t.Fatal(err)
	}
	var sizes batchSizes
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("backlog"), kgo.WithHooks(&sizes))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got int
	for got < n {
		fs := cl.PollFetches(pctx)
		if err := pctx.Err(); err != nil {
			t.Fatalf("%d of %d records consumed: %v", got, n, err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetching %s/%d: %v", topic, p, err) })
		got += fs.NumRecords()
	}
	if got != n {
		t.Errorf("consumed %d records, want %d", got, n)
	}
	if l := sizes.largest.Load(); l > chunk/2 {
		t.Errorf("largest record batch holds %d records, want at most %d (chunk/partitions)", l, chunk/2)
	} else {
		t.Logf("largest record batch: %d records", l)
	}
}

// EXACTLY_BENCH_MEMPROFILE makes an exactly child trace its memory: a CSV
// row per 100 ms and one at the end with the records buffered and
// committed, a heap profile, and the sizes of the record batches franz-go
// decoded.
func TestMemTraceWritesSamplesAndBatches(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(memEnv, dir+"/run")
	var committed atomic.Int64
	m, err := startMemTrace("g", committed.Load)
	if err != nil || m == nil {
		t.Fatalf("startMemTrace = %v, %v; want a trace", m, err)
	}
	m.OnFetchRecordBuffered(nil)
	m.OnFetchRecordBuffered(nil)
	committed.Store(1)
	m.OnFetchBatchRead(kgo.BrokerMetadata{}, "t", 0, kgo.FetchBatchMetrics{NumRecords: 2, UncompressedBytes: 300, CompressedBytes: 100, CompressionType: 2})
	m.close() // samples once more: the end's state
	b, err := os.ReadFile(dir + "/run.g.csv")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "ms,vmrss_kib,buffered,committed,/gc/heap/live:bytes") {
		t.Fatalf("trace has %d lines, header %q; want a header and samples", len(lines), lines[0])
	}
	if f := strings.Split(lines[len(lines)-1], ","); len(f) != 4+len(memSamples()) || f[2] != "2" || f[3] != "1" {
		t.Errorf("last sample %q: want 2 buffered, 1 committed and every metric", lines[len(lines)-1])
	}
	if b, err := os.ReadFile(dir + "/run.g.batches"); err != nil || !strings.Contains(string(b), "batches=1 records=2 max_records=2 uncompressed=300") {
		t.Errorf("batches summary %q (%v)", b, err)
	}
	if _, err := os.Stat(dir + "/run.g.end.heap"); err != nil {
		t.Errorf("no heap profile at the end: %v", err)
	}
	t.Setenv(memEnv, "")
	if m, err := startMemTrace("g", committed.Load); m != nil || err != nil {
		t.Errorf("without %s: startMemTrace = %v, %v; want nil", memEnv, m, err)
	}
}

// A scenario of a ratio target reports its round of median rate, with
// every round's rate; from the second round on it runs in a schema and a
// consumer group of its own, and the other scenarios run once.
func TestRoundsReportTheMedian(t *testing.T) {
	m := median([]Result{{ID: idExactly, Rate: 300, Seconds: 1}, {ID: idExactly, Rate: 100, Seconds: 3}, {ID: idExactly, Rate: 200, Seconds: 2}})
	if m.Rate != 200 || m.Seconds != 2 {
		t.Errorf("median of 300, 100, 200 is %v (%v s), want the 200 round", m.Rate, m.Seconds)
	}
	if !slices.Equal(m.Rounds, []float64{300, 100, 200}) {
		t.Errorf("rounds %v, want 300 100 200 in the order run", m.Rounds)
	}
	// The CPU targets take the median of the rounds' CPU per record, not
	// the CPU of the round of median rate.
	m = median([]Result{{Rate: 300, CPU: 1, Records: 100}, {Rate: 100, CPU: 3, Records: 100}, {Rate: 200, CPU: 9, Records: 100}})
	if got := cpuPerRecord(m); got != 0.03 {
		t.Errorf("CPU per record of rounds of 0.01, 0.03 and 0.09 s (0.09 in the round of median rate): %v, want the median 0.03", got)
	}
	if got := cpuPerRecord(Result{CPU: 2, Records: 100}); got != 0.02 {
		t.Errorf("CPU per record of a scenario run once: %v, want 0.02", got)
	}
	if m := median([]Result{{Rate: 2}, {Rate: 1}}); m.Rate != 1 {
		t.Errorf("median of two rounds is %v, want the lower one", m.Rate)
	}
	ex := scenario{id: idExactly, spec: Spec{Schema: "bench_exactly", Group: "g"}}
	if s, ok := ex.inRound(1); !ok || s.Schema != "bench_exactly" || s.Group != "g" {
		t.Errorf("round 1 spec %+v, %v: want the scenario's own", s, ok)
	}
	if s, ok := ex.inRound(2); !ok || s.Schema != "bench_exactly_r2" || s.Group != "g_r2" {
		t.Errorf("round 2 spec %+v, %v: want schema bench_exactly_r2 and group g_r2", s, ok)
	}
	redelivery := scenario{id: idRedeliver, spec: Spec{Schema: "bench_exactly", Group: "r"}}
	if s, _ := redelivery.inRound(3); s.Schema != "bench_exactly_r3" {
		t.Errorf("redelivery of round 3 reads schema %q, want exactly's of that round", s.Schema)
	}
	// The paced rows report their round of median p99, each round on a
	// topic of its own (the scenario produces it).
	m = median([]Result{{ID: idPaced, Rate: 1000, P99: 30}, {ID: idPaced, Rate: 1001, P99: 90}, {ID: idPaced, Rate: 999, P99: 10}})
	if m.P99 != 30 || !slices.Equal(m.RoundP99, []float64{30, 90, 10}) {
		t.Errorf("paced median: p99 %v of rounds %v, want the 30 ms round of 30 90 10", m.P99, m.RoundP99)
	}
	pc := scenario{id: idPacedLoop, spec: Spec{Schema: "bench_guarded_paced", Group: "p", Topic: "t"}}
	if s, ok := pc.inRound(2); !ok || s.Topic != "t_r2" || s.Group != "p_r2" {
		t.Errorf("paced loop's round 2 spec %+v, %v: want topic t_r2 and group p_r2", s, ok)
	}
	if _, ok := (scenario{id: idRelay}).inRound(2); ok {
		t.Error("the relay scenario runs in round 2; it feeds no ratio")
	}
}

// -only with an id that is no scenario (a typo, or hotrowp, renamed to the
// information rows hotrowtx/hotrowtx1) is refused before anything starts,
// naming the id and the known ones, instead of running nothing and
// reporting an empty table.
func TestOnlyRefusesUnknownScenarios(t *testing.T) {
	var out bytes.Buffer
	_, err := Run(context.Background(), Config{Only: "exactly, hotrowp", DatabaseURL: "postgres://nobody@127.0.0.1:1/none"}, &out)
	if err == nil || !strings.Contains(err.Error(), `"hotrowp"`) || !strings.Contains(err.Error(), ScenarioIDs) {
		t.Fatalf("Run with -only hotrowp: %v; want an error naming hotrowp and the known ids", err)
	}
	if out.Len() != 0 {
		t.Errorf("Run wrote %q before refusing -only", out.String())
	}
}

// The paced guarded loop produces its own topic at the pace while it
// consumes it: every record it produced is committed once (one guard,
// ledger and outbox row each), and the latencies are filed from the
// records' produce timestamps.
func TestPacedLoopCommitsWhatItProduces(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := testenv.DB(t)
	const n, partitions = 200, 3
	topic := "credit-pacedloop"
	brokers := testenv.Brokers(testenv.Kafka(t, partitions, topic))
	f := fixture("bench_test_pacedloop", "events")
	if err := f.migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	spec := Spec{Kind: kindNaive, Brokers: brokers, Topic: topic, Group: "g-pacedloop", Schema: "bench_test_pacedloop",
		Records: n, Accounts: 7, Partitions: partitions, Guard: true, PaceRate: 1000}
	res, err := runNaive(ctx, spec, pool, f, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != n || res.P50 <= 0 || res.P99 < res.P50 {
		t.Errorf("result %+v: want %d records with 0 < p50 ≤ p99", res, n)
	}
	if g, l, e := counts(t, pool, f); g != n || l != n || e != n {
		t.Errorf("%d guard, %d ledger, %d outbox rows; want %d of each", g, l, e, n)
	}
}
