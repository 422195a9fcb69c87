package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/runtime/apply"
	"github.com/exactly-go/exactly/internal/runtime/brokerlog"
	"github.com/exactly-go/exactly/internal/runtime/redact"
	"github.com/exactly-go/exactly/internal/runtime/telemetry"
	"github.com/exactly-go/exactly/outbox"
)

// fetchMaxWait is how long a fetch may wait at the broker for records
// (kgo.FetchMaxWait); see Run.
const fetchMaxWait = 100 * time.Millisecond

// Consumer is one member of a Kafka consumer group whose handlers' effects
// happen once. Build it with [New] and start it with [Consumer.Run].
type Consumer struct {
	cfg   Config
	pool  *pgxpool.Pool
	guard *dedupe.Guard
	// effects is the guard's effects table, where handlers built with
	// handler.NewWithCall record their calls' results.
	effects *dedupe.Effects
	log     *slog.Logger
	hooks   Hooks
	kopts   []kgo.Opt
	// fetchPools lends franz-go the memory of the records the dispatcher
	// recycles (fetchpools.go).
	fetchPools fetchPools
	deadLetter handler.DeadLetterFunc
	handles    []handle
	// Read only by NewService and Run's statement check (selfcheck.go):
	// the service's outbox and metrics handler.
	outbox         *outbox.Outbox
	metricsHandler http.Handler
	routes         map[string]handler.Any
	topics         []string

	tp      trace.TracerProvider
	mp      metric.MeterProvider
	tel     map[string]*apply.Telemetry // by handler name
	spikes  map[string]*telemetry.DuplicateRate
	metrics metric.Registration
	build   metric.Registration // exactly.build_info
	// committed is the registration of exactly.consumer.committed_offset,
	// committedAt what it reads (committed.go).
	committed   metric.Registration
	committedAt committedOffsets
	// groupLag is the group's lag read from the broker (grouplag.go),
	// groupLagReg the registration of its gauges.
	groupLag    groupLag
	groupLagReg metric.Registration

	// joined is true from the first assignment of a group generation
	// (franz-go calls OnPartitionsAssigned after every join, even with
	// nothing assigned) until the partitions are lost or Run shuts down:
	// the group part of readiness (Service.Ready).
	joined atomic.Bool
	// fetchErrs watches the poll loop's fetch errors (fetcherr.go).
	fetchErrs *fetchErrors
	// commitErrs rate-limits the log of failing commits (fetcherr.go).
	commitErrs commitErrors

	// serverFree is the connections the database had free when Run
	// started (pool.go), -1 when unknown: the pool-size warning never
	// asks for more.
	serverFree int

	cl    *kgo.Client
	limit *inflight
	calls *callSlots // the instance's pre-transaction calls (Config.MaxCallsInFlight)
	// runners runs those calls on goroutines kept between calls; Run
	// ends them when it returns.
	runners *callRunners
	// callMetrics records the calls' durations and the calls skipped.
	callMetrics *telemetry.CallInstruments

	mu      sync.Mutex
	workers map[tp]*worker
	// inCommit is the periodic or final commit in progress (nil when
	// none), for detach to cancel and await; commitMu is held for the
	// whole of one, so that they do not overlap.
	inCommit *inCommit
	commitMu sync.Mutex
}

// inCommit is one commit of owned partitions' marks in progress: cancel
// stops it, done is closed when it ended.
type inCommit struct {
	cancel context.CancelFunc
	done   chan struct{}
}

type handle struct {
	handler handler.Any
	topics  []string
}

type tp struct {
	topic     string
	partition int32
}

