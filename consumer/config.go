package consumer

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/sethvargo/go-envconfig"
)

// Config is the consumer's configuration. [ConfigFromEnv] fills it from the
// environment; the env tag of each field names its variable, and the README
// lists them all with their defaults.
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
	// GuardTable is the guard table, optionally schema-qualified
	// ("schema.table"). It is quoted, never spliced.
	GuardTable string `env:"EXACTLY_GUARD_TABLE, default=exactly_guard"`
	// ClientID is the Kafka client id (the "client.id" setting).
	ClientID string `env:"EXACTLY_CLIENT_ID, default=exactly"`
	// MaxAttempts is how many times a failing handler runs before its record
	// is dead-lettered (when dead letters are configured). 0 means forever.
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
	// owned partition pauses past its share). One poll can overshoot the
	// bound, so the records held can reach about twice MaxInFlightRecords.
	MaxInFlightRecords int `env:"EXACTLY_MAX_INFLIGHT_RECORDS, default=10000"`
	MaxInFlightBytes   int `env:"EXACTLY_MAX_INFLIGHT_BYTES, default=67108864"`
	// SessionTimeout is the group session timeout ("session.timeout.ms"): a
	// member silent for longer loses its partitions.
	SessionTimeout time.Duration `env:"EXACTLY_SESSION_TIMEOUT, default=45s"`
	// RebalanceTimeout bounds how long a rebalance waits for members to
	// finish in-flight work and commit ("rebalance.timeout.ms").
	RebalanceTimeout time.Duration `env:"EXACTLY_REBALANCE_TIMEOUT, default=60s"`
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
	// MetricsAddr, when set, serves Prometheus metrics at
	// http://MetricsAddr/metrics (the examples and the demo pass it to
	// internal/runtime/telemetry.Setup; the consumer itself serves nothing).
	MetricsAddr string `env:"EXACTLY_METRICS_ADDR"`
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
}

// ConfigFromEnv reads the configuration from the process environment. It
// fails, naming the variable, on a value that does not parse or is out of
// range.
func ConfigFromEnv(ctx context.Context) (Config, error) {
	return ConfigFromLookuper(ctx, envconfig.OsLookuper())
}

// DefaultConfig returns the configuration with every variable unset: the
// defaults the README's table lists (no brokers, no topics, no database
// URL). Set those before calling New.
func DefaultConfig() Config {
	c, err := ConfigFromLookuper(context.Background(), envconfig.MapLookuper(nil))
	if err != nil {
		panic(fmt.Sprintf("consumer: the defaults do not validate: %v", err)) // a bug in this package
	}
	return c
}

// ConfigFromLookuper reads the configuration through l (for tests, use
// envconfig.MapLookuper). It fails like [ConfigFromEnv].
func ConfigFromLookuper(ctx context.Context, l envconfig.Lookuper) (Config, error) {
	var c Config
	if err := envconfig.ProcessWith(ctx, &envconfig.Config{Target: &c, Lookuper: l}); err != nil {
		return Config{}, fmt.Errorf("reading configuration: %w", NameVariable(&c, err))
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("reading configuration: %w", err)
	}
	return c, nil
}

// Validate checks ranges and combinations, naming the variable at fault.
func (c *Config) Validate() error {
	var problems []string
	bad := func(v, why string) { problems = append(problems, v+": "+why) }
	if c.Group == "" {
		bad("EXACTLY_GROUP", "must not be empty")
	}
	if c.MaxAttempts < 0 {
		bad("EXACTLY_MAX_ATTEMPTS", fmt.Sprintf("must be >= 0, got %d", c.MaxAttempts))
	}
	if c.RetryBackoff <= 0 {
		bad("EXACTLY_RETRY_BACKOFF", "must be positive")
	}
	if c.RetryBackoffMax < c.RetryBackoff {
		bad("EXACTLY_RETRY_BACKOFF_MAX", "must be >= EXACTLY_RETRY_BACKOFF")
	}
	if c.CommitInterval <= 0 {
		bad("EXACTLY_COMMIT_INTERVAL", "must be positive")
	}
	if c.BatchMaxRecords < 1 {
		bad("EXACTLY_BATCH_MAX_RECORDS", fmt.Sprintf("must be >= 1, got %d", c.BatchMaxRecords))
	}
	if c.MaxInFlightRecords < 1 {
		bad("EXACTLY_MAX_INFLIGHT_RECORDS", "must be >= 1")
	}
	if c.MaxInFlightBytes < 1 {
		bad("EXACTLY_MAX_INFLIGHT_BYTES", "must be >= 1")
	}
	if c.SessionTimeout < time.Second {
		bad("EXACTLY_SESSION_TIMEOUT", "must be at least 1s")
	}
	if c.RebalanceTimeout < time.Second {
		bad("EXACTLY_REBALANCE_TIMEOUT", "must be at least 1s")
	}
	if c.DeadLetterSuffix == "" {
		bad("EXACTLY_DLQ_SUFFIX", "must not be empty")
	}
	if c.DuplicateWindow < 10*time.Millisecond {
		bad("EXACTLY_DUPLICATE_WINDOW", "must be at least 10ms")
	}
	if !(c.DuplicateThreshold > 0 && c.DuplicateThreshold <= 1) {
		bad("EXACTLY_DUPLICATE_THRESHOLD", fmt.Sprintf("must be a ratio in (0, 1], got %v", c.DuplicateThreshold))
	}
	if c.DuplicateMinRecords < 1 {
		bad("EXACTLY_DUPLICATE_MIN_RECORDS", "must be >= 1")
	}
	if c.GuardRetention <= 0 || c.RedeliveryHorizon <= 0 {
		bad("EXACTLY_GUARD_RETENTION", "EXACTLY_GUARD_RETENTION and EXACTLY_REDELIVERY_HORIZON must be positive")
	} else if c.GuardRetention < c.RedeliveryHorizon && !c.AllowShortRetention {
		bad("EXACTLY_GUARD_RETENTION", fmt.Sprintf("%v is shorter than EXACTLY_REDELIVERY_HORIZON (%v): a key pruned before its last redelivery is applied again; set EXACTLY_ALLOW_SHORT_RETENTION=true to accept that",
			c.GuardRetention, c.RedeliveryHorizon))
	}
	for _, t := range c.Topics {
		if strings.TrimSpace(t) == "" {
			bad("EXACTLY_TOPICS", "contains an empty topic name")
		}
	}
	for _, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			bad("EXACTLY_KAFKA_BROKERS", "contains an empty address")
		}
	}
	c.validateSecurity(bad)
	if len(problems) > 0 {
		return fmt.Errorf("invalid configuration: %s", strings.Join(problems, "; "))
	}
	return nil
}

// NameVariable rewrites an error from go-envconfig, which names the Go
// field ("MaxAttempts: ..."), so that it names the environment variable
// instead ("EXACTLY_MAX_ATTEMPTS: ..."). target is the struct that was
// processed. Other errors are returned unchanged.
func NameVariable(target any, err error) error {
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

// VariableError is a configuration error about one environment variable.
type VariableError struct {
	Variable string
	Err      error
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
