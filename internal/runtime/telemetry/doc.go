// Package telemetry holds the pieces of instrumentation shared by the
// consumer, the relay and the batch executor: attribute and instrument
// names (names.go), every metric instrument exactly creates
// (instruments.go: a new metric is named and created there, and
// TestInstrumentsHaveOneHome fails on one created elsewhere) and the
// duplicate-rate detector. It uses only the OpenTelemetry
// API; exporter setup (OTLP, Prometheus) lives in the public package
// consumer/otelexport, so that importing the core links no exporter.
// Secrets are kept out of logs, spans and pages by internal/runtime/redact.
package telemetry
