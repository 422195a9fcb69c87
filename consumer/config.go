package consumer

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/sethvargo/go-envconfig"
)

// Config is the consumer's configuration. A zero field means its
// documented default (the env tag's default), so a literal such as
// Config{Brokers: brokers, Group: "billing"} is complete. [ConfigFromEnv]
// fills it from the environment instead; the env tag of each field names
// its variable, and docs/configuration.md lists them all with their defaults.
type Config struct {
	// Brokers are the Kafka seed brokers. Empty means "none configured":
	// the examples and the demo then start an embedded broker.
	Brokers []string `env:"EXACTLY_KAFKA_BROKERS"`
	// Group is the Kafka consumer group.
	Group string `env:"EXACTLY_GROUP, default=exactly"`
	// Topics are the topics consumed by handlers registered without topics.
	Topics []string `env:"EXACTLY_TOPICS"`
	// DatabaseURL is the PostgreSQL connection string. Empty means "none
	// configured": the examples and the demo then start a private cluster.
	DatabaseURL string `env:"DATABASE_URL"`
	// ListenDatabaseURL, when set, is a direct connection to PostgreSQL
	// (not through a transaction-mode pooler such as PgBouncer) on which
	// the outbox relay LISTENs for notifications; see
	// outbox.RelayConfig.ListenConnString. Empty: the relay LISTENs on the
	// pool when it is a direct connection, and polls behind a pooler.
	ListenDatabaseURL string `env:"EXACTLY_LISTEN_DATABASE_URL"`
	// GuardTable is the guard table, optionally schema-qualified
	// ("schema.table"). It is quoted, never spliced.
	GuardTable string `env:"EXACTLY_GUARD_TABLE, default=exactly_guard"`
	// ClientID is the Kafka client id (the "client.id" setting).
	ClientID string `env:"EXACTLY_CLIENT_ID, default=exactly"`
	// MaxAttempts is how many times a failing handler runs before its record
	// is dead-lettered (when dead letters are configured). 0 means the
	// default (5), as for every field; [RetryForever] (-1) retries until
	// the handler succeeds, holding its key, or its partition with
	// KeyConcurrency 1 (a handler.Permanent
	// error is still dead-lettered at once). Any other negative value is a
	// [*ConfigError]. In the environment, EXACTLY_MAX_ATTEMPTS=-1 is
	// RetryForever, and EXACTLY_MAX_ATTEMPTS=0 is refused like every
	// numeric variable set to 0 (unset it for the default).
	MaxAttempts int `env:"EXACTLY_MAX_ATTEMPTS, default=5"`
	// RetryBackoff is the first wait after a failed attempt; it doubles up to
	// RetryBackoffMax. Outages (database down) use the same schedule.
	RetryBackoff    time.Duration `env:"EXACTLY_RETRY_BACKOFF, default=100ms"`
	RetryBackoffMax time.Duration `env:"EXACTLY_RETRY_BACKOFF_MAX, default=10s"`
	// CommitInterval is how often marked offsets are committed to Kafka.
	// Offsets are also committed on revoke and at shutdown.
	CommitInterval time.Duration `env:"EXACTLY_COMMIT_INTERVAL, default=1s"`
	// BatchMaxRecords is the largest number of one partition's records that
	// share one transaction. Batches form from what is already fetched, so
	// light traffic gives small batches (low latency) and a backlog gives
	// large ones (throughput). 1 means one transaction per record.
	BatchMaxRecords int `env:"EXACTLY_BATCH_MAX_RECORDS, default=100"`
	// MaxInFlightRecords and MaxInFlightBytes bound the records fetched but
	// not yet committed to the database; past either, fetching pauses (each
	// owned partition pauses past its share). A partition is paused only
	// once a fetch brought it over its share, and a fetch brings whole
	// record batches as producers wrote them (up to the topic's
	// max.message.bytes, thousands of small records): the records held can
	// reach MaxInFlightRecords plus one record batch per owned partition.
	MaxInFlightRecords int `env:"EXACTLY_MAX_INFLIGHT_RECORDS, default=10000"`
	MaxInFlightBytes   int `env:"EXACTLY_MAX_INFLIGHT_BYTES, default=67108864"`
	// KeyConcurrency is how many records of different keys one partition
	// works on at once. Records of one key (the Kafka record key, the
	// dedupe key, and any lock key a handler declares) run one at a time
	// in offset order; records of other keys go on while one retries, and
	// the pre-transaction calls of handlers built with handler.WithCall
	// run concurrently, up to this many per partition. It also bounds the
	// records of a partition that may be held (backing off after a failed
	// attempt) at once: past it, the partition pauses. 1 turns key
	// concurrency off: a partition's records apply in offset order and a
	// retrying record holds its whole partition.
	KeyConcurrency int `env:"EXACTLY_KEY_CONCURRENCY, default=64"`
	// MaxCallsInFlight bounds the pre-transaction calls (handler.WithCall)
	// running at once in this instance, over all its partitions.
	// A partition takes at most its fair share of them, MaxCallsInFlight
	// divided by the instance's partitions with such handlers (rounded
	// up, at least 1), so that calls that hang on one partition hold only
	// that partition's share.
	MaxCallsInFlight int `env:"EXACTLY_MAX_CALLS_IN_FLIGHT, default=64"`
	// CallTimeout is the deadline of one pre-transaction call
	// (handler.WithCall, handler.NewWithCall): its context is cancelled
	// then, and the call's error is a failed attempt of its record (held,
	// retried with backoff, dead-lettered after MaxAttempts). A call still
	// running after half of it is logged at WARN and listed as held
	// (`exactly status`, `exactly inspect`) while it runs. At revoke and
	// shutdown the consumer waits at most CallTimeout, and at most 5s, for
	// calls to return; a call still running then is abandoned (its result
	// dropped: the next owner calls again with the same idempotency key).
	CallTimeout time.Duration `env:"EXACTLY_CALL_TIMEOUT, default=30s"`
	// MaxOffsetGap bounds how far, in offsets, a partition with key
	// concurrency works ahead of its lowest unfinished record (the offset
	// it commits): past it, the partition pauses until that record
	// finishes. It bounds what a restart re-runs (as duplicates).
	MaxOffsetGap int `env:"EXACTLY_MAX_OFFSET_GAP, default=1000"`
	// SessionTimeout is the group session timeout ("session.timeout.ms"): a
	// member silent for longer loses its partitions.
	SessionTimeout time.Duration `env:"EXACTLY_SESSION_TIMEOUT, default=45s"`
	// RebalanceTimeout bounds how long a rebalance waits for members to
	// finish in-flight work and commit ("rebalance.timeout.ms").
	RebalanceTimeout time.Duration `env:"EXACTLY_REBALANCE_TIMEOUT, default=60s"`
	// InstanceID makes this member a static member of the group (KIP-345,
	// franz-go's kgo.InstanceID, "group.instance.id"): a member that
	// restarts with the same id within SessionTimeout gets its partitions
	// back without a rebalance, and the others keep theirs. The trade-off
	// is the session timeout: a static member that leaves does not leave
	// the group (franz-go does not send LeaveGroup for it), so its
	// partitions wait SessionTimeout before another member takes them,
	// unless it comes back first. Each running member needs an id of its
	// own (a pod's stable name); two members with one id fence each other.
	// Empty means a dynamic member.
	InstanceID string `env:"EXACTLY_INSTANCE_ID"`
	// GroupLagInterval is how often the consumer reads its group's lag
	// from the broker (end offsets minus the group's committed offsets,
	// for every partition of its topics, not only the ones it owns) for
	// the gauges exactly.consumer.group_lag,
	// exactly.consumer.group_committed_offset and
	// exactly.consumer.group_members: a member that died or froze keeps
	// its partitions' lag visible, rising, on the others' series.
	GroupLagInterval time.Duration `env:"EXACTLY_GROUP_LAG_INTERVAL, default=10s"`
	// DeadLetterSuffix is appended to a topic's name to form its dead-letter
	// topic.
	DeadLetterSuffix string `env:"EXACTLY_DLQ_SUFFIX, default=.dlq"`
	// SASLMechanism authenticates to the brokers with SASL: PLAIN,
	// SCRAM-SHA-256 or SCRAM-SHA-512; empty means no SASL. SASLUser and
	// SASLPassword are then required. The password never appears in logs
	// or errors (String and LogValue redact it). See [Config.KafkaOptions].
	SASLMechanism string `env:"EXACTLY_KAFKA_SASL_MECHANISM"`
	SASLUser      string `env:"EXACTLY_KAFKA_SASL_USER"`
	SASLPassword  string `env:"EXACTLY_KAFKA_SASL_PASSWORD"`
	// TLS connects to the brokers over TLS, verified against the system
	// roots, or against TLSCAFile (PEM) when set. TLSCertFile and TLSKeyFile
	// (PEM) are a client certificate for mutual TLS; TLSServerName overrides
	// the name verified; TLSSkipVerify turns verification off (tests only).
	TLS           bool   `env:"EXACTLY_KAFKA_TLS, default=false"`
	TLSCAFile     string `env:"EXACTLY_KAFKA_TLS_CA_FILE"`
	TLSCertFile   string `env:"EXACTLY_KAFKA_TLS_CERT_FILE"`
	TLSKeyFile    string `env:"EXACTLY_KAFKA_TLS_KEY_FILE"`
	TLSServerName string `env:"EXACTLY_KAFKA_TLS_SERVER_NAME"`
	TLSSkipVerify bool   `env:"EXACTLY_KAFKA_TLS_SKIP_VERIFY, default=false"`
	// MetricsAddr is where a [Service] serves the handler given by
	// [WithMetricsHandler], at http://MetricsAddr/metrics (":0" picks a
	// free port). Empty serves nothing. The Prometheus handler comes from
	// consumer/otelexport, so the core does not link Prometheus and has no
	// handler of its own: [NewService] fails with a [*ConfigError] when
	// MetricsAddr is set without WithMetricsHandler. [New] does not read
	// it (a caller of New serves its handler itself, as `exactly demo`
	// does).
	MetricsAddr string `env:"EXACTLY_METRICS_ADDR"`
	// ShutdownTimeout bounds how long a [Service], after its consumer has
	// stopped and committed, lets the outbox relay publish what is left
	// before it stops it. Rows left then are published by the next relay.
	ShutdownTimeout time.Duration `env:"EXACTLY_SHUTDOWN_TIMEOUT, default=10s"`
	// DuplicateWindow, DuplicateThreshold and DuplicateMinRecords tune the
	// duplicate-rate diagnostic: when, over the last DuplicateWindow, at
	// least DuplicateMinRecords records reached a handler and more than
	// DuplicateThreshold (a ratio) of them were duplicates, the consumer
	// logs a warning and counts an exactly.duplicate_spikes event: mass
	// redelivery. A steady trickle of duplicates is normal.
	DuplicateWindow     time.Duration `env:"EXACTLY_DUPLICATE_WINDOW, default=1m"`
	DuplicateThreshold  float64       `env:"EXACTLY_DUPLICATE_THRESHOLD, default=0.25"`
	DuplicateMinRecords int           `env:"EXACTLY_DUPLICATE_MIN_RECORDS, default=50"`
	// GuardRetention is how long guard rows are kept by the pruner a
	// service runs beside its consumer (dedupe.Pruner). It must not be
	// shorter than RedeliveryHorizon, the longest time after which a record
	// can still arrive again (retries plus the dead-letter replay window),
	// unless AllowShortRetention says so: a key pruned before its last
	// redelivery is applied again.
	GuardRetention      time.Duration `env:"EXACTLY_GUARD_RETENTION, default=336h"`
	RedeliveryHorizon   time.Duration `env:"EXACTLY_REDELIVERY_HORIZON, default=168h"`
	AllowShortRetention bool          `env:"EXACTLY_ALLOW_SHORT_RETENTION, default=false"`
	// GuardGenerationSpan is how long the guard's current generation takes
	// claims before the pruner seals it (dedupe.PrunerConfig.GenerationSpan);
	// 0 means half of GuardRetention. Claims probe every sealed generation:
	// a shorter span costs each claim more probes, for rows kept closer to
	// the retention (docs/operations.md, "Guard table size").
	GuardGenerationSpan time.Duration `env:"EXACTLY_GUARD_GENERATION_SPAN, default=0s"`
	// AllowScopeChange lets a member start although one of its handlers
	// claims keys in another scope than the one its group recorded for the
	// topic (a handler renamed without handler.WithScope): the member
	// records the new scope and logs an error-level line. Without it
	// Consumer.Run fails with a [*ScopeChangeError]. Set it only for a
	// deliberate change of scope, once no member runs the old one: keys
	// claimed in one scope are not deduplicated against the other.
	AllowScopeChange bool `env:"EXACTLY_ALLOW_SCOPE_CHANGE, default=false"`
}

