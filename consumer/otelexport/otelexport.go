// Package otelexport sets up OpenTelemetry export for a service that embeds
// exactly: traces and metrics over OTLP/gRPC, configured by the standard
// OTEL_* environment variables, and a Prometheus scrape handler. It is a
// plugin in the way franz-go's kotel and kprom are: the core packages
// (consumer, handler, dedupe, outbox) use only the OpenTelemetry API, and
// only a program that imports this package links gRPC, the OTLP exporters
// and the Prometheus client.
//
// Setup never installs global providers: pass the providers it returns to
// consumer.WithTracerProvider and consumer.WithMeterProvider, and the
// Prometheus handler to consumer.WithMetricsHandler.
package otelexport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	promclient "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// Config says what to export besides what the OTEL_* variables configure.
type Config struct {
	// ServiceName is the service.name resource attribute when
	// OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) does
	// not set one.
	ServiceName string
	// Prometheus builds a Prometheus scrape handler
	// ([Exporter.MetricsHandler]) fed by the meter provider. Serve it
	// yourself or pass it to consumer.WithMetricsHandler, which serves it
	// at http://Config.MetricsAddr/metrics.
	Prometheus bool
	// Logger receives the Prometheus handler's errors; nil means
	// slog.Default().
	Logger *slog.Logger
}

// Exporter is what [Setup] built: the providers to hand to the consumer,
// the relay and the producers, the Prometheus handler, and how to shut them
// down.
type Exporter struct {
	// TracerProvider is an SDK provider exporting over OTLP when traces
	// are configured, else a no-op provider.
	TracerProvider trace.TracerProvider
	// MeterProvider is an SDK provider when OTLP metrics or Prometheus
	// are configured, else a no-op provider.
	MeterProvider metric.MeterProvider
	// MetricsHandler serves the metrics in the Prometheus text format when
	// Config.Prometheus was set; nil otherwise.
	MetricsHandler http.Handler
	// TracesEndpoint and MetricsEndpoint are the OTLP endpoints in use
	// ("" if none).
	TracesEndpoint, MetricsEndpoint string

	shutdown []func(context.Context) error
}

// Enabled reports whether anything is exported.
func (t *Exporter) Enabled() bool {
	return t.TracesEndpoint != "" || t.MetricsEndpoint != "" || t.MetricsHandler != nil
}

// Describe says where to look, for a start-up log line.
func (t *Exporter) Describe() string {
	var parts []string
	if t.TracesEndpoint != "" {
		parts = append(parts, "traces via OTLP/gRPC to "+t.TracesEndpoint)
	}
	if t.MetricsEndpoint != "" {
		parts = append(parts, "metrics via OTLP/gRPC to "+t.MetricsEndpoint)
	}
	if t.MetricsHandler != nil {
		parts = append(parts, "Prometheus metrics handler")
	}
	if len(parts) == 0 {
		return "telemetry export off (set OTEL_EXPORTER_OTLP_ENDPOINT)"
	}
	return strings.Join(parts, "; ")
}

