// Package demo is `exactly demo`: the experiment of Making Background Jobs
// Idempotent with real parts. N
// credit commands, each sent three times to three different partitions, are
// consumed by two group members at once: first by a naive consumer (no
// guard), then by exactly. The counts it prints are read from the database.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/sync/errgroup"

	"github.com/exactly-go/exactly/cmd/exactly/internal/devenv"
	"github.com/exactly-go/exactly/cmd/exactly/internal/naive"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/credit"
	"github.com/exactly-go/exactly/cmd/exactly/internal/workload/notify"
	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/runtime/migrate"
	"github.com/exactly-go/exactly/internal/runtime/telemetry"
	"github.com/exactly-go/exactly/outbox"
)

// Schema holds every table of the demo; it is dropped and recreated at the
// start of a run, so a run on a configured database starts clean.
const Schema = "exactly_demo"

// Partitions of the demo's topics.
const Partitions = 6

// Config sizes a demo run.
type Config struct {
	// Commands is the number of distinct credit commands (default 100).
	Commands int
	// Copies is how often each is sent, each copy to another partition
	// (default 3).
	Copies int
	// DatabaseURL and Brokers: empty means embedded.
	DatabaseURL string
	Brokers     []string
	// Timeout bounds each phase (default 45s).
	Timeout time.Duration
	Logger  *slog.Logger
	// TracerProvider and MeterProvider, when set, trace and measure the
	// producer of the commands, the consumers and the relays: one trace
	// per command from its producer to its notification.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// Result is what a run counted in the database.
type Result struct {
	NaiveRows      int64
	NaiveTripled   bool
	GuardedRows    int64
	GuardRows      int64
	Applied        int64
	Duplicates     int64
	BalancesExact  bool
	NaiveElapsed   time.Duration
	GuardedElapsed time.Duration

	Notifications    int64
	NotifyDuplicates int64
	Republished      int
	NotifyElapsed    time.Duration
}

// Run runs the demo and prints its report to w. It fails when the
// environment cannot be started or a phase does not finish within Timeout.
func Run(ctx context.Context, cfg Config, w io.Writer) (Result, error) {
	if cfg.Commands == 0 {
		cfg.Commands = 100
	}
	if cfg.Copies == 0 {
		cfg.Copies = 3
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 45 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var res Result
	env, err := devenv.Start(ctx, devenv.Options{DatabaseURL: cfg.DatabaseURL, Brokers: cfg.Brokers, Partitions: Partitions, Logger: log})
	if err != nil {
		return res, err
	}
	defer env.Close()
	if env.EmbeddedDB {
		fmt.Fprintln(w, "demo: DATABASE_URL unset, using a private PostgreSQL")
	}
	if env.EmbeddedBroker {
		fmt.Fprintln(w, "demo: EXACTLY_KAFKA_BROKERS unset, using an embedded kfake broker")
	}

	pool, err := pgxpool.New(ctx, env.DatabaseURL)
	if err != nil {
		return res, fmt.Errorf("connecting to the database: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `drop schema if exists `+pgx.Identifier{Schema}.Sanitize()+` cascade`); err != nil {
		return res, fmt.Errorf("dropping the demo schema: %w", err)
	}
	// The migration records of the dropped tables live outside the schema:
	// forget them too, or a second run would think its tables exist.
	if _, err := pool.Exec(ctx, `do $$ begin
if to_regclass('`+migrate.TableName+`') is not null then
	delete from `+pgx.Identifier{migrate.TableName}.Sanitize()+` where component like '%' || $q$`+pgx.Identifier{Schema}.Sanitize()+`.$q$ || '%';
end if; end $$`); err != nil {
		return res, fmt.Errorf("forgetting the demo schema's migrations: %w", err)
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	topic := credit.CommandsTopic + "-" + run
	adm := kadm.NewClient(workload.Client(env.Brokers))
	defer adm.Close()
	if _, err := adm.CreateTopic(ctx, Partitions, 1, nil, topic); err != nil {
		return res, fmt.Errorf("creating topic %s: %w", topic, err)
	}
	naiveTopic := topic + "-naive"
	if _, err := adm.CreateTopic(ctx, Partitions, 1, nil, naiveTopic); err != nil {
		return res, fmt.Errorf("creating topic %s: %w", naiveTopic, err)
	}
	cmds := workload.Commands(cfg.Commands, 10)
	expected := map[int64]int64{}
	for _, c := range cmds {
		expected[c.Account] += c.Amount
	}

	// Naive: two members, one transaction per record, no guard.
	naiveSvc := credit.New(credit.WithLedgerTable(Schema, "naive_ledger"), credit.WithoutEvents(),
		credit.WithOutbox(outbox.New(outbox.WithTable(Schema, "exactly_outbox"))))
	guard := dedupe.New(dedupe.WithTable(Schema, "exactly_guard"))
	ob := outbox.New(outbox.WithTable(Schema, "exactly_outbox"))
	events := credit.EventsTopic + "-" + run
	svc := credit.New(credit.WithLedgerTable(Schema, "ledger"), credit.WithOutbox(ob), credit.WithEventsTopic(events))
	for _, m := range []func(context.Context, *pgxpool.Pool) error{naiveSvc.Migrate, svc.Migrate, guard.Migrate} {
		if err := m(ctx, pool); err != nil {
			return res, err
		}
	}
	start := time.Now()
	if err := runNaive(ctx, cfg, env, pool, naiveSvc, naiveTopic, cmds, adm, run); err != nil {
		return res, err
	}
	res.NaiveElapsed = time.Since(start)
	if err := pool.QueryRow(ctx, `select count(*) from `+naiveSvc.Ledger().Sanitize()).Scan(&res.NaiveRows); err != nil {
		return res, fmt.Errorf("counting naive ledger rows: %w", err)
	}
	res.NaiveTripled, err = balancesAre(ctx, pool, naiveSvc.Ledger(), expected, int64(cfg.Copies))
	if err != nil {
		return res, err
	}
	verdict := "balances tripled"
	if cfg.Copies != 3 {
		verdict = fmt.Sprintf("balances x%d", cfg.Copies)
	}
	if !res.NaiveTripled {
		verdict = "balances wrong"
	}
	fmt.Fprintf(w, "naive:   %d ledger rows, %s\n", res.NaiveRows, verdict)

	// Guarded: two exactly members.
	start = time.Now()
	if err := runGuarded(ctx, cfg, env, pool, svc, guard, ob, topic, cmds, adm, run, log); err != nil {
		return res, err
	}
	res.GuardedElapsed = time.Since(start)
	if err := pool.QueryRow(ctx, `select count(*) from `+svc.Ledger().Sanitize()).Scan(&res.GuardedRows); err != nil {
		return res, fmt.Errorf("counting ledger rows: %w", err)
	}
	if err := pool.QueryRow(ctx, `select count(*) from `+guard.Table().Sanitize()).Scan(&res.GuardRows); err != nil {
		return res, fmt.Errorf("counting guard rows: %w", err)
	}
	counts, err := guard.Outcomes(ctx, pool, "credit")
	if err != nil {
		return res, err
	}
	res.Applied, res.Duplicates = counts.Applied, counts.Duplicate
	res.BalancesExact, err = balancesAre(ctx, pool, svc.Ledger(), expected, 1)
	if err != nil {
		return res, err
	}
	fmt.Fprintf(w, "guarded: %d ledger rows, %d duplicates skipped\n", res.GuardedRows, res.Duplicates)

	start = time.Now()
	if err := runNotify(ctx, cfg, env, pool, guard, ob, events, run, log, &res); err != nil {
		return res, err
	}
	res.NotifyElapsed = time.Since(start)
	fmt.Fprintf(w, "notify:  %d notifications, %d duplicates skipped (the relay was crashed after the broker's ack of %d events and republished them)\n",
		res.Notifications, res.NotifyDuplicates, res.Republished)
	return res, nil
}

// runNotify publishes the account-credited events of the guarded run. The
// first relay dies after the broker acknowledged its first batch and before
// deleting the rows (as a crash there would); a second relay takes over and
// publishes them again. The notify consumer, keyed by the message-id header,
// records each credit once.
func runNotify(ctx context.Context, cfg Config, env *devenv.Env, pool *pgxpool.Pool, guard *dedupe.Guard,
	ob *outbox.Outbox, events, run string, log *slog.Logger, res *Result) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	nsvc := notify.New(Schema, "notifications")
	if err := nsvc.Migrate(ctx, pool); err != nil {
		return err
	}
	crashed := errors.New("demo: relay crashed after the broker's ack")
	first, err := outbox.NewRelay(pool, env.Brokers, outbox.RelayConfig{Outbox: ob, BatchSize: 40, Logger: log,
		Hooks: outbox.RelayHooks{AfterAck: func(_ context.Context, ids []int64) error {
			res.Republished = len(ids)
			return crashed
		}}})
	if err != nil {
		return err
	}
	err = first.Run(ctx)
	first.Close()
	if !errors.Is(err, crashed) {
		return fmt.Errorf("first relay: %w", err)
	}

	ccfg := consumer.DefaultConfig()
	ccfg.Brokers = env.Brokers
	ccfg.Group = "demo-notify-" + run
	ccfg.CommitInterval = 100 * time.Millisecond
	c, err := consumer.New(ccfg, pool, consumer.Handle(nsvc.Handler(), events), consumer.WithGuard(guard), consumer.WithLogger(log),
		consumer.WithTracerProvider(cfg.tracer()), consumer.WithMeterProvider(cfg.meter()))
	if err != nil {
		return err
	}
	second, err := outbox.NewRelay(pool, env.Brokers, outbox.RelayConfig{Outbox: ob, Logger: log,
		TracerProvider: cfg.TracerProvider, MeterProvider: cfg.MeterProvider})
	if err != nil {
		return err
	}
	defer second.Close()
	runCtx, stop := context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(runCtx)
	g.Go(func() error { return c.Run(gctx) })
	g.Go(func() error { return second.Run(gctx) })

	want := res.Applied + int64(res.Republished)
	waitErr := workload.Poll(ctx, func() (bool, error) {
		counts, err := guard.Outcomes(ctx, pool, "notify")
		return counts.Total() >= want, err
	})
	stop()
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) && waitErr == nil {
		waitErr = err
	}
	if waitErr != nil {
		return fmt.Errorf("notify run: waiting for %d deliveries: %w", want, waitErr)
	}
	if err := pool.QueryRow(ctx, `select count(*) from `+nsvc.Table().Sanitize()).Scan(&res.Notifications); err != nil {
		return fmt.Errorf("counting notifications: %w", err)
	}
	counts, err := guard.Outcomes(ctx, pool, "notify")
	if err != nil {
		return err
	}
	res.NotifyDuplicates = counts.Duplicate
	return nil
}

// runNaive starts two naive members, waits until they share the topic,
// sends the commands and waits until the group consumed them all.
func runNaive(ctx context.Context, cfg Config, env *devenv.Env, pool *pgxpool.Pool, svc *credit.Service, topic string,
	cmds []credit.Command, adm *kadm.Client, run string) error {
	group := "demo-naive-" + run
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(runCtx)
	for m := 0; m < 2; m++ {
		g.Go(func() error {
			return naive.Run(gctx, naive.Config{
				Brokers: env.Brokers, Group: group, Topics: []string{topic}, Pool: pool,
				Apply: func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
					var c credit.Command
					if err := json.Unmarshal(rec.Value, &c); err != nil {
						return err
					}
					return svc.Apply(ctx, tx, c)
				},
			})
		})
	}
	err := workload.AwaitMembers(ctx, adm, group, topic, 2, Partitions)
	if err == nil {
		err = workload.Produce(ctx, env.Brokers, topic, Partitions, cmds, cfg.Copies, cfg.produceOptions()...)
	}
	if err == nil {
		err = workload.AwaitLagZero(ctx, adm, group, topic, Partitions)
	}
	stop()
	if werr := g.Wait(); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		return fmt.Errorf("naive run: %w", err)
	}
	return nil
}