// RetryForever is the Config.MaxAttempts (EXACTLY_MAX_ATTEMPTS=-1) that
// retries a failing handler until it succeeds: its record holds its key
// (its partition with key concurrency off) and is never dead-lettered for
// failing, only for a
// handler.Permanent error.
const RetryForever = -1

// executorMaxAttempts is Config.MaxAttempts (defaults filled in) as
// apply.Executor.MaxAttempts reads it, where 0 means "never dead-letter":
// the one place the public value is mapped to the executor's.
func (c Config) executorMaxAttempts() int {
	if c.MaxAttempts == RetryForever {
		return 0
	}
	return c.MaxAttempts
}

// ConfigFromEnv reads the configuration from the process environment. It
// fails, naming the variable, on a value that does not parse or is out of
// range.
func ConfigFromEnv(ctx context.Context) (Config, error) {
	return ConfigFromLookuper(ctx, envconfig.OsLookuper())
}

// DefaultConfig returns the configuration with every default filled in:
// what a zero Config means, and what docs/configuration.md lists (no brokers,
// no topics, no database URL).
func DefaultConfig() Config { return Config{}.withDefaults() }

// ConfigFromLookuper reads the configuration through l (for tests, use
// envconfig.MapLookuper). It fails like [ConfigFromEnv], naming variables.
func ConfigFromLookuper(ctx context.Context, l envconfig.Lookuper) (Config, error) {
	var c Config
	if err := envconfig.ProcessWith(ctx, &envconfig.Config{Target: &c, Lookuper: l}); err != nil {
		return Config{}, fmt.Errorf("reading configuration: %w", nameVariable(&c, err))
	}
	// In a Config literal a zero number means the default; a variable set
	// to 0 is a mistake to report, not to replace silently.
	var zeros []FieldError
	d := reflect.ValueOf(defaults())
	v := reflect.ValueOf(c)
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		switch f.Type.Kind() {
		case reflect.Int, reflect.Int64, reflect.Float64:
		default:
			continue
		}
		if val, set := l.Lookup(name); set && strings.TrimSpace(val) != "" && v.Field(i).IsZero() && !d.Field(i).IsZero() {
			reason := fmt.Sprintf("must not be 0 (unset it for the default, %v)", d.Field(i))
			if f.Name == "MaxAttempts" {
				reason += fmt.Sprintf("; to retry a failing handler for ever, set %d (consumer.RetryForever)", RetryForever)
			}
			zeros = append(zeros, FieldError{Field: "Config." + f.Name, Reason: reason})
		}
	}
	err := c.Validate()
	var ce *ConfigError
	if err != nil && !errors.As(err, &ce) {
		return Config{}, fmt.Errorf("reading configuration: %w", err)
	}
	if ce != nil || len(zeros) > 0 {
		if ce == nil {
			ce = &ConfigError{}
		}
		ce = &ConfigError{Problems: append(zeros, ce.Problems...)}
		return Config{}, fmt.Errorf("reading configuration: %w", ce.inEnvTerms())
	}
	// Certificate and key files are read now, so a bad one fails at
	// start-up naming its variable, not later naming a field.
	if _, err := c.KafkaOptions(); err != nil {
		return Config{}, fmt.Errorf("reading configuration: %w", &renamedError{msg: envTerms().Replace(err.Error()), err: err})
	}
	return c, nil
}

