// Package broker runs an embedded Kafka broker in process: franz-go's kfake,
// which speaks the real Kafka protocol. It backs `make demo`, `exactly dev`,
// the chaos harness and the project's tests; it is not for production.
//
// Persistence is optional (Options.DataDir): without it the broker's log
// lives in memory and disappears on Close.
package broker
