package apply_test

import (
	"context"
	"encoding/json"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
	"github.com/exactly-go/exactly/internal/runtime/telemetry"
	"github.com/exactly-go/exactly/outbox"
)

// BenchmarkRun measures one batch of fresh records through Executor.Run
// (claim, one handler insert per record, counters, commit): the
// transaction the consumer runs per batch, with batches of 100 (a backlog)
// and of 1 (records arriving one at a time), without telemetry and with
// the telemetry the consumer builds from the global (no SDK) providers.
// Reported per batch (building each batch's records is not counted), with
// the process's CPU time per record (cpu-µs/record: the client's share of
// the cost, the database's excluded, the input's building included).
func BenchmarkRun(b *testing.B) {
	for _, size := range []int{100, 1} {
		for _, tel := range []string{"none", "global"} {
			b.Run(fmt.Sprintf("batch=%d/telemetry=%s", size, tel), func(b *testing.B) {
				f := newFixture(b)
				if tel == "global" {
					t, err := apply.NewTelemetry(otel.GetTracerProvider(), otel.GetMeterProvider(), "bench",
						telemetry.NewDuplicateRate(time.Minute, 0.25, 50, nil), nil)
					if err != nil {
						b.Fatal(err)
					}
					f.exec.Telemetry = t
				}
				ctx := context.Background()
				batch := make([]cmd, size)
				n := 0
				b.ReportAllocs()
				cpu0 := processCPU(b)
				for b.Loop() {
					// Building the input is the test's work, not Run's: its
					// allocations are left out of the counts.
					b.StopTimer()
					for i := range batch {
						batch[i] = cmd{ID: fmt.Sprint(n)}
						n++
					}
					its := items(b, 1, batch...)
					b.StartTimer()
					res, herr, err := f.exec.Run(ctx, its)
					if err != nil || herr != nil || len(res) != len(its) || res[0].Outcome != dedupe.Applied {
						b.Fatalf("%v %v", herr, err)
					}
				}
				records := float64(b.N * len(batch))
				b.ReportMetric(records/b.Elapsed().Seconds(), "records/s")
				b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/records, "cpu-µs/record")
			})
		}
	}
}

// processCPU returns the CPU time (user and system) the test process used
// so far.
func processCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRunForms measures one batch of 100 fresh records, each a row in
// entries and an outbox row, through Executor.Run for each handler form
// (and the tx form with two lock keys per record). Reported per batch.
func BenchmarkRunForms(b *testing.B) {
	insert := `insert into entries (id, amount) values ($1, $2)`
	event := func(m handler.Message[entry]) outbox.Message {
		return outbox.Message{Topic: "entered", Key: []byte(m.Value.ID), Value: m.Record.Value}
	}
	txForm := func(ctx context.Context, tx pgx.Tx, m handler.Message[entry]) error {
		if _, err := tx.Exec(ctx, insert, m.Value.ID, m.Value.Amount); err != nil {
			return err
		}
		return outbox.Add(ctx, tx, event(m))
	}
	forms := []struct {
		name string
		h    handler.Any
	}{
		{"tx", handler.New("entry", handler.FromPayload(entryKey), txForm)},
		{"tx-lockkeys", handler.New("entry", handler.FromPayload(entryKey), txForm,
			handler.WithLockKeys(func(e entry) []string { return []string{"a:" + e.ID, "b:" + e.ID} }))},
		{"pipelined", handler.NewPipelined("entry", handler.FromPayload(entryKey),
			func(ctx context.Context, q handler.Queue, m handler.Message[entry]) error {
				q.Queue(insert, m.Value.ID, m.Value.Amount)
				return outbox.Add(ctx, q.Tx(), event(m))
			})},
		{"set", handler.NewSet("entry", handler.FromPayload(entryKey),
			func(ctx context.Context, tx pgx.Tx, msgs []handler.Message[entry]) error {
				ids, amounts := make([]string, len(msgs)), make([]int64, len(msgs))
				for i, m := range msgs {
					ids[i], amounts[i] = m.Value.ID, m.Value.Amount
					if err := outbox.Add(ctx, tx, event(m)); err != nil {
						return err
					}
				}
				_, err := tx.Exec(ctx, `insert into entries (id, amount) select * from unnest($1::text[], $2::bigint[])`, ids, amounts)
				return err
			})},
	}
	for _, form := range forms {
		b.Run(form.name, func(b *testing.B) {
			e, _ := newFormExecutor(b, form.h)
			ctx := context.Background()
			its := make([]apply.Item, 100)
			n := 0
			b.ReportAllocs()
			cpu0 := processCPU(b)
			for b.Loop() {
				for i := range its {
					v, _ := json.Marshal(entry{ID: fmt.Sprint(n), Amount: 1})
					its[i] = apply.Item{Record: handler.Record{Topic: "entries", Offset: int64(n), Value: v}, Attempt: 1}
					n++
				}
				res, herr, err := e.Run(ctx, its)
				if err != nil || herr != nil || len(res) != len(its) {
					b.Fatalf("%v %v", herr, err)
				}
			}
			records := float64(b.N * len(its))
			b.ReportMetric(records/b.Elapsed().Seconds(), "records/s")
			b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/records, "cpu-µs/record")
		})
	}
}
