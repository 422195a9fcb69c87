// Package redact keeps secrets out of everything exactly prints: connection
// strings in both of libpq's forms (URL and key=value) with their password,
// sslpassword and sslkey hidden, driver errors that quote them, free text
// (a dead letter's error header), and log records (a slog.Handler that
// replaces the configured secrets wherever they appear, then bounds every
// text value with Bound). What it cannot
// parse it hides whole rather than risk showing a secret. The consumer, the
// relay, the executor's spans, the CLI and the status page all use it, so
// there is one rule. Bound is the one rule for the other risk of printing
// what users supply: a record's key, a topic, a header or a handler's
// error text is cut to MaxValueBytes plus its length and a short SHA-256
// in logs and span attributes, never printed whole.
package redact
