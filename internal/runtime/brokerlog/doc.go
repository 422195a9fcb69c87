// Package brokerlog logs a Kafka client's failed broker connections, which
// franz-go retries on its own without a word. The consumer's client and
// the outbox relays' producers each carry a Log.
package brokerlog
