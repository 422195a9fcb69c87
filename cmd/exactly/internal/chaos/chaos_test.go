package chaos_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/chaos"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/credit"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/notify"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestChaos runs the harness twice, sharing the service binaries. Each run
// starts its own PostgreSQL (it must crash it), so testenv's server is not
// used.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos runs skipped in -short mode")
	}
	bins := t.TempDir()
	t.Run("Small", func(t *testing.T) { testChaosSmall(t, bins) })
	t.Run("CheckerFindsLostAndDoubled", func(t *testing.T) { testCheckerFindsLostAndDoubled(t, bins) })
	t.Run("CheckerFailsWithoutRotation", func(t *testing.T) { testCheckerFailsWithoutRotation(t, bins) })
}

// A small chaos run in CI: two processes of each service, 2,000 keys sent
// three times, a few kill -9s, a pause past the session timeout, a
// PostgreSQL crash-restart and broker faults, plus the user-code faults:
// ten keys whose handler swallows a unique violation, two oversized valid
// commands and two undecodable records near the broker's limit, and the
// audit topic's produce denied for a while.
func testChaosSmall(t *testing.T, bins string) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := chaos.Run(ctx, chaos.Config{
		Seed:         20261130,
		Keys:         2000,
		Copies:       3,
		Consumers:    2,
		Duration:     25 * time.Second,
		Plan:         &chaos.Plan{Kills: 3, Stops: 1, PGRestarts: 1, KafkaFaults: 3},
		DrainTimeout: 3 * time.Minute,
		BinDir:       bins,
	}, &out)
	if err != nil {
		t.Fatalf("chaos run: %v\n%s", err, out.String())
	}
	res.Report(&out)
	t.Log("\n" + out.String())
	if !res.OK() {
		t.Fatalf("chaos run found %d violations (seed %d)", len(res.Violations), res.Seed)
	}
	// Every key but the 12 that must be dead-lettered takes effect once.
	if res.Effects != 1988 || len(res.Lost) != 0 || len(res.Doubled) != 0 || res.Notifications != 1988 {
		t.Errorf("effects=%d lost=%d doubled=%d notifications=%d; want 1988, 0, 0, 1988", res.Effects, len(res.Lost), len(res.Doubled), res.Notifications)
	}
	if res.Faults[chaos.FaultKill] == 0 || res.Faults[chaos.FaultPGRestart] != 1 {
		t.Errorf("faults injected: %v; want kills and one database restart", res.Faults)
	}
	if res.OffsetSamples == 0 {
		t.Errorf("the committed offsets were never sampled during the run")
	}
	// The guard's generation was sealed during the run (span 25s/4), and
	// the checker read every generation (no key applied in two of them).
	if res.Rotations < 2 || len(res.CrossGeneration) != 0 {
		t.Errorf("rotations=%d cross-generation=%v; want at least 2 rotations and no key applied in two generations", res.Rotations, res.CrossGeneration)
	}
	// The user-code faults happened and ended as they must (the checker
	// verified each record; these make sure there was something to check).
	if res.Swallowed != 10 || res.Padded != 2 || res.Undecodable != 2 {
		t.Errorf("swallowed=%d padded=%d undecodable=%d; want 10, 2, 2", res.Swallowed, res.Padded, res.Undecodable)
	}
	if res.DeadLetters < 14 || res.Credit.DeadLettered < 14 || res.Truncated < 2 {
		t.Errorf("dead letters=%d (truncated %d), dead_lettered=%d; want at least one per bad key and undecodable record, the undecodable ones truncated",
			res.DeadLetters, res.Truncated, res.Credit.DeadLettered)
	}
	if len(res.Parked) == 0 || res.Retried == 0 || res.Faults[chaos.FaultDenied] != 1 {
		t.Errorf("parked=%v retried=%d denials=%d; want the audit topic's keys parked during the denial, then released", res.Parked, res.Retried, res.Faults[chaos.FaultDenied])
	}
	if res.AuditIDs == 0 {
		t.Errorf("no audit event published")
	}
}