// New checks the configuration and the handlers and builds a consumer. It
// fails when cfg is invalid, when a handler is invalid (see
// handler.Handler.Validate), or when a topic has no handler or two.
// pool must reach the database that holds the guard table and the
// handlers' tables; its size bounds how many partitions work at once.
func New(cfg Config, pool *pgxpool.Pool, opts ...Option) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	cfg = cfg.withDefaults()
	if pool == nil {
		return nil, errors.New("consumer: nil database pool")
	}
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("consumer: Config.Brokers: no brokers configured")
	}
	c := &Consumer{cfg: cfg, pool: pool, log: slog.Default(), routes: map[string]handler.Any{}, workers: map[tp]*worker{}}
	// SASL and TLS from the configuration first, so WithKafkaOptions wins.
	sec, err := cfg.KafkaOptions()
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	c.kopts = sec
	for _, o := range opts {
		o(c)
	}
	// Secrets never reach the log, whatever an error quotes.
	c.log = slog.New(redact.Handler(c.log.Handler(), cfg.Secrets()...))
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	if c.guard == nil {
		schema, table := splitTable(cfg.GuardTable)
		c.guard = dedupe.New(dedupe.WithTable(schema, table))
	}
	c.effects = dedupe.NewEffects(c.guard)
	if len(c.handles) == 0 {
		return nil, errors.New("consumer: no handlers: pass consumer.Handle(h)")
	}
	for _, h := range c.handles {
		if h.handler == nil {
			return nil, errors.New("consumer: nil handler")
		}
		if err := h.handler.Validate(); err != nil {
			return nil, fmt.Errorf("consumer: %w", err)
		}
		if err := dedupe.ValidateScope(h.handler.Scope()); err != nil {
			return nil, fmt.Errorf("consumer: handler %q: %w", h.handler.Name(), err)
		}
		topics := h.topics
		if len(topics) == 0 {
			topics = cfg.Topics
		}
		if len(topics) == 0 {
			return nil, fmt.Errorf("consumer: handler %q has no topics: pass them to consumer.Handle or set Config.Topics", h.handler.Name())
		}
		for _, t := range topics {
			if prev, dup := c.routes[t]; dup {
				return nil, fmt.Errorf("consumer: topic %q has two handlers, %q and %q", t, prev.Name(), h.handler.Name())
			}
			c.routes[t] = h.handler
			c.topics = append(c.topics, t)
		}
	}
	c.limit = newInflight(cfg.MaxInFlightRecords, cfg.MaxInFlightBytes)
	c.calls = newCallSlots(cfg.MaxCallsInFlight)
	c.runners = newCallRunners(cfg.MaxCallsInFlight)
	if err := c.instrument(); err != nil {
		return nil, fmt.Errorf("consumer: creating metrics: %w", err)
	}
	if c.committed, err = c.observeCommitted(); err != nil {
		return nil, fmt.Errorf("consumer: creating metrics: %w", err)
	}
	if c.groupLagReg, err = c.observeGroupLag(); err != nil {
		return nil, fmt.Errorf("consumer: creating metrics: %w", err)
	}
	return c, nil
}