// defaults is what every zero field of a Config means: the defaults of the
// env tags, parsed once per call (no package state).
func defaults() Config {
	var d Config
	if err := envconfig.ProcessWith(context.Background(), &envconfig.Config{Target: &d, Lookuper: envconfig.MapLookuper(nil)}); err != nil {
		panic(fmt.Sprintf("consumer: the env tag defaults do not parse: %v", err)) // a bug in this package
	}
	return d
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	d := reflect.ValueOf(defaults())
	v := reflect.ValueOf(&c).Elem()
	for i := 0; i < v.NumField(); i++ {
		if f := v.Field(i); f.IsZero() {
			f.Set(d.Field(i))
		}
	}
	return c
}

// FieldError is one problem with one [Config] field.
type FieldError struct {
	// Field is the field at fault, as "Config.MaxAttempts".
	Field string
	// Reason says what is wrong with it; it may name other fields.
	Reason string
}

// ConfigError is what [Config.Validate] returns: every problem found, each
// naming its field. Use errors.As to inspect it.
type ConfigError struct {
	Problems []FieldError
}

// Error lists every problem, "Field: reason", separated by semicolons.
func (e *ConfigError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.Field + ": " + p.Reason
	}
	return "invalid configuration: " + strings.Join(parts, "; ")
}

