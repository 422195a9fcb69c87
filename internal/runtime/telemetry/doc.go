// Package telemetry holds the pieces of instrumentation shared by the
// consumer, the relay and the batch executor: attribute and instrument
// names, the duplicate-rate detector, and the redaction of secrets from
// configuration values. It uses only the OpenTelemetry API; exporter setup
// (OTLP, Prometheus) lives in the public package consumer/otelexport, so
// that importing the core links no exporter.
package telemetry