// instrument builds each handler's telemetry, adds 0 to its counters for
// each topic routed to the handler (apply.Telemetry.Announce) and registers the
// observable gauges (consumer lag per partition, duplicate ratio per
// handler, build info).
func (c *Consumer) instrument() error {
	c.tel = map[string]*apply.Telemetry{}
	c.spikes = map[string]*telemetry.DuplicateRate{}
	for _, h := range c.handles {
		name := h.handler.Name()
		if _, ok := c.tel[name]; ok {
			continue
		}
		sp := telemetry.NewDuplicateRate(c.cfg.DuplicateWindow, c.cfg.DuplicateThreshold, c.cfg.DuplicateMinRecords, nil)
		t, err := apply.NewTelemetry(c.tp, c.mp, c.cfg.Group, sp, c.log)
		if err != nil {
			return err
		}
		t.Scrub(c.cfg.Secrets()...)
		c.tel[name], c.spikes[name] = t, sp
	}
	for topic, h := range c.routes {
		c.tel[h.Name()].Announce(context.Background(), h.Name(), []string{topic})
	}
	var err error
	if c.build, err = telemetry.ObserveBuildInfo(c.mp); err != nil {
		return err
	}
	if c.fetchErrs, err = newFetchErrors(c.mp, c.log, c.cfg.Group); err != nil {
		return err
	}
	if c.callMetrics, err = telemetry.NewCallInstruments(c.mp, c.cfg.Group); err != nil {
		return err
	}
	c.metrics, err = telemetry.ObserveConsumer(c.mp, c.cfg.Group, func(o telemetry.ConsumerObserver) {
		for name, sp := range c.spikes {
			r, _ := sp.Ratio()
			o.DuplicateRatio(name, r)
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		for key, w := range c.workers {
			if n, ok := w.lag(); ok {
				o.Lag(key.topic, key.partition, n)
			}
			records, paused := c.limit.state(key)
			o.Partition(key.topic, key.partition, int64(records), int64(w.heldRecords()), paused)
			if w.callShare {
				o.Calls(key.topic, key.partition, w.callsNow.Load(), w.callsWaiting.Load())
			}
		}
	})
	return err
}

// Run joins the group and consumes until ctx is cancelled or the client
// fails fatally. On cancellation it stops fetching, lets every in-flight
// transaction finish, commits the offsets of what finished, and leaves the
// group; it then returns nil. Records that had been fetched but not started
// are left for the next owner. Run may be called once.
//
// Before it joins the group, Run checks the guard table: when it is missing
// or its schema is behind, Run fails at once with a [*SchemaError] (run
// dedupe.Guard.Migrate or `exactly migrate`), instead of every partition
// retrying its batches for ever. When the database cannot be asked (it is
// down, or still starting), Run logs a warning and consumes anyway: its
// batches are retried until the database is back, as in any outage.
//
// It then records which scope each handler claims keys in, per topic, for
// the group (the guard's scopes table), and fails with a
// [*ScopeChangeError] when a member of the group recorded another scope
// for the same topic: a handler renamed without handler.WithScope, whose
// members would apply every key a second time. Config.AllowScopeChange
// lets it start anyway.
//
// Last, it sends the statements every batch sends (the guard's claims, a
// dead-letter mark, the outbox's rows) once, in a transaction it rolls
// back, and fails with a [*StatementError] when the pool's connections
// cannot send them: their parameters cannot be encoded in the pool's query
// exec mode. The check is bounded (5 s); its other failures are logged, as
// for the guard table's.
func (c *Consumer) Run(ctx context.Context) error {
	if err := c.checkSchema(ctx); err != nil {
		var se *SchemaError
		switch {
		case ctx.Err() != nil:
			return nil // cancelled before it began: as after any cancellation
		case errors.As(err, &se):
			return err
		}
		c.log.Warn("could not check the guard table before joining the group; consuming anyway, batches are retried until the database is back",
			"guard_table", c.guard.Table().Sanitize(), "error", err)
	}
	// A handler renamed without its scope refuses to start (scope.go).
	if err := c.checkScopes(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	// A statement every batch sends but the pool cannot (selfcheck.go)
	// refuses to start, rather than failing every batch as an outage.
	if err := c.checkStatements(ctx); err != nil {
		var se *StatementError
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &se):
			return se
		}
		c.log.Warn("could not check exactly's statements before joining the group; consuming anyway",
			"guard_table", c.guard.Table().Sanitize(), "error", err)
	}
	c.serverFree = serverFree(ctx, c.pool)
	// A fetch of caught-up partitions waits at the broker up to the fetch
	// max wait, and the client sends no other fetch to that broker
	// meanwhile: a partition resumed from its in-flight bound (inflight.go)
	// waits that long for its next records. franz-go's 5s default stalled
	// the busy partitions for ~5s each time the others were caught up
	// (make bench: 100,000 records in 9s instead of 4s); 100ms bounds that
	// stall at the cost of ten empty fetches a second per broker when idle.
	// Set first, so WithKafkaOptions(kgo.FetchMaxWait(…)) overrides it.
	opts := append([]kgo.Opt{kgo.FetchMaxWait(fetchMaxWait)}, c.kopts...)
	opts = append(opts,
		kgo.SeedBrokers(c.cfg.Brokers...),
		kgo.ClientID(c.cfg.ClientID),
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.SessionTimeout(c.cfg.SessionTimeout),
		kgo.RebalanceTimeout(c.cfg.RebalanceTimeout),
	)
	if c.cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(c.cfg.InstanceID))
	}
	opts = append(opts,
		// The client's own fetch buffers sit outside the in-flight
		// accounting, and franz-go keeps a fetch's records in one slab
		// until every record of it is released: small fetches keep the
		// member's memory set by the limits, not by the backlog (peak RSS
		// 54 MiB at 100,000 records vs 45 MiB at 10,000, make bench).
		kgo.FetchMaxBytes(int32(min(max(c.cfg.MaxInFlightBytes/256, 256<<10), 50<<20))),
		kgo.FetchMaxPartitionBytes(int32(min(max(c.cfg.MaxInFlightBytes/1024, 64<<10), 1<<20))),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Transaction markers (the outbox relay publishes in Kafka
		// transactions) come with the records, so that the committed
		// offset passes a partition's trailing marker (see dispatch):
		// else a caught-up group would show a lag of 1 for ever.
		kgo.KeepControlRecords(),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
		kgo.WithHooks(brokerlog.New(c.log)),
		// After the options of WithKafkaOptions: pools of the user's come
		// first, and franz-go takes from the first.
		kgo.WithPools(&c.fetchPools),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("creating kafka client: %w", err)
	}
	if err := c.checkAccess(ctx, cl); err != nil {
		cl.Close()
		return err
	}
	c.mu.Lock()
	c.cl = cl
	c.mu.Unlock()
	c.limit.setClient(cl)

	lagCtx, stopLag := context.WithCancel(ctx)
	lagDone := make(chan struct{})
	go func() {
		defer close(lagDone)
		c.watchGroupLag(lagCtx, cl)
	}()

	commitDone := make(chan struct{})
	commitCtx, stopCommitter := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer close(commitDone)
		c.commitLoop(commitCtx)
	}()

	var runErr error
	for {
		// One poll may overshoot the in-flight bound by up to a poll's worth;
		// polling only the room left starves the workers (make bench: 16k
		// instead of 74k duplicates/s).
		fetches := cl.PollRecords(ctx, c.cfg.MaxInFlightRecords)
		if ctx.Err() != nil {
			cl.AllowRebalance()
			break
		}
		if fetches.IsClientClosed() {
			runErr = errors.New("kafka client closed")
			break
		}
		// Fetch errors are logged when they appear and then rarely, and
		// polls that return only errors are spaced out (fetcherr.go).
		wait, gone := c.fetchErrs.observe(ctx, fetches, time.Now())
		c.dispatch(fetches)
		cl.AllowRebalance()
		c.afterFetchErrors(ctx, cl, wait, gone)
	}

	c.joined.Store(false)
	stopLag()
	<-lagDone
	// Shutdown: finish in-flight transactions, commit, leave. The workers
	// stay registered until the final commit is done, so the final commit
	// is fenced like a periodic one: a revoke or loss that comes meanwhile
	// detaches its partitions (their marks are dropped) and cancels the
	// commit if it is in progress.
	c.mu.Lock()
	all := make([]*worker, 0, len(c.workers))
	for _, w := range c.workers {
		all = append(all, w)
	}
	c.mu.Unlock()
	c.stopWorkers(all)
	stopCommitter()
	<-commitDone
	shutdownCtx, cancel := context.WithTimeout(context.Background(), c.cfg.RebalanceTimeout)
	c.commitOwned(shutdownCtx)
	cancel()
	// Workers of partitions assigned during the shutdown got no records;
	// they are stopped with the others.
	c.mu.Lock()
	rest := make([]*worker, 0, len(c.workers))
	for _, w := range c.workers {
		rest = append(rest, w)
	}
	c.workers = map[tp]*worker{}
	c.mu.Unlock()
	c.stopWorkers(rest)
	c.runners.stop() // every worker stopped: no call runs
	cl.CloseAllowingRebalance()
	if c.metrics != nil {
		_ = c.metrics.Unregister()
	}
	if c.build != nil {
		_ = c.build.Unregister()
	}
	if c.committed != nil {
		_ = c.committed.Unregister()
	}
	if c.groupLagReg != nil {
		_ = c.groupLagReg.Unregister()
	}
	return runErr
}

