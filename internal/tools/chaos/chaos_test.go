package chaos_test

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/tools/chaos"
	"github.com/exactly-go/exactly/internal/tools/testenv"
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
}

// A small chaos run in CI: two processes of each service, 2,000 keys sent
// three times, a few kill -9s, a pause past the session timeout, a
// PostgreSQL crash-restart and broker faults.
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
	if res.Effects != 2000 || len(res.Lost) != 0 || len(res.Doubled) != 0 || res.Notifications != 2000 {
		t.Errorf("effects=%d lost=%d doubled=%d notifications=%d; want 2000, 0, 0, 2000", res.Effects, len(res.Lost), len(res.Doubled), res.Notifications)
	}
	if res.Faults[chaos.FaultKill] == 0 || res.Faults[chaos.FaultPGRestart] != 1 {
		t.Errorf("faults injected: %v; want kills and one database restart", res.Faults)
	}
	if res.OffsetSamples == 0 {
		t.Errorf("the committed offsets were never sampled during the run")
	}
}

// The checker fails a run whose database shows a lost and a doubled
// effect, naming the keys.
func testCheckerFindsLostAndDoubled(t *testing.T, bins string) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	res, err := chaos.Run(ctx, chaos.Config{
		Seed: 7, Keys: 200, Copies: 2, Consumers: 2, Duration: 5 * time.Second,
		Plan: &chaos.Plan{}, DrainTimeout: 2 * time.Minute, BinDir: bins,
		BeforeCheck: func(ctx context.Context, pool *pgxpool.Pool) error {
			// order-8000 loses its effect, order-8001 gets a second one.
			_, err := pool.Exec(ctx, `delete from ledger where order_id = 'order-8000';
				insert into ledger (order_id, account, amount) select order_id, account, amount from ledger where order_id = 'order-8001'`)
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
	for _, want := range []string{"lost=1 doubled=1", "lost: 1 keys have no ledger row: order-8000", "doubled: 1 keys have more than one ledger row: order-8001(x2)", "balances wrong"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if res.Dir != "" {
		_ = os.RemoveAll(res.Dir)
	}
}
