package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
)

// errNeedsHuman is returned by status after printing a report that lists
// problems, so that the command exits non-zero.
var errNeedsHuman = errors.New("something needs a human (see the report above)")

// statusEnv is what status and inspect share: the database pool, the Kafka
// admin client (nil when brokers are not needed) and the report's config.
type statusEnv struct {
	cfg   status.Config
	close func()
}

// openStatusEnv connects to DATABASE_URL and, when withKafka, to
// EXACTLY_KAFKA_BROKERS (with the consumer's SASL and TLS variables). It
// fails when a variable is unset or bad. Without Kafka (inspect) it also
// fails when the database does not answer; with Kafka (status) it does
// not try the database: status reads each part on its own and reports the
// database's parts unknown when it is down.
func openStatusEnv(ctx context.Context, withKafka bool) (*statusEnv, error) {
	open := func() (*pgxpool.Pool, error) { return poolFromDatabaseURL(ctx) }
	if withKafka {
		open = lazyPoolFromDatabaseURL
	}
	pool, err := open()
	if err != nil {
		return nil, err
	}
	env := &statusEnv{cfg: status.Config{Pool: pool, Database: os.Getenv("DATABASE_URL")}, close: pool.Close}
	if !withKafka {
		return env, nil
	}
	cl, brokers, suffix, err := kafkaClient(ctx)
	if err != nil {
		pool.Close()
		return nil, err
	}
	env.cfg.Admin, env.cfg.Kafka, env.cfg.Brokers = kadm.NewClient(cl), cl, brokers
	env.cfg.DeadLetterSuffix = suffix
	env.close = func() { cl.Close(); pool.Close() }
	return env, nil
}

// kafkaClient connects to EXACTLY_KAFKA_BROKERS with the consumer's SASL
// and TLS variables (consumer.ConfigFromEnv) and returns the client, the
// brokers and the configured dead-letter suffix. It fails when a variable is
// unset or bad.
func kafkaClient(ctx context.Context) (*kgo.Client, []string, string, error) {
	brokers, err := kafkaBrokers()
	if err != nil {
		return nil, nil, "", err
	}
	ccfg, err := consumer.ConfigFromEnv(ctx)
	if err != nil {
		return nil, nil, "", err
	}
	kopts, err := ccfg.KafkaOptions()
	if err != nil {
		return nil, nil, "", err
	}
	cl, err := kgo.NewClient(append(kopts, kgo.SeedBrokers(brokers...))...)
	if err != nil {
		return nil, nil, "", fmt.Errorf("creating a Kafka client for %v: %w", brokers, err)
	}
	return cl, brokers, ccfg.DeadLetterSuffix, nil
}

// runStatus prints (or serves, with -http) what an operator checks: lag,
// who holds the relay, outbox backlog and parked rows, guard retention,
// dead-letter topic sizes and duplicate ratios. It reads two samples
// -interval apart and fails with errNeedsHuman when the report lists a
// problem (each with what to do): a group with lag and no members, a
// partition stalled (lag and no commit over the interval), no relay
// active with old rows or more than one, parked rows, retention violated,
// held records, or a part that could not be read. It fails on bad flags, unset DATABASE_URL or
// EXACTLY_KAFKA_BROKERS, a non-loopback -http address without
// -allow-remote, a name in -allowed-hosts that is not a host or host:port,
// or an EXACTLY_JAEGER_URL that is not an absolute http(s) URL. With the
// database or the brokers down it still reports: their parts are unknown
// (a problem), the others are read.
func runStatus(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stdout)
	guard := guardFlags(fs)
	ob := outboxFlags(fs)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	httpAddr := fs.String("http", "", "serve the report as a read-only page on this address (loopback only unless -allow-remote), e.g. 127.0.0.1:8090")
	allowRemote := fs.Bool("allow-remote", false, "allow -http on a non-loopback address (the page has no authentication)")
	allowedHosts := fs.String("allowed-hosts", "", "comma-separated host names (host or host:port) the -http page answers besides its own address and localhost; any other Host header gets 421 (a DNS-rebinding guard)")
	interval := fs.Duration("interval", 5*time.Second, "time between the two samples: a partition with lag at both and no commit between them is stalled")
	refresh := fs.Duration("refresh", 5*time.Second, "how often the page reloads itself")
	grace := fs.Duration("retention-grace", status.DefaultRetentionGrace, "how far past -retention the oldest guard row may be (the pruner runs every minute)")
	groups := fs.String("groups", "", "comma-separated consumer groups (default: every group)")
	retention := fs.Duration("retention", dedupe.DefaultRetention, "guard retention the oldest guard row is held against")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: exactly status [flags]\n\nReports consumer lag, the outbox, the guard table, dead-letter topics and\nduplicate ratios from DATABASE_URL and EXACTLY_KAFKA_BROKERS; exits 1 when\nsomething needs a human. Reads only. EXACTLY_JAEGER_URL (e.g.\nhttp://localhost:16686) adds trace links.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return fmt.Errorf("parsing flags: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *interval < 0 || *refresh <= 0 || *retention <= 0 || *grace <= 0 {
		return errors.New("-interval must not be negative; -refresh, -retention and -retention-grace must be positive")
	}
	if *httpAddr != "" {
		if err := status.CheckListenAddr(*httpAddr, *allowRemote); err != nil {
			return err
		}
	}
	env, err := openStatusEnv(ctx, true)
	if err != nil {
		return err
	}
	defer env.close()
	cfg := env.cfg
	cfg.Guard, cfg.Outbox, cfg.Retention, cfg.RetentionGrace = guard(), ob(), *retention, *grace
	cfg.JaegerURL = os.Getenv("EXACTLY_JAEGER_URL")
	for _, g := range strings.Split(*groups, ",") {
		if g = strings.TrimSpace(g); g != "" {
			cfg.Groups = append(cfg.Groups, g)
		}
	}

	if *httpAddr != "" {
		c, err := status.NewCollector(cfg)
		if err != nil {
			return err
		}
		page, err := status.NewPage(c, *refresh, slog.Default())
		if err != nil {
			return err
		}
		for _, h := range strings.Split(*allowedHosts, ",") {
			if h = strings.TrimSpace(h); h != "" {
				if err := page.AllowHosts(h); err != nil {
					return err
				}
			}
		}
		return status.Serve(ctx, *httpAddr, *allowRemote, page, func(a net.Addr) {
			fmt.Fprintf(stdout, "status page on http://%s/ (JSON at /status.json); read-only\n", a)
		})
	}

	r, err := status.Collect(ctx, cfg, *interval)
	if err != nil {
		return err
	}
	if *asJSON {
		b, err := r.JSON()
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\n", b)
	} else {
		printStatus(stdout, r)
	}
	if r.NeedsHuman() {
		return errNeedsHuman
	}
	return nil
}