// runGuarded starts two exactly members, waits until they share the topic,
// sends the commands and waits until the outcome counters in the database
// account for every delivery.
func runGuarded(ctx context.Context, cfg Config, env *devenv.Env, pool *pgxpool.Pool, svc *credit.Service,
	guard *dedupe.Guard, ob *outbox.Outbox, topic string, cmds []credit.Command, adm *kadm.Client, run string, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	ccfg := consumer.DefaultConfig()
	ccfg.Brokers = env.Brokers
	ccfg.Group = "demo-exactly-" + run
	ccfg.Topics = []string{topic}
	ccfg.CommitInterval = 100 * time.Millisecond
	runCtx, stop := context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(runCtx)
	for m := 0; m < 2; m++ {
		c, err := consumer.New(ccfg, pool, consumer.Handle(svc.Handler()), consumer.WithGuard(guard),
			consumer.WithDeadLetters(outbox.DeadLetters(ob, ccfg.DeadLetterSuffix)), consumer.WithLogger(log),
			consumer.WithTracerProvider(cfg.tracer()), consumer.WithMeterProvider(cfg.meter()))
		if err != nil {
			stop()
			return err
		}
		g.Go(func() error { return c.Run(gctx) })
	}
	want := int64(cfg.Commands * cfg.Copies)
	waitErr := workload.AwaitMembers(ctx, adm, ccfg.Group, topic, 2, Partitions)
	if waitErr == nil {
		waitErr = workload.Produce(ctx, env.Brokers, topic, Partitions, cmds, cfg.Copies, cfg.produceOptions()...)
	}
	if waitErr == nil {
		waitErr = workload.Poll(ctx, func() (bool, error) {
			counts, err := guard.Outcomes(ctx, pool, "credit")
			return counts.Total() >= want, err
		})
	}
	if waitErr != nil {
		waitErr = fmt.Errorf("guarded run: waiting for %d deliveries: %w", want, waitErr)
	}
	stop()
	if err := g.Wait(); err != nil && waitErr == nil {
		waitErr = err
	}
	return waitErr
}