// inEnvTerms returns e with every field name, in Field and in Reason,
// replaced by the environment variable that sets it.
func (e *ConfigError) inEnvTerms() *ConfigError {
	r := envTerms()
	out := &ConfigError{Problems: make([]FieldError, len(e.Problems))}
	for i, p := range e.Problems {
		out.Problems[i] = FieldError{Field: r.Replace(p.Field), Reason: r.Replace(p.Reason)}
	}
	return out
}

// renamedError is err with its message in environment terms; errors.Is and
// errors.As still reach err (an *os.PathError, say).
type renamedError struct {
	msg string
	err error
}

func (e *renamedError) Error() string { return e.msg }
func (e *renamedError) Unwrap() error { return e.err }

// envTerms replaces every "Config.Field" with the environment variable that
// sets the field.
func envTerms() *strings.Replacer {
	t := reflect.TypeOf(Config{})
	var pairs []string
	// Longest field names first, so "Config.RetryBackoffMax" is not
	// rewritten as "EXACTLY_RETRY_BACKOFFMax".
	fields := make([]reflect.StructField, 0, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		fields = append(fields, t.Field(i))
	}
	sort.Slice(fields, func(i, j int) bool { return len(fields[i].Name) > len(fields[j].Name) })
	for _, f := range fields {
		if name, _, _ := strings.Cut(f.Tag.Get("env"), ","); name != "" {
			pairs = append(pairs, "Config."+f.Name, name)
		}
	}
	return strings.NewReplacer(pairs...)
}