// checkSchema fails with a [*SchemaError] when the guard table (whose
// migrations also create the outcome counters every batch writes) is
// missing or behind, and with a wrapped database error when it cannot tell.
func (c *Consumer) checkSchema(ctx context.Context) error {
	return checkTable(ctx, c.pool, c.guard.Table(), func() (int, int, error) { return c.guard.SchemaVersion(ctx, c.pool) })
}

// dispatch hands fetched records to their partition workers. Records of
// partitions this member does not own (any more) are dropped: the next
// owner fetches them from the committed offset.
func (c *Consumer) dispatch(fetches kgo.Fetches) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		w, ok := c.workers[tp{p.Topic, p.Partition}]
		if !ok {
			return
		}
		w.fetched(p.HighWatermark, p.Records[0].Offset)
		// Transaction markers are not records to process: a marker
		// between records is passed by the mark of the record after it;
		// the markers a fetch ends with are passed once every record
		// before them is done (worker.passMarkers).
		recs := p.Records
		if n := len(recs); recs[n-1].Attrs.IsControl() {
			first := n - 1
			for first > 0 && recs[first-1].Attrs.IsControl() {
				first--
			}
			w.passMarkers(recs[first].Offset, kgo.EpochOffset{Epoch: recs[n-1].LeaderEpoch, Offset: recs[n-1].Offset + 1})
			recs = recs[:first]
		}
		data := recs[:0]
		for _, r := range recs {
			if !r.Attrs.IsControl() {
				data = append(data, r)
			}
		}
		if len(data) == 0 {
			return
		}
		var bytes int
		for _, r := range data {
			bytes += len(r.Value) + len(r.Key)
		}
		c.limit.add(tp{p.Topic, p.Partition}, len(data), bytes)
		w.enqueue(data)
	})
}