// balancesAre reports whether every account's balance in ledger is factor
// times its expected balance.
func balancesAre(ctx context.Context, pool *pgxpool.Pool, ledger pgx.Identifier, expected map[int64]int64, factor int64) (bool, error) {
	rows, err := pool.Query(ctx, `select account, sum(amount)::bigint from `+ledger.Sanitize()+` group by account`)
	if err != nil {
		return false, fmt.Errorf("reading balances: %w", err)
	}
	got := map[int64]int64{}
	var acct, bal int64
	_, err = pgx.ForEachRow(rows, []any{&acct, &bal}, func() error { got[acct] = bal; return nil })
	if err != nil {
		return false, fmt.Errorf("reading balances: %w", err)
	}
	if len(got) != len(expected) {
		return false, nil
	}
	for a, e := range expected {
		if got[a] != e*factor {
			return false, nil
		}
	}
	return true, nil
}

func (c Config) tracer() trace.TracerProvider {
	if c.TracerProvider == nil {
		return tracenoop.NewTracerProvider()
	}
	return c.TracerProvider
}

func (c Config) meter() metric.MeterProvider {
	if c.MeterProvider == nil {
		return metricnoop.NewMeterProvider()
	}
	return c.MeterProvider
}

func (c Config) produceOptions() []kgo.Opt {
	if c.TracerProvider == nil {
		return nil
	}
	return []kgo.Opt{telemetry.KafkaTracing(c.tracer(), c.meter())}
}