// Validate checks ranges and combinations of c with its defaults filled in
// (so a zero field is never at fault). It returns a [*ConfigError] naming
// every field at fault, or nil.
func (c *Config) Validate() error {
	v := c.withDefaults()
	var problems []FieldError
	bad := func(field, why string) {
		problems = append(problems, FieldError{Field: "Config." + field, Reason: why})
	}
	if v.MaxAttempts < 1 && v.MaxAttempts != RetryForever {
		bad("MaxAttempts", fmt.Sprintf("must be >= 1, or %d (consumer.RetryForever) to retry until the handler succeeds, got %d", RetryForever, v.MaxAttempts))
	}
	if v.RetryBackoff < 0 {
		bad("RetryBackoff", "must be positive")
	}
	if v.RetryBackoffMax < v.RetryBackoff {
		bad("RetryBackoffMax", fmt.Sprintf("must be >= Config.RetryBackoff (%v), got %v", v.RetryBackoff, v.RetryBackoffMax))
	}
	if v.CommitInterval < 0 {
		bad("CommitInterval", "must be positive")
	}
	if v.BatchMaxRecords < 1 {
		bad("BatchMaxRecords", fmt.Sprintf("must be >= 1, got %d", v.BatchMaxRecords))
	}
	if v.MaxInFlightRecords < 1 {
		bad("MaxInFlightRecords", fmt.Sprintf("must be >= 1, got %d", v.MaxInFlightRecords))
	}
	if v.MaxInFlightBytes < 1 {
		bad("MaxInFlightBytes", fmt.Sprintf("must be >= 1, got %d", v.MaxInFlightBytes))
	}
	if v.KeyConcurrency < 1 {
		bad("KeyConcurrency", fmt.Sprintf("must be >= 1 (1: key concurrency off), got %d", v.KeyConcurrency))
	}
	if v.MaxCallsInFlight < 1 {
		bad("MaxCallsInFlight", fmt.Sprintf("must be >= 1, got %d", v.MaxCallsInFlight))
	}
	if v.CallTimeout < 0 {
		bad("CallTimeout", fmt.Sprintf("must be positive, got %v", v.CallTimeout))
	}
	if v.MaxOffsetGap < 1 {
		bad("MaxOffsetGap", fmt.Sprintf("must be >= 1, got %d", v.MaxOffsetGap))
	}
	if v.SessionTimeout < time.Second {
		bad("SessionTimeout", fmt.Sprintf("must be at least 1s, got %v", v.SessionTimeout))
	}
	if v.GroupLagInterval < 100*time.Millisecond {
		bad("GroupLagInterval", fmt.Sprintf("must be at least 100ms, got %v", v.GroupLagInterval))
	}
	if v.RebalanceTimeout < time.Second {
		bad("RebalanceTimeout", fmt.Sprintf("must be at least 1s, got %v", v.RebalanceTimeout))
	}
	if v.ShutdownTimeout < 0 {
		bad("ShutdownTimeout", fmt.Sprintf("must not be negative, got %v", v.ShutdownTimeout))
	}
	if v.DuplicateWindow < 10*time.Millisecond {
		bad("DuplicateWindow", fmt.Sprintf("must be at least 10ms, got %v", v.DuplicateWindow))
	}
	if !(v.DuplicateThreshold > 0 && v.DuplicateThreshold <= 1) {
		bad("DuplicateThreshold", fmt.Sprintf("must be a ratio in (0, 1], got %v", v.DuplicateThreshold))
	}
	if v.DuplicateMinRecords < 1 {
		bad("DuplicateMinRecords", fmt.Sprintf("must be >= 1, got %d", v.DuplicateMinRecords))
	}
	if v.GuardGenerationSpan < 0 {
		bad("GuardGenerationSpan", "Config.GuardGenerationSpan must not be negative")
	}
	if v.GuardRetention < 0 || v.RedeliveryHorizon < 0 {
		bad("GuardRetention", "Config.GuardRetention and Config.RedeliveryHorizon must be positive")
	} else if v.GuardRetention < v.RedeliveryHorizon && !v.AllowShortRetention {
		bad("GuardRetention", fmt.Sprintf("%v is shorter than Config.RedeliveryHorizon (%v): a key pruned before its last redelivery is applied again; set Config.AllowShortRetention to accept that",
			v.GuardRetention, v.RedeliveryHorizon))
	}
	if strings.Count(v.GuardTable, ".") > 1 || strings.HasPrefix(v.GuardTable, ".") || strings.HasSuffix(v.GuardTable, ".") {
		bad("GuardTable", fmt.Sprintf("must be \"table\" or \"schema.table\", got %q", v.GuardTable))
	}
	for _, t := range v.Topics {
		if strings.TrimSpace(t) == "" {
			bad("Topics", "contains an empty topic name")
		}
	}
	for _, b := range v.Brokers {
		if strings.TrimSpace(b) == "" {
			bad("Brokers", "contains an empty address")
		}
	}
	v.validateSecurity(bad)
	if len(problems) > 0 {
		return &ConfigError{Problems: problems}
	}
	return nil
}

