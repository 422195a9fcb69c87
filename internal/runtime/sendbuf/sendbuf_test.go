package sendbuf_test

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/runtime/pgarray"
	"github.com/exactly-go/exactly/internal/runtime/sendbuf"
	"github.com/exactly-go/exactly/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// countingConn counts the bytes written to the server.
type countingConn struct {
	net.Conn
	written *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

// connect opens a connection to a fresh database, with a ledger and an
// outbox table, whose written bytes are counted in written.
func connect(t *testing.T, written *atomic.Int64) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(testenv.DBURL(t))
	if err != nil {
		t.Fatal(err)
	}
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, written: written}, nil
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	for _, sql := range []string{
		`create table ledger (order_id text primary key, account bigint, amount bigint)`,
		`create table outbox (topic text, key bytea, value bytea, headers text[])`,
		`create table claims (key text, part int, off bigint)`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	return conn
}

// pipelines are batches shaped like the executor's: a transaction's BEGIN
// and claim, and its queued statements with the outbox rows and COMMIT.
func pipelines(round, n int) map[string]*pgx.Batch {
	claim, commit := &pgx.Batch{}, &pgx.Batch{}
	keys, parts, offs := make(pgarray.Text, n), make([]int32, n), make([]int64, n)
	okeys, values, headers := make(pgarray.Bytea, n), make(pgarray.Bytea, n), make(pgarray.NullText, n)
	for i := range n {
		id := fmt.Sprintf("order-%d-%d", round, i)
		keys[i], parts[i], offs[i] = id, int32(i%6), int64(i)
		commit.Queue(`insert into ledger (order_id, account, amount) values ($1, $2, $3)`, id, int64(i%100), int64(100+i))
		okeys[i] = strconv.AppendInt(nil, int64(i), 10)
		values[i] = fmt.Appendf(nil, `{"order_id":%q,"account":%d,"amount":%d}`, id, i%100, 100+i)
		headers[i] = pgarray.NullString{S: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Valid: true}
	}
	claim.BeginTx(pgx.TxOptions{})
	claim.Queue(`insert into claims (key, part, off) select * from unnest($1::text[], $2::int[], $3::bigint[])`, keys, parts, offs)
	commit.Queue(`insert into outbox (topic, key, value, headers) select $1, k, v, string_to_array(h, ',') from unnest($2::bytea[], $3::bytea[], $4::text[]) as u(k, v, h)`,
		"events", okeys, values, headers)
	commit.Queue("commit")
	return map[string]*pgx.Batch{"claim": claim, "commit": commit}
}

// send sends the claim pipeline then the commit pipeline, reserving room
// first when reserve is set, and returns the bytes each wrote.
func send(t *testing.T, conn *pgx.Conn, written *atomic.Int64, round, n int, reserve bool) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	out := map[string]int64{}
	ps := pipelines(round, n)
	for _, name := range []string{"claim", "commit"} {
		b := ps[name]
		if reserve {
			sendbuf.Reserve(conn.PgConn(), sendbuf.Size(b))
		}
		before := written.Load()
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			t.Fatalf("sending the %s pipeline: %v", name, err)
		}
		out[name] = written.Load() - before
	}
	return out
}

// TestSizeEstimatesTheWireBytes: Size of a pipeline shaped like the
// executor's is within 25 % above the bytes pgx writes for it once its
// statements are cached (the estimate is a buffer's size: a little too
// large is cheap, too small grows the buffer).
func TestSizeEstimatesTheWireBytes(t *testing.T) {
	var written atomic.Int64
	conn := connect(t, &written)
	send(t, conn, &written, 0, 10, false) // prepares and caches the statements
	for _, n := range []int{1, 10, 100, 500} {
		ps := pipelines(1000+n, n)
		want := map[string]int{"claim": sendbuf.Size(ps["claim"]), "commit": sendbuf.Size(ps["commit"])}
		got := send(t, conn, &written, 1000+n, n, false)
		for name, actual := range got {
			est := want[name]
			if float64(est) < float64(actual) || float64(est) > 1.25*float64(actual) {
				t.Errorf("%d records, %s pipeline: Size = %d bytes, pgx wrote %d (want within [1, 1.25] × that)", n, name, est, actual)
			}
		}
	}
}

