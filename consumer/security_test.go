package consumer_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sethvargo/go-envconfig"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/internal/testenv/broker"
)

// secureKafka starts a kfake broker with extra options (SASL, TLS) and the
// topic "credits" (3 partitions); it is closed when t ends.
func secureKafka(t *testing.T, extra ...kfake.Opt) []string {
	t.Helper()
	b, err := broker.Start(context.Background(), broker.Options{Partitions: 3, Topics: []string{"credits"}, Extra: extra})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b.Addrs()
}

// envConfig reads a consumer configuration from env (plus the test's
// brokers, group and topic), as a service configured by its environment.
func envConfig(t *testing.T, brokers []string, group string, env map[string]string) consumer.Config {
	t.Helper()
	env["EXACTLY_KAFKA_BROKERS"] = strings.Join(brokers, ",")
	env["EXACTLY_GROUP"] = group
	env["EXACTLY_TOPICS"] = "credits"
	env["EXACTLY_COMMIT_INTERVAL"] = "100ms"
	env["EXACTLY_SESSION_TIMEOUT"] = "6s"
	env["EXACTLY_RETRY_BACKOFF"] = "20ms"
	cfg, err := consumer.ConfigFromLookuper(context.Background(), envconfig.MapLookuper(env))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// secureEndToEnd produces n credits through a client built from
// cfg.KafkaOptions and checks that a consumer configured by cfg applies
// each once.
func secureEndToEnd(t *testing.T, cfg consumer.Config) {
	t.Helper()
	pool := testenv.DB(t)
	setupLedger(t, pool)
	kopts, err := cfg.KafkaOptions()
	if err != nil {
		t.Fatal(err)
	}
	const n = 30
	var recs []*kgo.Record
	for i := 0; i < n; i++ {
		recs = append(recs, &kgo.Record{Topic: "credits", Value: []byte(fmt.Sprintf(`{"order_id":"order-%d","account":1,"amount":5}`, i))})
	}
	cl, err := kgo.NewClient(append(kopts, kgo.SeedBrokers(cfg.Brokers...))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("producing with the configuration's security options: %v", err)
	}
	cl.Close()
	o := newOutcomes()
	startConsumer(t, cfg, pool, consumer.Handle(creditHandler(0)), consumer.WithHooks(o.hooks()))
	o.await(t, 60*time.Second, "every credit applied", func() bool { return o.get("applied") == n })
	if got := count(t, pool, `select count(*) from ledger`); got != n {
		t.Errorf("ledger rows = %d, want %d", got, n)
	}
}

// The broker requires SASL/SCRAM-SHA-256; the consumer, configured from
// the environment, authenticates, consumes and applies.
func TestSASLSCRAMFromEnvironment(t *testing.T) {
	brokers := secureKafka(t, kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-256", "admin", "admin-pw"),
		kfake.User("SCRAM-SHA-256", "svc", "s3cret-pw"))
	cfg := envConfig(t, brokers, "sasl", map[string]string{
		"EXACTLY_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
		"EXACTLY_KAFKA_SASL_USER":      "admin",
		"EXACTLY_KAFKA_SASL_PASSWORD":  "admin-pw",
	})
	secureEndToEnd(t, cfg)
}

// A wrong password makes Run fail at start-up with an authentication
// error that does not contain the password.
func TestSASLWrongPasswordFailsClearly(t *testing.T) {
	brokers := secureKafka(t, kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "admin", "admin-pw"))
	const wrong = "not-the-pw-42"
	cfg := envConfig(t, brokers, "sasl-wrong", map[string]string{
		"EXACTLY_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
		"EXACTLY_KAFKA_SASL_USER":      "admin",
		"EXACTLY_KAFKA_SASL_PASSWORD":  wrong,
	})
	pool := testenv.DB(t)
	setupLedger(t, pool)
	var logs bytes.Buffer
	c, err := consumer.New(cfg, pool, consumer.Handle(creditHandler(0)),
		consumer.WithLogger(slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = c.Run(ctx)
	if err == nil {
		t.Fatal("Run with a wrong SASL password returned nil")
	}
	if ctx.Err() != nil {
		t.Fatalf("Run did not fail at start-up: %v", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "SASL") || !strings.Contains(strings.ToLower(msg), "authenticat") {
		t.Errorf("error %q does not say that SASL authentication failed", msg)
	}
	if strings.Contains(msg, wrong) || strings.Contains(logs.String(), wrong) {
		t.Errorf("the password appears in the error or the logs: %q\n%s", msg, logs.String())
	}
}

// The broker listens with TLS (a certificate made here, signed by a CA made
// here); the consumer trusts the CA from EXACTLY_KAFKA_TLS_CA_FILE and also
// authenticates with SCRAM-SHA-512 over the encrypted connection.
func TestTLSWithCAFileFromEnvironment(t *testing.T) {
	caFile, serverCfg := testCA(t)
	brokers := secureKafka(t, kfake.TLS(serverCfg), kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-512", "admin", "tls-pw"))
	cfg := envConfig(t, brokers, "tls", map[string]string{
		"EXACTLY_KAFKA_TLS":            "true",
		"EXACTLY_KAFKA_TLS_CA_FILE":    caFile,
		"EXACTLY_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
		"EXACTLY_KAFKA_SASL_USER":      "admin",
		"EXACTLY_KAFKA_SASL_PASSWORD":  "tls-pw",
	})
	secureEndToEnd(t, cfg)
}

// Without the CA, the broker's certificate is not trusted: Run fails at
// start-up saying so.
func TestTLSUntrustedBrokerFailsClearly(t *testing.T) {
	_, serverCfg := testCA(t)
	brokers := secureKafka(t, kfake.TLS(serverCfg))
	cfg := envConfig(t, brokers, "tls-untrusted", map[string]string{"EXACTLY_KAFKA_TLS": "true"})
	pool := testenv.DB(t)
	setupLedger(t, pool) // Run checks the guard table before it connects to Kafka
	c, err := consumer.New(cfg, pool, consumer.Handle(creditHandler(0)),
		consumer.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = c.Run(ctx)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("Run = %v, want a start-up failure", err)
	}
	if !strings.Contains(err.Error(), "certificate") {
		t.Errorf("error %q does not mention the certificate", err)
	}
}

// Bad security settings fail at start-up naming the variable, and the
// password is never printed.
func TestSecurityConfigErrorsNameTheVariable(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for want, env := range map[string]map[string]string{
		"EXACTLY_KAFKA_SASL_MECHANISM":  {"EXACTLY_KAFKA_SASL_MECHANISM": "GSSAPI", "EXACTLY_KAFKA_SASL_USER": "u", "EXACTLY_KAFKA_SASL_PASSWORD": "p"},
		"EXACTLY_KAFKA_SASL_PASSWORD":   {"EXACTLY_KAFKA_SASL_MECHANISM": "PLAIN", "EXACTLY_KAFKA_SASL_USER": "u"},
		"EXACTLY_KAFKA_SASL_USER":       {"EXACTLY_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "EXACTLY_KAFKA_SASL_PASSWORD": "p"},
		"EXACTLY_KAFKA_TLS":             {"EXACTLY_KAFKA_TLS": "maybe"},
		"EXACTLY_KAFKA_TLS_CA_FILE":     {"EXACTLY_KAFKA_TLS_CA_FILE": notPEM},
		"EXACTLY_KAFKA_TLS_SKIP_VERIFY": {"EXACTLY_KAFKA_TLS_SKIP_VERIFY": "true"},
		"EXACTLY_KAFKA_TLS_KEY_FILE":    {"EXACTLY_KAFKA_TLS": "true", "EXACTLY_KAFKA_TLS_CERT_FILE": notPEM},
	} {
		_, err := consumer.ConfigFromLookuper(context.Background(), envconfig.MapLookuper(env))
		if err == nil {
			t.Errorf("%v: no error", env)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v: error %q does not name %s", env, err, want)
		}
	}
	// A CA file that holds no certificate, or is missing, fails when the
	// configuration is read, naming the variable, and in KafkaOptions (so
	// in consumer.New) for a Config built in code, naming the field.
	for _, ca := range []string{notPEM, filepath.Join(dir, "missing.pem")} {
		_, err := consumer.ConfigFromLookuper(context.Background(), envconfig.MapLookuper(map[string]string{
			"EXACTLY_KAFKA_TLS": "true", "EXACTLY_KAFKA_TLS_CA_FILE": ca,
		}))
		if err == nil || !strings.Contains(err.Error(), "EXACTLY_KAFKA_TLS_CA_FILE") || strings.Contains(err.Error(), "Config.") {
			t.Errorf("ConfigFromLookuper with CA file %s: %v, want an error naming EXACTLY_KAFKA_TLS_CA_FILE", ca, err)
		}
		cfg := consumer.Config{TLS: true, TLSCAFile: ca}
		if _, err := cfg.KafkaOptions(); err == nil || !strings.Contains(err.Error(), "Config.TLSCAFile") {
			t.Errorf("KafkaOptions with CA file %s: %v, want an error naming Config.TLSCAFile", ca, err)
		}
	}
}

func TestConfigRedactsSecrets(t *testing.T) {
	const pw, dbpw, keypw = "hunter2-sasl", "hunter3-db", "hunter4-key"
	cfg, err := consumer.ConfigFromLookuper(context.Background(), envconfig.MapLookuper(map[string]string{
		"EXACTLY_KAFKA_SASL_MECHANISM": "PLAIN",
		"EXACTLY_KAFKA_SASL_USER":      "svc",
		"EXACTLY_KAFKA_SASL_PASSWORD":  pw,
		"DATABASE_URL":                 "postgres://app:" + dbpw + "@db:5432/app?sslmode=disable",
	}))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("starting", "config", cfg)
	for _, s := range []string{cfg.String(), fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), fmt.Sprintf("%v", &cfg), logs.String()} {
		if strings.Contains(s, pw) || strings.Contains(s, dbpw) {
			t.Errorf("a secret is printed: %s", s)
		}
		if !strings.Contains(s, "EXACTLY_KAFKA_SASL_USER") || !strings.Contains(s, "svc") {
			t.Errorf("the configuration is not printed: %s", s)
		}
	}
	// Every secret of DATABASE_URL, in both forms, by the module's one
	// redaction rule; the rest of the URL is still shown.
	for _, url := range []string{
		"postgres://app@db/app?sslmode=require&password=" + dbpw + "&sslpassword=" + keypw,
		"host=db user=app password = '" + dbpw + " tail9' sslpassword=" + keypw + " dbname=app",
		"host=db user=app password=" + dbpw + "\\ tail9 sslpassword=" + keypw + " dbname=app",
	} {
		cfg := consumer.Config{DatabaseURL: url}
		var logs bytes.Buffer
		slog.New(slog.NewJSONHandler(&logs, nil)).Info("starting", "config", cfg)
		for _, s := range []string{cfg.String(), fmt.Sprintf("%#v", cfg), logs.String()} {
			if strings.Contains(s, dbpw) || strings.Contains(s, keypw) || strings.Contains(s, "tail9") {
				t.Errorf("DATABASE_URL %q: a secret is printed: %s", url, s)
			}
			if !strings.Contains(s, "app") || !strings.Contains(s, "db") {
				t.Errorf("DATABASE_URL %q: the URL is not shown: %s", url, s)
			}
		}
		for _, sec := range []string{dbpw, keypw} {
			if !slices.Contains(cfg.Secrets(), sec) && !slices.Contains(cfg.Secrets(), sec+" tail9") {
				t.Errorf("DATABASE_URL %q: Secrets() = %q, missing %q", url, cfg.Secrets(), sec)
			}
		}
	}
	// NewPool's errors name the URL without its secrets, even where the
	// driver's own message would quote them.
	for _, url := range []string{
		"host=db password = '" + dbpw + " tail9' sslpassword=" + keypw + " port=notaport",
		"postgres://app:" + dbpw + "@db:notaport/app?sslpassword=" + keypw,
		"postgres://app@db/app?sslpassword=" + keypw + "&pool_max_conns=lots",
	} {
		_, err := consumer.NewPool(context.Background(), url, 1)
		if err == nil {
			t.Errorf("NewPool(%q): no error", url)
		} else if strings.Contains(err.Error(), dbpw) || strings.Contains(err.Error(), keypw) {
			t.Errorf("NewPool: the error shows a secret: %v", err)
		}
	}
}

// testCA makes a CA and a broker certificate for 127.0.0.1 signed by it. It
// returns the CA's PEM file and the broker's TLS configuration.
func testCA(t *testing.T) (caFile string, server *tls.Config) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "exactly test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kfake"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return caFile, &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
}

// syncWriter serializes writes to w (the consumer logs from several
// goroutines).
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
