package deadletters_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/deadletters"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// letter is a dead letter as outbox.DeadLetters writes it: key, value and
// the dead-letter headers, on partition p of orders.dlq.
func letter(key []byte, p int32, origOffset int, at time.Time, reason string) *kgo.Record {
	return &kgo.Record{Topic: "orders.dlq", Partition: p, Key: key, Value: []byte("v"), Headers: []kgo.RecordHeader{
		{Key: "app", Value: []byte("x")},
		{Key: outbox.HeaderError, Value: []byte(reason)},
		{Key: outbox.HeaderAttempts, Value: []byte("3")},
		{Key: outbox.HeaderHandler, Value: []byte("credit")},
		{Key: outbox.HeaderOriginalTopic, Value: []byte("orders")},
		{Key: outbox.HeaderOriginalPartition, Value: []byte(strconv.Itoa(int(p)))},
		{Key: outbox.HeaderOriginalOffset, Value: []byte(strconv.Itoa(origOffset))},
		{Key: outbox.HeaderDeadLetteredAt, Value: []byte(at.Format(time.RFC3339Nano))},
	}}
}

func client(t *testing.T, brokers []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func TestReadListsLatestPerTopicAndEveryLetterOfAKey(t *testing.T) {
	brokers := testenv.Brokers(testenv.Kafka(t, 2, "orders", "orders.dlq", "payments.dlq", "other"))
	cl := client(t, brokers)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	recs := []*kgo.Record{
		letter([]byte("a"), 0, 10, t0, "boom 1"),
		letter([]byte("b"), 1, 11, t0.Add(time.Minute), "boom b"),
		letter([]byte("a"), 0, 12, t0.Add(2*time.Minute), "boom 2"),
		letter(nil, 1, 13, t0.Add(3*time.Minute), "no key"),
		letter([]byte("a"), 0, 14, t0.Add(4*time.Minute), "boom 3"),
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	got, err := deadletters.Read(t.Context(), cl, deadletters.Options{Latest: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Topic != "orders.dlq" || got[1].Topic != "payments.dlq" {
		t.Fatalf("topics %+v, want orders.dlq and payments.dlq (other is no dead-letter topic)", got)
	}
	if got[0].Records != 5 || len(got[0].Letters) != 2 {
		t.Fatalf("orders.dlq: %d records, %d letters; want 5 and the latest 2", got[0].Records, len(got[0].Letters))
	}
	if got[1].Records != 0 || len(got[1].Letters) != 0 {
		t.Errorf("payments.dlq: %+v, want empty", got[1])
	}
	keyless, last := got[0].Letters[0], got[0].Letters[1]
	if keyless.Key != "(null)" || keyless.Error != "no key" || last.Error != "boom 3" {
		t.Errorf("latest two: %+v, %+v; want the keyless one then a's third", keyless, last)
	}
	if last.Key != "a" || last.Handler != "credit" || last.OriginalTopic != "orders" ||
		last.Attempts == nil || *last.Attempts != 3 || last.OriginalPartition == nil || *last.OriginalPartition != 0 ||
		last.OriginalOffset == nil || *last.OriginalOffset != 14 || !last.At.Equal(t0.Add(4*time.Minute)) ||
		last.Topic != "orders.dlq" || last.Partition != 0 {
		t.Errorf("latest letter %+v: headers misread", last)
	}

	got, err = deadletters.Read(t.Context(), cl, deadletters.Options{Topics: []string{"orders.dlq"}, Latest: -1,
		Match: func(l deadletters.Letter) bool { return string(l.RawKey) == "a" }})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[0].Letters) != 3 {
		t.Fatalf("key a: %+v, want its three dead letters", got)
	}
	for i, l := range got[0].Letters {
		if want := "boom " + strconv.Itoa(i+1); l.Error != want {
			t.Errorf("letter %d of key a: %q, want %q (oldest first)", i, l.Error, want)
		}
	}

	if _, err := deadletters.Read(t.Context(), cl, deadletters.Options{Topics: []string{"missing.dlq"}}); err == nil {
		t.Error("reading a missing topic succeeded")
	}
}

// A dead-letter topic written in Kafka transactions ends in a commit
// marker, which takes the last offset but is no record a consumer sees:
// Read still ends once it has read the partition, instead of waiting for
// that offset until its context ends.
func TestReadEndsAtATransactionMarker(t *testing.T) {
	brokers := testenv.Brokers(testenv.Kafka(t, 1, "orders", "orders.dlq"))
	tx, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.TransactionalID("dlq-writer"))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	if err := tx.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := tx.ProduceSync(t.Context(), letter([]byte("a"), 0, 10, time.Now(), "in a transaction")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := tx.EndTransaction(t.Context(), kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	got, err := deadletters.Read(ctx, client(t, brokers), deadletters.Options{Topics: []string{"orders.dlq"}, Latest: -1})
	if err != nil {
		t.Fatalf("reading a topic that ends in a commit marker: %v", err)
	}
	if len(got) != 1 || len(got[0].Letters) != 1 || got[0].Letters[0].Error != "in a transaction" {
		t.Fatalf("read %+v, want the one dead letter", got)
	}
}