// TestReserveSparesTheBufferItsRegrowth: sending pipelines of 500
// records allocates, with Reserve, at least twice their wire bytes less
// than without it. Without, pgx's buffer grows from 1 KiB step by step,
// each step a new buffer (about four times the bytes in all); with, it is
// allocated once.
func TestReserveSparesTheBufferItsRegrowth(t *testing.T) {
	var written atomic.Int64
	conn := connect(t, &written)
	send(t, conn, &written, 0, 500, false)
	const n, rounds = 500, 8
	// measure returns the bytes allocated and written per transaction;
	// the batches are built before it starts: only sending counts.
	measure := func(reserve bool, first int) (alloc, wire uint64) {
		batches := make([]map[string]*pgx.Batch, rounds)
		for r := range batches {
			batches[r] = pipelines(first+r, n)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		w0 := written.Load()
		for r := range rounds {
			for _, name := range []string{"claim", "commit"} {
				b := batches[r][name]
				if reserve {
					sendbuf.Reserve(conn.PgConn(), sendbuf.Size(b))
				}
				if err := conn.SendBatch(context.Background(), b).Close(); err != nil {
					t.Fatalf("sending the %s pipeline: %v", name, err)
				}
			}
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / rounds, uint64(written.Load()-w0) / rounds
	}
	without, wire := measure(false, 100)
	with, _ := measure(true, 200)
	t.Logf("per transaction of %d records (%d bytes on the wire): %d bytes allocated without Reserve, %d with", n, wire, without, with)
	if with+2*wire > without {
		t.Errorf("with Reserve, sending allocated %d bytes per transaction; without, %d: want at least %d (twice the wire bytes) less", with, without, 2*wire)
	}
}

// TestReserveSendsNothing: a reservation alone puts no byte on the wire,
// and the connection goes on answering queries.
func TestReserveSendsNothing(t *testing.T) {
	var written atomic.Int64
	conn := connect(t, &written)
	before := written.Load()
	sendbuf.Reserve(conn.PgConn(), 64<<10)
	sendbuf.Reserve(conn.PgConn(), 10) // below the minimum: nothing
	if err := conn.PgConn().Frontend().Flush(); err != nil {
		t.Fatalf("flushing after a reservation: %v", err)
	}
	if got := written.Load() - before; got != 0 {
		t.Errorf("a reservation wrote %d bytes, want 0", got)
	}
	var one int
	if err := conn.QueryRow(context.Background(), "select 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("select 1 after a reservation: %d, %v", one, err)
	}
}

// TestReserveKeepsItsBufferWithTheConnection: the buffer a reservation
// grows is kept with the connection, so the next reservation after pgx
// wrote and dropped it allocates no buffer again; the pipelines encoded
// into the kept buffer, one after another, arrive intact.
func TestReserveKeepsItsBufferWithTheConnection(t *testing.T) {
	var written atomic.Int64
	conn := connect(t, &written)
	ctx := context.Background()
	const n, rounds = 300, 4
	for r := range rounds {
		send(t, conn, &written, r, n, true)
	}
	// pgx dropped the last pipeline's buffer after writing it (over 1
	// KiB); a reservation of that size takes the kept one back.
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	sendbuf.Reserve(conn.PgConn(), 32<<10)
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got >= 1024 {
		t.Errorf("a reservation after the connection's first ones allocated %d bytes, want under 1 KiB (its kept buffer)", got)
	}
	if err := conn.PgConn().Frontend().Flush(); err != nil {
		t.Fatalf("flushing after a reservation: %v", err)
	}
	var rows, amounts, claims, events int64
	err := conn.QueryRow(ctx, `select (select count(*) from ledger), (select coalesce(sum(amount), 0) from ledger),
		(select count(distinct key) from claims), (select count(*) from outbox where convert_from(value, 'UTF8') like '{"order_id":"order-%')`).Scan(&rows, &amounts, &claims, &events)
	if err != nil {
		t.Fatal(err)
	}
	wantAmounts := int64(0)
	for i := range n {
		wantAmounts += int64(100 + i)
	}
	if rows != n*rounds || amounts != wantAmounts*rounds || claims != n*rounds || events != n*rounds {
		t.Fatalf("after %d pipelines of %d records: %d ledger rows (sum %d), %d claims, %d events; want %d rows (sum %d), %d claims and events",
			rounds, n, rows, amounts, claims, events, n*rounds, wantAmounts*rounds, n*rounds)
	}
}