func (c *Consumer) assigned(ctx context.Context, _ *kgo.Client, assigned map[string][]int32) {
	if ctx.Err() == nil {
		c.joined.Store(true)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, parts := range assigned {
		h := c.routes[topic]
		for _, p := range parts {
			key := tp{topic, p}
			if _, ok := c.workers[key]; ok {
				continue
			}
			w := newWorker(c, topic, p, h)
			if w.callShare = c.cfg.KeyConcurrency > 1 && h.UnitCalls(); w.callShare {
				c.calls.join() // before its records arrive: every share is set by then
			}
			c.workers[key] = w
			delete(c.committedAt, key) // another member may have committed since
			c.limit.register(key)
			go w.run()
		}
		c.log.Info("partitions assigned", "topic", topic, "partitions", parts, "group", c.cfg.Group)
	}
	// Each partition worker holds one connection for its batch's
	// transaction: with fewer than the sizing rule gives them, workers
	// queue for connections the database could serve. The advice never
	// asks for more than half of what the server had free.
	conns := int(c.pool.Config().MaxConns)
	want := int(PoolConns(len(c.workers)))
	if c.serverFree >= 0 {
		want = min(want, conns+c.serverFree/2)
	}
	if conns < want {
		c.log.Warn("fewer pool connections than the sizing rule gives the partition workers: workers wait for connections; raise the pool's max_conns to suggested_max_conns (consumer.PoolConns, within the server's free connections)",
			"workers", len(c.workers), "max_conns", conns, "suggested_max_conns", want, "group", c.cfg.Group)
	}
}

// revoked waits for the in-flight work of the revoked partitions, then
// commits their offsets synchronously, before the rebalance goes on.
func (c *Consumer) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	ws := c.detach(revoked)
	c.stopWorkers(ws)
	if h := c.hooks.OnRevoke; h != nil {
		h(ctx, RevokeData{Revoked: revoked})
	}
	c.commitWorkers(ctx, cl, ws)
	for topic, parts := range revoked {
		c.log.Info("partitions revoked", "topic", topic, "partitions", parts)
	}
}

