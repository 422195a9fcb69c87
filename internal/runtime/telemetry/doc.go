// Package telemetry sets up OpenTelemetry export for exactly's services and
// holds the pieces of instrumentation shared by the consumer and the batch
// executor: attribute and instrument names, the duplicate-rate detector, and
// the redaction of secrets from configuration values.
//
// [Setup] reads the standard OTEL_* variables (OTLP over gRPC for traces and
// metrics) and EXACTLY_METRICS_ADDR (a Prometheus scrape endpoint). With
// none of them set it exports nothing and returns no-op providers. It never
// installs global providers: callers pass the providers it returns to
// consumer.WithTracerProvider and consumer.WithMeterProvider.
package telemetry
