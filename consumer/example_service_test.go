package consumer_test

import (
	"context"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv/broker"
	"github.com/exactly-go/exactly/outbox"
)

// The README's "Embedding a handler in your own main" is the code between
// the README markers below, verbatim (TestReadmeEmbeddingIsTheExample).

// README:begin
type Credit struct {
	OrderID string `json:"order_id"`
	Account int64  `json:"account"`
	Amount  int64  `json:"amount"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := consumer.ConfigFromEnv(ctx) // fails naming the variable on a bad value
	if err != nil {
		log.Fatal(err)
	}
	if err := run(ctx, cfg); err != nil {
		log.Fatal(err)
	}
}

// run is the whole service. consumer.Service runs the consumer, the outbox
// relay (with the consumer's SASL/TLS settings), the guard pruner and, with
// Config.MetricsAddr and consumer.WithMetricsHandler, a metrics endpoint.
func run(ctx context.Context, cfg consumer.Config) error {
	// One connection per partition worker (six here; at most 16), plus the
	// relay's and the pruner's, unless DATABASE_URL sets pool_max_conns.
	pool, err := consumer.NewPool(ctx, cfg.DatabaseURL, 6)
	if err != nil {
		return err
	}
	defer pool.Close() // after Run returned
	if _, err := pool.Exec(ctx, `create table if not exists ledger(account bigint, amount bigint)`); err != nil {
		return err
	}

	credit := handler.New("credit",
		// Where the key comes from: the business operation, not the delivery.
		handler.FromPayload(func(c Credit) string { return dedupe.Key("credit", c.OrderID) }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[Credit]) error {
			if _, err := tx.Exec(ctx, `insert into ledger(account, amount) values ($1, $2)`,
				msg.Value.Account, msg.Value.Amount); err != nil {
				return err
			}
			// Published by the relay once this transaction commits.
			return outbox.AddJSON(ctx, tx, "account-credited",
				[]byte(strconv.FormatInt(msg.Value.Account, 10)), msg.Value)
		})

	svc, err := consumer.NewService(cfg, pool, consumer.Handle(credit, "credit-commands"))
	if err != nil {
		return err
	}
	if err := svc.Migrate(ctx); err != nil { // the configured guard and outbox tables; or `exactly migrate`
		return err
	}
	// Until ctx ends; then: stop fetching, finish in-flight work, commit
	// offsets, let the relay flush the outbox, close.
	return svc.Run(ctx)
}

// README:end

// The README's main is shown, not run: an example file has no entry point.
var _ = main

// The README's service, run against an embedded broker and a fresh
// database: one credit command delivered three times on one partition,
// then another command. One ledger row and one account-credited event per
// order; the two extra deliveries are duplicates.
func ExampleService() {
	ctx := context.Background()
	b, err := broker.Start(ctx, broker.Options{Partitions: 1, Topics: []string{"credit-commands", "account-credited"}})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	dbURL := exampleDatabaseURL(ctx, "example_service")
	cfg := consumer.Config{Brokers: b.Addrs(), Group: "credit-service", DatabaseURL: dbURL}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, cfg) }()

	prod, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...))
	if err != nil {
		log.Fatal(err)
	}
	defer prod.Close()
	for _, v := range []string{
		`{"order_id":"order-8812","account":7,"amount":100}`,
		`{"order_id":"order-8812","account":7,"amount":100}`,
		`{"order_id":"order-8812","account":7,"amount":100}`,
		`{"order_id":"order-8813","account":8,"amount":5}`,
	} {
		if err := prod.ProduceSync(ctx, &kgo.Record{Topic: "credit-commands", Value: []byte(v)}).FirstErr(); err != nil {
			log.Fatal(err)
		}
	}
	// Records of one partition apply in order: once the second order's
	// event is published, every delivery before it has committed.
	events := readRecords(ctx, b.Addrs(), "account-credited", 2)
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	fmt.Println("events published:", len(events))

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	counts, err := dedupe.New().Outcomes(ctx, pool, "credit")
	if err != nil {
		log.Fatal(err)
	}
	var rows int
	if err := pool.QueryRow(ctx, `select count(*) from ledger`).Scan(&rows); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("applied=%d duplicate=%d ledger rows=%d\n", counts.Applied, counts.Duplicate, rows)
	// Output:
	// events published: 2
	// applied=2 duplicate=2 ledger rows=2
}

// readRecords consumes topic from the start until it has read want
// records, failing after 30s.
func readRecords(ctx context.Context, brokers []string, topic string, want int) []*kgo.Record {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			log.Fatalf("read %d of %d records of %s before the timeout", len(out), want, topic)
		}
		out = append(out, fs.Records()...)
	}
	return out
}

// exampleDatabaseURL creates a fresh database on the server of DATABASE_URL
// (set by TestMain) and returns its URL.
func exampleDatabaseURL(ctx context.Context, name string) string {
	pool := exampleDatabase(ctx, name)
	pool.Close()
	base := os.Getenv("DATABASE_URL")
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" {
		return base + " dbname=" + name // keyword/value form
	}
	u.Path = "/" + name
	return u.String()
}