// traceNote is "  trace <url>" for a Jaeger link, "" without one.
func traceNote(u string) string {
	if u == "" {
		return ""
	}
	return "  trace " + u
}

// count prints n, or "unknown" for -1.
func count(n int64) string {
	if n < 0 {
		return "unknown"
	}
	return fmt.Sprint(n)
}

// printStatus writes r as text. Names from Kafka and the database are
// printed with %q so that control characters cannot forge lines.
func printStatus(w io.Writer, r *status.Report) {
	fmt.Fprintf(w, "exactly status at %s (samples %v apart)\ndatabase %s, brokers %q\n\n",
		r.Taken.Format(time.RFC3339), r.Interval, r.Database, r.Brokers)
	fmt.Fprintln(w, "consumer groups:")
	for _, g := range r.Groups {
		var members []string
		for _, m := range g.Members {
			members = append(members, status.ShowText(m.ClientID)+"@"+status.ShowText(m.Host))
		}
		note := ""
		if g.Stopped {
			note = "  STOPPED (lag not in the headline)"
		}
		if g.Stopped && g.Lag > 0 {
			note = "  NO MEMBERS, lag waiting"
		}
		fmt.Fprintf(w, "  %s  state %s  lag %s  members [%s]%s\n", status.ShowText(g.Group), g.State, count(g.Lag), strings.Join(members, ", "), note)
	}
	fmt.Fprintln(w, "consumer lag:")
	if r.Unknown("lag") {
		fmt.Fprintln(w, "  COULD NOT BE READ (see below)")
	} else if len(r.Partitions) == 0 {
		fmt.Fprintln(w, "  no committed group offsets")
	} else {
		fmt.Fprintf(w, "  %s in groups with members, %s in stopped groups (not counted)\n", count(r.Lag), count(r.StoppedLag))
	}
	for _, p := range r.Partitions {
		note := ""
		if p.Stalled {
			note = fmt.Sprintf("  STALLED (lag %d then %d, no commit over %v)", p.LagBefore, p.Lag, r.Interval)
		}
		if p.Error != "" {
			note += "  error: " + status.ShowError(p.Error)
		}
		fmt.Fprintf(w, "  %s %s/%d  committed %d  end %d  lag %d%s\n", status.ShowText(p.Group), status.ShowText(p.Topic), p.Partition, p.Committed, p.End, p.Lag, note)
	}
	parked := "n/a (no parked column)"
	if r.Outbox.ParkedKnown {
		parked = fmt.Sprint(r.Outbox.Parked)
	}
	if r.Unknown("outbox") {
		fmt.Fprintf(w, "\noutbox %s: COULD NOT BE READ (see below)\n", r.Outbox.Table)
	} else {
		fmt.Fprintf(w, "\noutbox %s: backlog %d, oldest %v, parked %s, held behind parked rows %d\n", r.Outbox.Table, r.Outbox.Backlog, r.Outbox.Oldest.Round(time.Millisecond), parked, r.Outbox.Held)
	}
	for _, o := range r.Outbox.Rows {
		if o.Parked {
			fmt.Fprintf(w, "  PARKED id %d  topic %s  key %s  size %d B  age %v  reason %s  holding %d rows%s\n",
				o.ID, status.ShowText(o.Topic), o.ShowKey(), o.Size, o.Age, status.ShowText(o.Reason), o.HeldBehind, traceNote(o.TraceURL))
		}
	}
	printRelay(w, r)
	if r.Unknown("guard") {
		fmt.Fprintf(w, "guard %s: COULD NOT BE READ (see below)\n", r.Guard.Table)
	} else {
		fmt.Fprintf(w, "guard %s: %d rows, oldest %v (retention %v)\n", r.Guard.Table, r.Guard.Rows, r.Guard.Oldest.Round(time.Second), r.Guard.Retention)
	}
	printHeld(w, r)
	fmt.Fprintln(w, "\ndead-letter topics:")
	if r.Unknown("dead_letters") {
		fmt.Fprintln(w, "  COULD NOT BE READ (see below)")
	} else if len(r.DeadLetters) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, d := range r.DeadLetters {
		fmt.Fprintf(w, "  %q: %d records\n", d.Topic, d.Records)
		for _, l := range d.Latest {
			fmt.Fprintf(w, "    %s  key %s  error %s  from %s/%s@%s  attempts %s%s\n", l.At.Format(time.RFC3339), status.ShowKey(l.RawKey), status.ShowError(l.Error),
				status.ShowText(l.OriginalTopic), optInt(l.OriginalPartition), optInt(l.OriginalOffset), optInt(l.Attempts), traceNote(l.TraceURL))
		}
	}
	fmt.Fprintln(w, "\nduplicates by scope (outcome counters):")
	if r.Unknown("outcomes") {
		fmt.Fprintln(w, "  COULD NOT BE READ (see below)")
	} else if len(r.Outcomes) == 0 {
		fmt.Fprintln(w, "  none counted")
	}
	for _, o := range r.Outcomes {
		recent := "no deliveries between samples"
		if o.Recent >= 0 {
			recent = fmt.Sprintf("%.1f%%", 100*o.Recent)
		}
		approx := ""
		if o.Estimated {
			approx = "≈"
		}
		fmt.Fprintf(w, "  %q: applied %s%d, duplicate %d, dead-lettered %d; duplicate ratio %.1f%%, recent %s\n",
			o.Scope, approx, o.Applied, o.Duplicate, o.DeadLettered, 100*o.Ratio, recent)
	}
	if r.NeedsHuman() {
		fmt.Fprintln(w, "\nNEEDS A HUMAN:")
		for _, p := range r.Problems {
			fmt.Fprintf(w, "  %s\n", p)
		}
	} else {
		fmt.Fprintln(w, "\nnothing needs a human")
	}
}