// The checker fails a run whose database shows a lost and a doubled
// effect, naming the keys, a key that must be dead-lettered with an
// effect and its guard row applied, and a key whose guard row names a
// later copy than its first (applied out of key order). It seals the guard's
// generation first, so the rows it corrupts are in a sealed generation, and
// claims one sealed key again in the current one: a key applied twice
// across a generation boundary.
func testCheckerFindsLostAndDoubled(t *testing.T, bins string) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var swallowed, doubledAt, reclaimed string
	res, err := chaos.Run(ctx, chaos.Config{
		Seed: 7, Keys: 200, Copies: 2, Consumers: 2, Duration: 5 * time.Second,
		Plan: &chaos.Plan{}, Oversized: -1, NoDenial: true, DrainTimeout: 2 * time.Minute, BinDir: bins,
		BeforeCheck: func(ctx context.Context, pool *pgxpool.Pool) error {
			// order-8000 loses its effect, order-8001 gets a second one,
			// the dead-lettered key (one, at seed 7 not order-8000 or
			// -8001) gets an effect and its guard row says applied.
			// Every row into a sealed generation.
			g := dedupe.New()
			pr, err := g.NewPruner(pool, dedupe.PrunerConfig{GenerationSpan: time.Nanosecond})
			if err != nil {
				return err
			}
			if _, ran, err := pr.PruneOnce(ctx); err != nil || !ran {
				return fmt.Errorf("sealing the current generation: ran=%v: %w", ran, err)
			}
			if err := pool.QueryRow(ctx, `select substr(key, 8) from exactly_guard_sealed where scope = 'credit' and state = 'dead_lettered' and key like 'credit:%'`).Scan(&swallowed); err != nil {
				return err
			}
			// A sealed valid key claimed again in the current generation.
			if err := pool.QueryRow(ctx, `insert into exactly_guard (scope, key, state, topic, kafka_partition, kafka_offset, trace_id, handler, self_counted, processed_at)
				select scope, key, state, topic, kafka_partition, kafka_offset, trace_id, handler, false, now() from exactly_guard_sealed
				where scope = 'credit' and state = 'applied' and key like 'credit:order-%' and key not in ('credit:order-8000', 'credit:order-8001', 'credit:order-8002')
				order by key limit 1 returning key`).Scan(&reclaimed); err != nil {
				return fmt.Errorf("claiming a sealed key again: %w", err)
			}
			if _, err := pool.Exec(ctx, `delete from ledger where order_id = 'order-8000';
				insert into ledger (order_id, account, amount) select order_id, account, amount from ledger where order_id = 'order-8001'`); err != nil {
				return err
			}
			if _, err := pool.Exec(ctx, `insert into ledger (order_id, account, amount) values ($1, 0, 0)`, swallowed); err != nil {
				return err
			}
			if n, err := updateSealed(ctx, pool, `set state = 'applied' where scope = 'credit' and key = 'credit:' || $1`, swallowed); err != nil || n != 1 {
				return fmt.Errorf("%s's guard row: %d rows marked applied, want 1: %w", swallowed, n, err)
			}
			// order-8002's guard row names an offset past its first copy:
			// a later copy applied first.
			n, err := updateSealed(ctx, pool, `set kafka_offset = kafka_offset + 1000000
				where scope = 'credit' and key = $1 and state = 'applied'`, "credit:order-8002")
			if err == nil && n != 1 {
				err = fmt.Errorf("order-8002's guard row: %d rows applied, want 1", n)
			}
			return err
		},
		BeforeCheckKafka: func(ctx context.Context, brokers []string) error {
			// The first dead letter again, under another message id: a
			// record dead-lettered twice.
			var err error
			doubledAt, err = redeadLetter(ctx, brokers)
			return err
		},
	}, &out)
	if err != nil {
		t.Fatalf("chaos run: %v\n%s", err, out.String())
	}
	res.Report(&out)
	if res.OK() || !slices.Equal(res.Lost, []string{"order-8000"}) || !slices.Equal(res.Doubled, []string{"order-8001(x2)"}) {
		t.Fatalf("lost=%v doubled=%v ok=%v; want order-8000 lost, order-8001 doubled, a failed run\n%s", res.Lost, res.Doubled, res.OK(), out.String())
	}
	if res.Rotations < 1 || len(res.CrossGeneration) != 1 || !strings.HasPrefix(res.CrossGeneration[0], reclaimed+"(exactly_guard_g") || !strings.HasSuffix(res.CrossGeneration[0], ",current)") {
		t.Errorf("rotations=%d cross-generation=%v; want at least one rotation and %s in the current and a sealed generation\n%s", res.Rotations, res.CrossGeneration, reclaimed, out.String())
	}
	for _, want := range []string{"lost=1 doubled=1", "lost: 1 keys have no ledger row: order-8000", "doubled: 1 keys have more than one ledger row: order-8001(x2)", "balances wrong",
		"applied: 1 keys whose handler swallows an error or emits an oversized event have a ledger row: " + swallowed,
		"guard rows of scope credit in the wrong state: credit:" + swallowed + "=applied(want dead_lettered)",
		"keys whose later copy applied before their first in its partition: credit:order-8002(applied at",
		"scope credit: 1 keys applied in more than one guard generation (applied again across a generation boundary): " + reclaimed + "(exactly_guard_g",
		"dead letters doubled: 1 records were dead-lettered more than once (partition/offset): " + doubledAt + "(" + swallowed + " x2)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if res.Dir != "" {
		_ = os.RemoveAll(res.Dir)
	}
}

