package otelexport_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/exactly-go/exactly/consumer/otelexport"
)

func clearOTLP(t *testing.T) {
	for _, v := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"} {
		t.Setenv(v, "")
	}
}

func TestSetupWithNothingConfiguredExportsNothing(t *testing.T) {
	clearOTLP(t)
	tel, err := otelexport.Setup(context.Background(), otelexport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if tel.Enabled() || tel.MetricsHandler != nil {
		t.Errorf("something is exported: %s", tel.Describe())
	}
	_, span := tel.TracerProvider.Tracer("x").Start(context.Background(), "s")
	if span.IsRecording() {
		t.Error("the default tracer provider records spans")
	}
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A counter recorded through the meter provider is served by the
// Prometheus handler, dots turned into underscores.
func TestPrometheusHandlerServesRecordedMetrics(t *testing.T) {
	clearOTLP(t)
	tel, err := otelexport.Setup(context.Background(), otelexport.Config{ServiceName: "svc", Prometheus: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	if tel.MetricsHandler == nil {
		t.Fatal("Prometheus: true built no handler")
	}
	c, err := tel.MeterProvider.Meter("test").Int64Counter("exactly.test_records")
	if err != nil {
		t.Fatal(err)
	}
	c.Add(context.Background(), 3)
	srv := httptest.NewServer(tel.MetricsHandler)
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), "exactly_test_records_total") || !strings.Contains(string(body), " 3") {
		t.Errorf("scrape lacks the counter:\n%s", body)
	}
}

// Only OTLP over gRPC is linked; another protocol is refused by name.
func TestSetupRefusesOtherProtocols(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	_, err := otelexport.Setup(context.Background(), otelexport.Config{})
	if err == nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_PROTOCOL") {
		t.Fatalf("err = %v, want one naming OTEL_EXPORTER_OTLP_PROTOCOL", err)
	}
}

// msgs is a slog handler sending each record's message on a channel
// (dropping it when the channel is full).
type msgs chan string

func (m msgs) Enabled(context.Context, slog.Level) bool { return true }
func (m msgs) Handle(_ context.Context, r slog.Record) error {
	select {
	case m <- r.Message:
	default:
	}
	return nil
}
func (m msgs) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m msgs) WithGroup(string) slog.Handler      { return m }

// A failed OTLP export (nothing listens at the endpoint) is logged through
// the configured slog logger, not the standard library's log package.
func TestOTLPExportErrorsGoThroughSlog(t *testing.T) {
	clearOTLP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:1") // refused
	t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "300")                        // ms, retries included
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")                            // ms
	logs := make(msgs, 16)
	tel, err := otelexport.Setup(context.Background(), otelexport.Config{Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	_, span := tel.TracerProvider.Tracer("x").Start(context.Background(), "s")
	span.End()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case m := <-logs:
			if strings.HasPrefix(m, "OpenTelemetry error") {
				return
			}
		case <-timeout:
			t.Fatal("no failed export logged through slog within 30s")
		}
	}
}

// With Prometheus only (no OTLP), a gauge whose callback fails during a
// scrape (as the outbox's gauges do while the database is down) is logged
// through the configured slog logger with its error, not by the
// standard library's log package.
func TestCollectionErrorsGoThroughSlog(t *testing.T) {
	clearOTLP(t)
	logs := make(msgs, 64)
	tel, err := otelexport.Setup(context.Background(), otelexport.Config{Prometheus: true, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	m := tel.MeterProvider.Meter("test")
	g, err := m.Int64ObservableGauge("test.gauge")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.RegisterCallback(func(context.Context, metric.Observer) error {
		return errors.New("reading the outbox: database down")
	}, g); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	tel.MetricsHandler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for {
		select {
		case msg := <-logs:
			if strings.HasPrefix(msg, "OpenTelemetry error") {
				return
			}
		default:
			t.Fatal("the failed collection was not logged through slog")
		}
	}
}
