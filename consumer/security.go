package consumer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/exactly-go/exactly/internal/runtime/redact"
)

// The SASL mechanisms Config.SASLMechanism accepts.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// validateSecurity appends the problems of the SASL and TLS settings.
func (c *Config) validateSecurity(bad func(v, why string)) {
	switch strings.ToUpper(c.SASLMechanism) {
	case "":
		if c.SASLUser != "" {
			bad("SASLUser", "set without Config.SASLMechanism")
		}
		if c.SASLPassword != "" {
			bad("SASLPassword", "set without Config.SASLMechanism")
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if c.SASLUser == "" {
			bad("SASLUser", "must be set with Config.SASLMechanism")
		}
		if c.SASLPassword == "" {
			bad("SASLPassword", "must be set with Config.SASLMechanism")
		}
	default:
		bad("SASLMechanism", fmt.Sprintf("must be %s, %s or %s, got %q",
			SASLPlain, SASLScramSHA256, SASLScramSHA512, c.SASLMechanism))
	}
	if !c.TLS {
		for _, s := range []struct {
			v   string
			set bool
		}{
			{"TLSCAFile", c.TLSCAFile != ""},
			{"TLSCertFile", c.TLSCertFile != ""},
			{"TLSKeyFile", c.TLSKeyFile != ""},
			{"TLSServerName", c.TLSServerName != ""},
			{"TLSSkipVerify", c.TLSSkipVerify},
		} {
			if s.set {
				bad(s.v, "set without Config.TLS")
			}
		}
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		bad("TLSCertFile", "and Config.TLSKeyFile must be set together")
	}
}

// KafkaOptions returns the franz-go options for the configured SASL
// mechanism and TLS settings (none when neither is configured). The
// consumer applies them itself; pass them to outbox.RelayConfig.KafkaOptions
// and to any other client of the same brokers. It fails, naming the
// variable, when the settings are invalid or a certificate file cannot be
// read or parsed. Its errors never contain the password.
func (c Config) KafkaOptions() ([]kgo.Opt, error) {
	var problems []string
	c.validateSecurity(func(v, why string) { problems = append(problems, v+": "+why) })
	if len(problems) > 0 {
		return nil, fmt.Errorf("invalid Kafka security configuration: %s", strings.Join(problems, "; "))
	}
	var opts []kgo.Opt
	if m := c.saslMechanism(); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	if !c.TLS {
		return opts, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.TLSServerName}
	if c.TLSSkipVerify {
		tc.InsecureSkipVerify = true //nolint:gosec // explicitly asked for by Config.TLSSkipVerify
	}
	if c.TLSCAFile != "" {
		pem, err := os.ReadFile(c.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("Config.TLSCAFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("Config.TLSCAFile: %s holds no PEM certificate", c.TLSCAFile)
		}
		tc.RootCAs = pool
	}
	if c.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("Config.TLSCertFile, Config.TLSKeyFile: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return append(opts, kgo.DialTLSConfig(tc)), nil
}

// checkAccess asks a broker for metadata once and fails when the answer
// shows the configuration can never work: SASL authentication refused, or
// a TLS handshake that failed (an untrusted certificate, TLS against a
// plaintext listener). Unreachable brokers are not an error here: the client
// keeps retrying, as it does for an outage later on.
func (c *Consumer) checkAccess(ctx context.Context, cl *kgo.Client) error {
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var err error
	for range 3 {
		// Kafka answers a refused login with SASL_AUTHENTICATION_FAILED;
		// some brokers (kfake among them) just close the connection, which
		// is also how a restarting broker looks: ask three times.
		if err = cl.Ping(pctx); err == nil || pctx.Err() != nil || !closedEarly(err) {
			break
		}
	}
	if err == nil || ctx.Err() != nil {
		return nil
	}
	if c.cfg.SASLMechanism != "" && closedEarly(err) {
		err = fmt.Errorf("%w (the broker closed the connection during authentication: %w)", kerr.SaslAuthenticationFailed, err)
	}
	var certErr *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var recErr tls.RecordHeaderError
	var alert tls.AlertError
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.UnsupportedSaslMechanism),
		errors.Is(err, kerr.IllegalSaslState), errors.Is(err, kerr.ClusterAuthorizationFailed):
		return fmt.Errorf("kafka: SASL authentication as %q (Config.SASLMechanism=%s, Config.SASLUser) failed: %w",
			c.cfg.SASLUser, c.cfg.SASLMechanism, err)
	case errors.As(err, &certErr), errors.As(err, &unknownCA), errors.As(err, &hostErr):
		return fmt.Errorf("kafka: the broker's TLS certificate is not trusted (Config.TLSCAFile, Config.TLSServerName): %w", err)
	case errors.As(err, &recErr), errors.As(err, &alert):
		return fmt.Errorf("kafka: TLS handshake failed (Config.TLS=%t): %w", c.cfg.TLS, err)
	}
	c.log.Warn("kafka brokers not reachable yet; retrying", "brokers", c.cfg.Brokers, "error", err)
	return nil
}

// closedEarly reports whether err is the broker hanging up on the client.
func closedEarly(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

func (c Config) saslMechanism() sasl.Mechanism {
	switch strings.ToUpper(c.SASLMechanism) {
	case SASLPlain:
		return plain.Auth{User: c.SASLUser, Pass: c.SASLPassword}.AsMechanism()
	case SASLScramSHA256:
		return scram.Auth{User: c.SASLUser, Pass: c.SASLPassword}.AsSha256Mechanism()
	case SASLScramSHA512:
		return scram.Auth{User: c.SASLUser, Pass: c.SASLPassword}.AsSha512Mechanism()
	}
	return nil
}

// String lists the configuration as VARIABLE=value pairs with the secrets
// redacted (the SASL password, and the secrets of DATABASE_URL by the
// module's one redaction rule), so that fmt's %v and %+v never print them.
func (c Config) String() string {
	var b strings.Builder
	for i, kv := range c.redactedPairs() {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(kv[0] + "=" + kv[1])
	}
	return b.String()
}

// GoString is String, so that %#v does not print the secrets either.
func (c Config) GoString() string { return "consumer.Config{" + c.String() + "}" }

// LogValue makes slog log the configuration as a group of variables with
// the secrets redacted (see String).
func (c Config) LogValue() slog.Value {
	pairs := c.redactedPairs()
	attrs := make([]slog.Attr, len(pairs))
	for i, kv := range pairs {
		attrs[i] = slog.String(kv[0], kv[1])
	}
	return slog.GroupValue(attrs...)
}

func (c Config) redactedPairs() [][2]string {
	v := reflect.ValueOf(c)
	t := v.Type()
	var out [][2]string
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("env"), ",")
		if name == "" {
			continue
		}
		val := fmt.Sprint(v.Field(i).Interface())
		switch {
		case name == "DATABASE_URL":
			val = redact.URL(val)
		case strings.HasSuffix(name, "_PASSWORD") || strings.HasSuffix(name, "_SECRET"):
			if val != "" {
				val = redact.Redacted
			}
		}
		out = append(out, [2]string{name, val})
	}
	return out
}