// Shutdown flushes and stops the exporters. It returns every error met,
// joined. Call it after the consumer and relay have stopped, so their last
// spans and metrics are exported.
func (t *Exporter) Shutdown(ctx context.Context) error {
	var errs []error
	for i := len(t.shutdown) - 1; i >= 0; i-- {
		if err := t.shutdown[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	t.shutdown = nil
	return errors.Join(errs...)
}

// env returns the value of the first of names that is set and not empty.
func env(names ...string) string {
	for _, n := range names {
		if v := strings.TrimSpace(os.Getenv(n)); v != "" {
			return v
		}
	}
	return ""
}

// Setup builds the providers from cfg and the standard OpenTelemetry
// environment variables:
//
//   - traces go over OTLP/gRPC when OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, unless OTEL_TRACES_EXPORTER
//     is "none"; the exporter reads the other OTEL_EXPORTER_OTLP_* variables
//     (headers, timeout, TLS; an http:// endpoint means plaintext), the
//     batch processor OTEL_BSP_*, the sampler OTEL_TRACES_SAMPLER;
//   - metrics go over OTLP/gRPC when OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set, unless
//     OTEL_METRICS_EXPORTER is "none", every OTEL_METRIC_EXPORT_INTERVAL;
//   - metrics are readable through MetricsHandler when cfg.Prometheus is set;
//   - the resource takes OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
//
// It fails when OTEL_EXPORTER_OTLP_PROTOCOL (or its per-signal variants)
// names anything but grpc, or when an exporter cannot be built from the
// variables. With nothing configured, Setup returns no-op providers and
// exports nothing. It never sets OpenTelemetry's global providers. Call
// Shutdown when done.
//
// When it builds any exporter, Setup sets OpenTelemetry's global error
// handler (otel.SetErrorHandler) to one that logs through cfg.Logger at
// Warn, and OpenTelemetry's internal logger (otel.SetLogger) to
// cfg.Logger: the SDK reports failed exports (collector down, refused,
// timed out) and failed metric collections (a gauge whose database read
// failed during a scrape) only there, and its default handler writes them
// to the standard library's log package, unstructured. The handler is
// process-wide, as OpenTelemetry's API makes it: the last Setup that built
// an exporter decides which logger receives the errors. Setup is called
// from a service's or the CLI's setup, never from an init function.
func Setup(ctx context.Context, cfg Config) (*Exporter, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	t := &Exporter{TracerProvider: tracenoop.NewTracerProvider(), MeterProvider: metricnoop.NewMeterProvider()}
	tracesOn := env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT") != "" &&
		!strings.EqualFold(env("OTEL_TRACES_EXPORTER"), "none")
	metricsOn := env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT") != "" &&
		!strings.EqualFold(env("OTEL_METRICS_EXPORTER"), "none")
	if !tracesOn && !metricsOn && !cfg.Prometheus {
		return t, nil
	}
	for _, v := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"} {
		if p := env(v); p != "" && p != "grpc" {
			return nil, fmt.Errorf("otelexport: %s=%q: only grpc is supported", v, p)
		}
	}

	// Every error the SDK reports (failed exports, a gauge's callback that
	// failed during a scrape, the Prometheus exporter's collection) goes
	// to cfg.Logger, structured, instead of the standard library's log.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("OpenTelemetry error (an export or a metric collection failed; the next one is tried)", "error", err)
	}))
	otel.SetLogger(logr.FromSlogHandler(log.Handler()))

	res, err := newResource(ctx, cfg.ServiceName)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Exporter, error) {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = t.Shutdown(sctx)
		return nil, err
	}

	if tracesOn {
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return fail(fmt.Errorf("otelexport: OTLP trace exporter: %w", err))
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		t.TracerProvider = tp
		t.TracesEndpoint = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
		t.shutdown = append(t.shutdown, tp.Shutdown)
	}

	var readers []sdkmetric.Option
	if metricsOn {
		exp, err := otlpmetricgrpc.New(ctx)
		if err != nil {
			return fail(fmt.Errorf("otelexport: OTLP metric exporter: %w", err))
		}
		readers = append(readers, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
		t.MetricsEndpoint = env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	if cfg.Prometheus {
		reg := promclient.NewRegistry()
		exp, err := promexporter.New(promexporter.WithRegisterer(reg))
		if err != nil {
			return fail(fmt.Errorf("otelexport: Prometheus exporter: %w", err))
		}
		readers = append(readers, sdkmetric.WithReader(exp))
		t.MetricsHandler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)})
	}
	if len(readers) > 0 {
		mp := sdkmetric.NewMeterProvider(append(readers, sdkmetric.WithResource(res))...)
		t.MeterProvider = mp
		t.shutdown = append(t.shutdown, mp.Shutdown)
	}
	return t, nil
}

// newResource describes the service: service.name from serviceName, then
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, which win.
func newResource(ctx context.Context, serviceName string) (*resource.Resource, error) {
	if serviceName == "" {
		serviceName = "exactly"
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", serviceName)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil {
		return nil, fmt.Errorf("otelexport: resource: %w", err)
	}
	return res, nil
}