// lost stops the workers of lost partitions and commits nothing: another
// member may own them already.
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.joined.Store(false)
	ws := c.detach(lost)
	c.stopWorkers(ws)
	for topic, parts := range lost {
		c.log.Warn("partitions lost; their uncommitted offsets are dropped", "topic", topic, "partitions", parts)
	}
}

// detach forgets the workers of parts, so no commit includes their marks
// from now on. A commit of owned partitions in progress (which took its
// marks before) is cancelled and waited for: franz-go holds a commit back
// during a rebalance and retries a refused one, and would send it later
// for partitions another member may own by then, or hold the rebalance
// for as long as it retries. A commit starting after detach no longer
// sees these workers, so detach does not wait for it.
func (c *Consumer) detach(parts map[string][]int32) []*worker {
	c.mu.Lock()
	cur := c.inCommit
	if cur != nil {
		cur.cancel()
	}
	var ws []*worker
	for topic, ps := range parts {
		for _, p := range ps {
			key := tp{topic, p}
			if w, ok := c.workers[key]; ok {
				ws = append(ws, w)
				delete(c.workers, key)
			}
		}
	}
	c.mu.Unlock()
	if cur != nil {
		<-cur.done
	}
	return ws
}

func (c *Consumer) stopWorkers(ws []*worker) {
	for _, w := range ws {
		w.stop()
	}
	for _, w := range ws {
		<-w.done
		if w.callShare && w.leftCalls.CompareAndSwap(false, true) { // a worker may be stopped twice (Run)
			c.calls.leave()
		}
		key := tp{w.topic, w.partition}
		records, bytes := w.dropQueued()
		c.limit.sub(key, records, bytes)
		c.limit.unregister(key)
	}
}

// commitLoop commits the marks of owned partitions every CommitInterval
// until ctx is done.
func (c *Consumer) commitLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.commitOwned(ctx)
	}
}

// commitOwned commits the marks of the partitions this member owns now.
// It holds commitMu throughout and publishes itself as c.inCommit, so that
// a revoke or loss (detach) cancels it and waits for it to end: no commit
// it makes carries marks of partitions detached before or during it.
func (c *Consumer) commitOwned(ctx context.Context) {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	c.mu.Lock()
	ws := make([]*worker, 0, len(c.workers))
	for _, w := range c.workers {
		ws = append(ws, w)
	}
	commitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	cur := &inCommit{cancel: cancel, done: make(chan struct{})}
	c.inCommit = cur
	cl := c.cl
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.inCommit = nil
		c.mu.Unlock()
		close(cur.done)
	}()
	c.commitWorkers(commitCtx, cl, ws)
}

// commitWorkers commits, synchronously, the offsets the workers marked and
// did not commit yet.
func (c *Consumer) commitWorkers(ctx context.Context, cl *kgo.Client, ws []*worker) {
	offsets := map[string]map[int32]kgo.EpochOffset{}
	var marked []*worker
	for _, w := range ws {
		eo, ok := w.pending()
		if !ok {
			continue
		}
		if offsets[w.topic] == nil {
			offsets[w.topic] = map[int32]kgo.EpochOffset{}
		}
		offsets[w.topic][w.partition] = eo
		marked = append(marked, w)
	}
	if len(offsets) == 0 {
		return
	}
	var commitErr error
	cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			commitErr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode != 0 {
					commitErr = fmt.Errorf("partition %s/%d: error code %d", t.Topic, p.Partition, p.ErrorCode)
				}
			}
		}
	})
	if commitErr != nil {
		c.commitErrs.failed(c.log, commitErr, time.Now())
		return
	}
	c.commitErrs.succeeded(c.log, time.Now())
	done := map[string]map[int32]int64{}
	for _, w := range marked {
		eo := offsets[w.topic][w.partition]
		w.committed(eo)
		if done[w.topic] == nil {
			done[w.topic] = map[int32]int64{}
		}
		done[w.topic][w.partition] = eo.Offset
	}
	c.noteCommitted(done)
	if c.hooks.OnOffsetsCommitted != nil {
		c.hooks.OnOffsetsCommitted(ctx, OffsetsCommittedData{Offsets: done})
	}
}
