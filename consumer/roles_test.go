package consumer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// docGrants returns the grant statements of the first SQL block of
// docs/database-roles.md, with exactly_app replaced by role and mydb by
// database: the grants the test gives its role are the documented ones, so
// a grant the code needs and the document lacks fails the test.
func docGrants(t *testing.T, role, database string) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/database-roles.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(doc), "```sql\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("docs/database-roles.md has no sql block")
	}
	var grants []string
	for _, line := range strings.Split(block, "\n") {
		if strings.HasPrefix(line, "grant ") {
			grants = append(grants, strings.NewReplacer("exactly_app", role, "mydb", database).Replace(line))
		}
	}
	if len(grants) < 7 || !strings.Contains(block, "on ledger to exactly_app") {
		t.Fatalf("docs/database-roles.md: %d grants read, want the connect, schema, guard, counter, outbox and ledger ones:\n%s", len(grants), block)
	}
	return strings.Join(grants, "\n")
}

// The consumer (claims, outcome counters, dead letters and outbox rows) and
// the relay (lock, LISTEN, read, delete, park) run end to end as a role
// holding only the documented grants, after the owner ran the migrations;
// so do listing and retrying a parked row ("exactly outbox parked|retry").
func TestLeastPrivilegedRole(t *testing.T) {
	ctx := context.Background()
	ownerURL := testenv.DBURL(t)
	owner, err := pgxpool.New(ctx, ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	setupLedger(t, owner) // dedupe.Migrate and the handler's table, as the owner
	if err := outbox.Migrate(ctx, owner); err != nil {
		t.Fatal(err)
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	role := "exactly_app_" + hex.EncodeToString(rnd[:])
	ident := pgx.Identifier{role}.Sanitize()
	if _, err := owner.Exec(ctx, "create role "+ident+" login password 'app-pw' nosuperuser nocreatedb nocreaterole noinherit"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Before the database is dropped: its privileges, then the role.
		_, _ = owner.Exec(ctx, "drop owned by "+ident)
		_, _ = owner.Exec(ctx, "drop role "+ident)
	})
	if _, err := owner.Exec(ctx, "revoke all on schema public from public; revoke all on database "+
		pgx.Identifier{strings.TrimPrefix(mustURL(t, ownerURL).Path, "/")}.Sanitize()+" from public"); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, docGrants(t, ident, pgx.Identifier{strings.TrimPrefix(mustURL(t, ownerURL).Path, "/")}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	u := mustURL(t, ownerURL)
	u.User = url.UserPassword(role, "app-pw")
	app, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.Close)
	var who string
	if err := app.QueryRow(ctx, "select current_user").Scan(&who); err != nil || who != role {
		t.Fatalf("connected as %q (%v), want %q", who, err, role)
	}
	if _, err := app.Exec(ctx, "create table nope(x int)"); err == nil {
		t.Fatal("the application role can create tables: not least-privileged")
	}

	const n = 20
	brokers := testenv.Brokers(testenv.Kafka(t, 2, "credits", "credited", "credits.dlq", "audit"))
	setTopicMaxMessageBytes(t, brokers, "audit", 2000)
	produceCopies(t, brokers, "credits", n, 2, 2)
	testenv.Produce(t, brokers, &kgo.Record{Topic: "credits", Partition: 0, Value: []byte("not json")})

	ob := outbox.New()
	emit := creditEmitter(ob)
	o := newOutcomes()
	var mu sync.Mutex
	var retries []error // a missing grant shows up here, as a retried batch
	hooks := o.hooks()
	hooks.OnRetry = func(_ context.Context, d consumer.RetryData) {
		err := d.Err
		mu.Lock()
		retries = append(retries, err)
		mu.Unlock()
	}
	startConsumer(t, testConfig(brokers, "roles", "credits"), app, consumer.Handle(emit),
		consumer.WithHooks(hooks), consumer.WithDeadLetters(outbox.DeadLetters(ob, "")))
	parked := make(chan string, 4)
	relay, err := outbox.NewRelay(app, brokers, outbox.RelayConfig{Outbox: ob, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		Hooks:  outbox.RelayHooks{OnParked: func(_ int64, topic string, key []byte, _ string) { parked <- topic + "/" + string(key) }}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()
	t.Cleanup(func() { stopRelay(); <-relayDone; relay.Close() })

	o.await(t, 60*time.Second, "every record", func() bool { return o.total() >= 2*n+1 })
	if a, d, dl := o.get("applied"), o.get("duplicate"), o.get("dead_lettered"); a != n || d != n || dl != 1 {
		t.Errorf("applied=%d duplicate=%d dead_lettered=%d, want %d, %d, 1", a, d, dl, n, n)
	}
	mu.Lock()
	for _, err := range retries {
		t.Errorf("retried as the application role: %v", err)
	}
	mu.Unlock()
	published := testenv.ReadTopic(t, brokers, "credited", n)
	if len(published) != n {
		t.Errorf("published %d events, want %d", len(published), n)
	}
	testenv.ReadTopic(t, brokers, "credits.dlq", 1)
	eventuallyZero(t, owner, `select count(*) from exactly_outbox`)
	if got := count(t, owner, `select count(*) from ledger`); got != n {
		t.Errorf("ledger rows = %d, want %d", got, n)
	}
	// n applied keys, plus the dead-lettered record's mark.
	if got := count(t, owner, `select count(*) from exactly_guard`); got != n+1 {
		t.Errorf("guard rows = %d, want %d", got, n+1)
	}
	if got := count(t, owner, `select count(*) from exactly_guard where state = 'dead_lettered'`); got != 1 {
		t.Errorf("dead-lettered marks = %d, want 1", got)
	}
	// Pruning as the application role: a zero retention deletes every row.
	if pruned, err := dedupe.New().Prune(ctx, app, 0, 7); err != nil || pruned != n+1 {
		t.Errorf("prune as the application role: %d rows, %v; want %d", pruned, err, n+1)
	}
	if got := count(t, owner, `select coalesce(sum(applied), 0) + coalesce(sum(duplicate), 0) + coalesce(sum(dead_lettered), 0) from exactly_guard_outcomes`); got != 2*n+1 {
		t.Errorf("outcome counters sum to %d, want %d", got, 2*n+1)
	}

	// Parking and retrying as the application role: a row over its
	// topic's max.message.bytes is parked by the relay (an update), listed,
	// and, once the topic's limit is raised, released by Retry (an update)
	// and published.
	if err := pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
		return ob.Add(ctx, tx, outbox.Message{Topic: "audit", Key: []byte("big"), Value: make([]byte, 3000)})
	}); err != nil {
		t.Fatalf("adding as the application role: %v", err)
	}
	ob.Wake(app)
	select {
	case got := <-parked:
		if got != "audit/big" {
			t.Fatalf("parked %s, want audit/big", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the relay, as the application role, did not park the oversized row within 30s")
	}
	if list, err := ob.Parked(ctx, app, outbox.ParkFilter{}); err != nil || len(list) != 1 {
		t.Fatalf("listing parked rows as the application role: %+v, %v; want one", list, err)
	}
	setTopicMaxMessageBytes(t, brokers, "audit", 10000)
	if released, err := ob.Retry(ctx, app, outbox.ParkFilter{Topic: "audit", Key: []byte("big")}); err != nil || len(released) != 1 {
		t.Fatalf("retrying as the application role: %+v, %v; want one row", released, err)
	}
	if recs := testenv.ReadTopic(t, brokers, "audit", 1); len(recs) != 1 || len(recs[0].Value) != 3000 {
		t.Errorf("published %d audit records, want the retried 3000-byte one", len(recs))
	}
	eventuallyZero(t, owner, `select count(*) from exactly_outbox`)
}

// setTopicMaxMessageBytes sets topic's max.message.bytes.
func setTopicMaxMessageBytes(t *testing.T, brokers []string, topic string, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	v := strconv.Itoa(n)
	res, err := kadm.NewClient(cl).AlterTopicConfigs(context.Background(), []kadm.AlterConfig{{Name: "max.message.bytes", Value: &v}}, topic)
	if err == nil {
		err = res[0].Err
	}
	if err != nil {
		t.Fatalf("setting max.message.bytes of %s to %d: %v", topic, n, err)
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
