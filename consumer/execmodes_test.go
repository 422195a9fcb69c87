package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/internal/testenv/pgbouncer"
	"github.com/exactly-go/exactly/outbox"
)

// execModes are pgx's query exec modes by the name a URL's
// default_query_exec_mode gives them.
var execModes = []struct {
	name string
	mode pgx.QueryExecMode
	// pooled: the mode works through a transaction-mode pooler that keeps
	// no prepared statements (PgBouncer before 1.21): it prepares no named
	// statement, and sends each execution in one round trip.
	// cache_statement prepares named statements on whichever server
	// connection it was lent; describe_exec describes an unnamed statement
	// in one round trip and binds it in the next, when the server
	// connection may have run another client's unnamed statement.
	pooled bool
}{
	{"cache_statement", pgx.QueryExecModeCacheStatement, false},
	{"cache_describe", pgx.QueryExecModeCacheDescribe, true},
	{"describe_exec", pgx.QueryExecModeDescribeExec, false},
	{"exec", pgx.QueryExecModeExec, true},
	{"simple_protocol", pgx.QueryExecModeSimpleProtocol, true},
}

// modePool opens a pool on url whose connections run in mode, as a user's
// pool built from a URL with default_query_exec_mode does.
func modePool(t testing.TB, url string, mode pgx.QueryExecMode, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestServiceConsumesInEveryExecMode: through the public API, a service on a
// pool in each of pgx's query exec modes applies every record once (rows
// written, copies reported duplicate), dead-letters a malformed record,
// publishes each outbox row, and commits every partition's offset to the
// end; directly, and through PgBouncer in transaction mode for the modes
// that work there.
func TestServiceConsumesInEveryExecMode(t *testing.T) {
	for _, m := range execModes {
		t.Run(m.name+"/direct", func(t *testing.T) {
			consumesInMode(t, testenv.DBURL(t), m.mode)
		})
		if m.pooled {
			t.Run(m.name+"/pgbouncer-transaction", func(t *testing.T) {
				b := pgbouncer.New(t, pgbouncer.Options{Upstream: testenv.DBURL(t), DefaultPoolSize: 6})
				consumesInMode(t, b.Through(testenv.DBURL(t)), m.mode)
			})
		}
	}
}

func consumesInMode(t *testing.T, url string, mode pgx.QueryExecMode) {
	const partitions, orders, copies = 3, 60, 2
	pool := modePool(t, url, mode, consumer.PoolConns(partitions))
	setupLedger(t, pool)
	kc := testenv.Kafka(t, partitions, "credits", "credited", "credits.dlq")
	brokers := testenv.Brokers(kc)
	o := newOutcomes()
	svc, err := consumer.NewService(testConfig(brokers, "modes", "credits"), pool,
		consumer.Handle(creditEmitter(nil)), consumer.WithHooks(o.hooks()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := svc.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	produceCopies(t, brokers, "credits", orders, copies, partitions)
	produceManual(t, brokers, &kgo.Record{Topic: "credits", Partition: 0, Value: []byte("not json")})
	runService(t, svc)
	o.await(t, 60*time.Second, "every record's outcome", func() bool {
		return o.get("applied") == orders && o.get("duplicate") == orders*(copies-1) && o.get("dead_lettered") == 1
	})
	if got := count(t, pool, `select count(*) from ledger`); got != orders {
		t.Errorf("%d ledger rows, want %d", got, orders)
	}
	ids := map[string]bool{}
	for _, r := range testenv.ReadTopic(t, brokers, "credited", orders) {
		for _, h := range r.Headers {
			if h.Key == outbox.HeaderMessageID {
				ids[string(h.Value)] = true
			}
		}
	}
	if len(ids) != orders {
		t.Errorf("%d distinct message ids published, want %d", len(ids), orders)
	}
	if got := len(testenv.ReadTopic(t, brokers, "credits.dlq", 1)); got != 1 {
		t.Errorf("%d dead letters, want 1", got)
	}
	ends := map[int32]int64{0: 1} // the malformed record
	for i := 0; i < orders; i++ {
		for c := 0; c < copies; c++ {
			ends[int32(i+c)%partitions]++
		}
	}
	o.await(t, 30*time.Second, fmt.Sprintf("committed offsets at %v", ends), func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		at := map[int32]int64{}
		for _, c := range o.commits {
			for p, off := range c["credits"] {
				at[p] = max(at[p], off)
			}
		}
		for p, end := range ends {
			if at[p] != end {
				return false
			}
		}
		return true
	})
	o.checkCommitsTrail(t)
	o.await(t, 30*time.Second, "the relay deleting what it published", func() bool {
		return count(t, pool, `select count(*) from exactly_outbox`) == 0
	})
}

// refusingCodec is a codec that encodes nothing: what a connection's type
// map holds when the application registered a codec that cannot encode the
// framework's parameters.
type refusingCodec struct{ pgtype.Codec }

func (refusingCodec) PlanEncode(*pgtype.Map, uint32, int16, any) pgtype.EncodePlan { return nil }

// A pool whose connections cannot encode the claim statement's parameters
// is a configuration error: Service.Run fails at start with a
// *StatementError naming the claim, rather than consuming nothing and
// retrying every batch for ever as if the database were down.
func TestServiceRefusesStatementsItCannotSend(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(testenv.DBURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		m := conn.TypeMap()
		int8s, _ := m.TypeForOID(pgtype.Int8ArrayOID)
		m.RegisterType(&pgtype.Type{Name: int8s.Name, OID: int8s.OID, Codec: refusingCodec{int8s.Codec}})
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 1, "credits")
	svc, err := consumer.NewService(testConfig(testenv.Brokers(kc), "refuses", "credits"), pool, consumer.Handle(creditEmitter(nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = svc.Run(ctx)
	var se *consumer.StatementError
	if !errors.As(err, &se) || se.Statement != "claim" || se.Mode != "cache statement" || !strings.Contains(err.Error(), "unable to encode") {
		t.Fatalf("Run = %v, want a *StatementError naming the claim, the mode and the encoding failure", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run returned only when its context ended")
	}
}