// nameVariable rewrites an error from go-envconfig, which names the Go
// field ("MaxAttempts: ..."), so that it names the environment variable
// instead ("EXACTLY_MAX_ATTEMPTS: ..."). target is the struct that was
// processed. Other errors are returned unchanged.
func nameVariable(target any, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	t := reflect.TypeOf(target)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if name == "" {
			continue
		}
		if strings.HasPrefix(msg, f.Name+":") {
			return &VariableError{Variable: name, Err: err}
		}
	}
	return err
}

// VariableError is what [ConfigFromEnv] returns for an environment
// variable whose value does not parse. Use errors.As to inspect it.
type VariableError struct {
	// Variable is the environment variable at fault.
	Variable string
	// Err is go-envconfig's error.
	Err error
}

// Error names the variable first.
func (e *VariableError) Error() string {
	msg := e.Err.Error()
	if _, rest, ok := strings.Cut(msg, ":"); ok {
		msg = strings.TrimSpace(rest)
	}
	return e.Variable + ": " + msg
}

// Unwrap returns go-envconfig's error.
func (e *VariableError) Unwrap() error { return e.Err }

// splitTable splits "schema.table" into its parts; a name without a dot has
// an empty schema (the search_path decides).
func splitTable(name string) (schema, table string) {
	if s, t, ok := strings.Cut(name, "."); ok {
		return s, t
	}
	return "", name
}