// A run whose generation span is longer than the run asked for rotations
// that cannot happen: the checker fails it, saying none happened.
func testCheckerFailsWithoutRotation(t *testing.T, bins string) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	res, err := chaos.Run(ctx, chaos.Config{
		Seed: 7, Keys: 50, Copies: 1, Consumers: 2, Duration: 5 * time.Second, GenerationSpan: time.Hour,
		Plan: &chaos.Plan{}, Oversized: -1, NoDenial: true, DrainTimeout: 2 * time.Minute, BinDir: bins,
	}, &out)
	if err != nil {
		t.Fatalf("chaos run: %v\n%s", err, out.String())
	}
	res.Report(&out)
	want := "guard generations: no rotation with a generation span of 1h0m0s"
	if res.OK() || res.Rotations != 0 || !strings.Contains(out.String(), want) {
		t.Errorf("ok=%v rotations=%d; want a failed run with no rotation, reporting %q:\n%s", res.OK(), res.Rotations, want, out.String())
	}
	if res.Dir != "" {
		_ = os.RemoveAll(res.Dir)
	}
}

// updateSealed runs "update <generation> " + set on the sealed generations
// of the default guard, newest first, until one updates rows, and returns
// the rows updated (a dead-lettered key can have rows in several).
func updateSealed(ctx context.Context, pool *pgxpool.Pool, set string, args ...any) (int64, error) {
	rows, err := pool.Query(ctx, `select name from exactly_guard_generations where until is not null order by since desc`)
	if err != nil {
		return 0, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, err
	}
	var n int64
	for _, name := range names {
		tag, err := pool.Exec(ctx, `update `+pgx.Identifier{name}.Sanitize()+` `+set, args...)
		if err != nil {
			return n, fmt.Errorf("updating generation %s: %w", name, err)
		}
		if n = tag.RowsAffected(); n > 0 {
			break
		}
	}
	return n, nil
}

// redeadLetter produces the first record of the commands' dead-letter topic
// again under a new message id and returns its original "partition/offset".
func redeadLetter(ctx context.Context, brokers []string) (string, error) {
	topic := credit.CommandsTopic + chaos.DeadLetterSuffix
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		fs := cl.PollRecords(rctx, 1)
		if err := rctx.Err(); err != nil {
			return "", fmt.Errorf("reading %s: %w", topic, err)
		}
		recs := fs.Records()
		if len(recs) == 0 {
			continue
		}
		r := recs[0]
		var part, off string
		again := &kgo.Record{Topic: topic, Partition: r.Partition, Key: r.Key, Value: r.Value}
		for _, h := range r.Headers {
			switch h.Key {
			case notify.MessageIDHeader:
				h.Value = []byte("11111111-2222-3333-4444-555555555555")
			case outbox.HeaderOriginalPartition:
				part = string(h.Value)
			case outbox.HeaderOriginalOffset:
				off = string(h.Value)
			}
			again.Headers = append(again.Headers, h)
		}
		return part + "/" + off, cl.ProduceSync(ctx, again).FirstErr()
	}
}