// printRelay writes who holds the outbox table's relay.
func printRelay(w io.Writer, r *status.Report) {
	switch {
	case r.Unknown("relay"):
		fmt.Fprintln(w, "relay: COULD NOT BE READ (see below)")
		return
	case len(r.Relay.Holders) == 0:
		fmt.Fprintf(w, "relay (%s): NONE ACTIVE, nobody holds it\n", r.Relay.Mechanism)
		return
	}
	state := "active"
	if !r.Relay.Active {
		state = "NONE ACTIVE"
	}
	for _, h := range r.Relay.Holders {
		fmt.Fprintf(w, "relay (%s): %s, held by %s\n", r.Relay.Mechanism, state, h)
	}
}

// printHeld writes the records the consumers hold after a failed attempt
// and the partitions paused behind them.
func printHeld(w io.Writer, r *status.Report) {
	h := r.Held
	switch {
	case r.Unknown("held"):
		fmt.Fprintln(w, "\nheld records: COULD NOT BE READ (see below)")
		return
	case !h.Known:
		fmt.Fprintln(w, "\nheld records: n/a (no held table: run exactly migrate)")
		return
	}
	fmt.Fprintf(w, "\nheld records (a handler failed; retried with backoff): %d\n", h.Total)
	for _, x := range h.Records {
		note := ""
		if x.Stuck {
			note = "  STUCK"
		}
		fmt.Fprintf(w, "  %s %s/%d@%d  key %s  attempts %d  held for %v  retry in %v  error %s%s\n", status.ShowText(x.Group), status.ShowText(x.Topic), x.Partition, x.Offset,
			x.ShowKey(), x.Attempts, x.HeldFor.Round(time.Second), max(x.RetryIn, 0).Round(time.Millisecond), status.ShowError(x.LastError), note)
	}
	if n := int64(len(h.Records)); n < h.Total {
		fmt.Fprintf(w, "  ... and %d more\n", h.Total-n)
	}
	fmt.Fprintf(w, "paused partitions (behind held records): %d\n", len(h.Paused))
	for _, p := range h.Paused {
		fmt.Fprintf(w, "  PAUSED %q %q/%d  reason %s  lowest unfinished %d  handler %q  for %v\n",
			p.Group, p.Topic, p.Partition, p.Reason, p.LowestUnfinished, p.Handler, p.PausedFor.Round(time.Second))
	}
}
