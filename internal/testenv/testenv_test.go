package testenv

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestMain(m *testing.M) { Main(m) }

func TestDBIsFreshAndDropped(t *testing.T) {
	var name string
	t.Run("inner/with spaces & UPPER", func(t *testing.T) {
		pool := DB(t)
		ctx := t.Context()
		if err := pool.QueryRow(ctx, "select current_database()").Scan(&name); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(name, "t_testdbisfreshanddropped_inner_with_spaces___upper_") || len(name) > 63 {
			t.Errorf("database name %q", name)
		}
		if _, err := pool.Exec(ctx, "create table x (id int)"); err != nil {
			t.Fatal(err)
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, DBURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, "select exists (select 1 from pg_database where datname = $1)", name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("database %s not dropped after its test", name)
	}
}

func TestDatabaseNameLength(t *testing.T) {
	n := databaseName(strings.Repeat("VeryLongTestName/", 10))
	if len(n) != 63 || !strings.HasPrefix(n, "t_verylongtestname_") {
		t.Errorf("databaseName = %q (%d bytes)", n, len(n))
	}
	if a, b := databaseName("x"), databaseName("x"); a == b {
		t.Error("databaseName is not unique")
	}
}

func TestKafkaProduce(t *testing.T) {
	c := Kafka(t, 2, "in")
	Produce(t, Brokers(c), &kgo.Record{Topic: "in", Value: []byte("hello")})

	cl, err := kgo.NewClient(kgo.SeedBrokers(Brokers(c)...), kgo.ConsumeTopics("in"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	fs := cl.PollFetches(ctx)
	if err := fs.Err0(); err != nil {
		t.Fatal(err)
	}
	if recs := fs.Records(); len(recs) != 1 || string(recs[0].Value) != "hello" {
		t.Fatalf("consumed %v, want the one produced record", recs)
	}
}

// parkedForGoroutinesTest blocks on release: a goroutine for
// TestCountGoroutines to find.
func parkedForGoroutinesTest(release chan struct{}) { <-release }

// TestCountGoroutines finds goroutines by a function in their stacks and
// tells their state.
func TestCountGoroutines(t *testing.T) {
	const fn = "testenv.parkedForGoroutinesTest("
	release := make(chan struct{})
	for range 3 {
		go parkedForGoroutinesTest(release)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		all, parked := CountGoroutines(fn, "chan receive")
		if all == 3 && parked == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, %d in chan receive; want 3 and 3", all, parked)
		}
		runtime.Gosched()
	}
	if _, n := CountGoroutines(fn, "select"); n != 0 {
		t.Errorf("%d in select, want 0", n)
	}
	close(release)
	for all, _ := CountGoroutines(fn, ""); all != 0; all, _ = CountGoroutines(fn, "") {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left after release", all)
		}
		runtime.Gosched()
	}
}
