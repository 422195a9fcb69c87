package consumer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
)

// countingPools is a user's franz-go pool (kgo.WithPools) that counts the
// record arrays franz-go takes and gets back, and hands back the arrays it
// got.
type countingPools struct {
	mu         sync.Mutex
	records    [][]kgo.Record
	gets, puts int
	reused     int // gets answered with an array given back before
	bufs       [][]byte
	put        chan struct{} // signalled by every PutRecords
}

func (p *countingPools) GetRecords(n int) []kgo.Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gets++
	for i, r := range p.records {
		if cap(r) >= n {
			p.records = append(p.records[:i], p.records[i+1:]...)
			p.reused++
			return r[:0]
		}
	}
	return make([]kgo.Record, 0, n)
}

func (p *countingPools) PutRecords(r []kgo.Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.puts++
	p.records = append(p.records, r)
	select {
	case p.put <- struct{}{}:
	default:
	}
}

func (p *countingPools) GetDecompressBytes([]byte, kgo.CompressionCodecType) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.bufs); n > 0 {
		b := p.bufs[n-1]
		p.bufs = p.bufs[:n-1]
		return b
	}
	return nil
}

func (p *countingPools) PutDecompressBytes(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bufs = append(p.bufs, b)
}

func (p *countingPools) counts() (gets, puts, reused int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gets, p.puts, p.reused
}

// TestRecordsGoBackToTheFetchPools: the consumer gives a record's memory
// back to franz-go's pools once it is done with it, and nothing it or its
// users hold reads that memory afterwards. Two rounds of 300 credits on two
// partitions through a user's pool: the second round's fetches reuse the
// first round's record arrays; every credit's row has its own order and
// amount; the records' in-flight bytes are released (a bound of 8 KiB lets
// them through); and the dead letters a sink kept from the first round (their
// bytes are the sink's, a copy) still hold their records' values after the
// second round refilled the memory.
func TestRecordsGoBackToTheFetchPools(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kc := testenv.Kafka(t, 2, "credits")
	brokers := testenv.Brokers(kc)
	pools := &countingPools{put: make(chan struct{}, 1)}
	var mu sync.Mutex
	kept := map[string][]byte{} // order -> the value the dead-letter sink got
	sink := func(_ context.Context, _ pgx.Tx, rec handler.Record, _ string, _ int, _ error) error {
		var c credit
		if err := json.Unmarshal(rec.Value, &c); err != nil {
			return err
		}
		mu.Lock()
		kept[c.OrderID] = rec.Value // kept as given, not copied
		mu.Unlock()
		return nil
	}
	h := handler.New("credit", creditKey(), func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
		if strings.HasSuffix(msg.Value.OrderID, "-dead") {
			return handler.Permanent(errors.New("a credit for a closed account"))
		}
		_, err := tx.Exec(ctx, `insert into ledger(order_id, account, amount) values($1, $2, $3)`, msg.Value.OrderID, msg.Value.Account, msg.Value.Amount)
		return err
	})
	o := newOutcomes()
	cfg := testConfig(brokers, "fetch-pools", "credits")
	// About 60 records' bytes per partition: records whose in-flight bytes
	// were not released before their memory went back would hold the
	// partitions paused for good.
	cfg.MaxInFlightBytes = 8 << 10
	stop := startConsumer(t, cfg, pool, consumer.Handle(h),
		consumer.WithDeadLetters(sink), consumer.WithHooks(o.hooks()),
		consumer.WithKafkaOptions(kgo.WithPools(pools)))
	defer stop()

	value := func(i int) []byte {
		id := fmt.Sprintf("order-%d", i)
		if i%100 == 7 {
			id += "-dead"
		}
		v, _ := json.Marshal(credit{OrderID: id, Account: int64(i % 10), Amount: int64(i + 1)})
		return v
	}
	const perRound = 300
	for round := range 2 {
		var recs []*kgo.Record
		for i := round * perRound; i < (round+1)*perRound; i++ {
			recs = append(recs, &kgo.Record{Topic: "credits", Partition: int32(i % 2), Value: value(i)})
		}
		produceManual(t, brokers, recs...)
		want := (round + 1) * perRound
		o.await(t, 30*time.Second, fmt.Sprintf("%d outcomes", want), func() bool { return o.total() >= want })
		if round == 0 {
			// The records of the first round go back once compacted out of
			// their windows, right after their outcomes are reported.
			select {
			case <-pools.put:
			case <-time.After(10 * time.Second):
				t.Fatal("no record array came back to the pool after 300 records")
			}
		}
	}
	gets, puts, reused := pools.counts()
	if puts == 0 || reused == 0 {
		t.Errorf("record arrays: %d taken, %d given back, %d reused; want some given back and reused", gets, puts, reused)
	}
	var rows, orders int
	var sum int64
	if err := pool.QueryRow(ctx, `select count(*), count(distinct order_id), coalesce(sum(amount), 0) from ledger`).Scan(&rows, &orders, &sum); err != nil {
		t.Fatal(err)
	}
	var wantSum int64
	for i := range 2 * perRound {
		if i%100 != 7 {
			wantSum += int64(i + 1)
		}
	}
	if rows != 2*perRound-6 || orders != rows || sum != wantSum {
		t.Errorf("ledger: %d rows of %d orders summing %d; want %d rows of as many orders summing %d", rows, orders, sum, 2*perRound-6, wantSum)
	}
	var wrong int
	if err := pool.QueryRow(ctx, `select count(*) from ledger where amount <> 1 + substring(order_id from 7)::int`).Scan(&wrong); err != nil {
		t.Fatal(err)
	}
	if wrong != 0 {
		t.Errorf("%d ledger rows hold another record's amount", wrong)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(kept) != 6 {
		t.Fatalf("%d dead letters, want 6", len(kept))
	}
	for i := 7; i < 2*perRound; i += 100 {
		id := fmt.Sprintf("order-%d-dead", i)
		if got := kept[id]; !bytes.Equal(got, value(i)) {
			t.Errorf("the dead letter of %s kept %q, want %q (its bytes were reused)", id, got, value(i))
		}
	}
}
