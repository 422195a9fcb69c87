// Package devenv supplies the embedded defaults of the examples and of
// `exactly demo`: when DATABASE_URL is unset, a private PostgreSQL started
// from the machine's binaries; when EXACTLY_KAFKA_BROKERS is unset, a kfake
// broker in process. What is configured is used as it is.
package devenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/exactly-go/exactly/internal/testenv/broker"
	"github.com/exactly-go/exactly/internal/testenv/pgserver"
)

// Env is what a service connects to, and how to stop what was started for
// it.
type Env struct {
	// DatabaseURL is the configured URL, or the private cluster's.
	DatabaseURL string
	// Brokers are the configured brokers, or the embedded broker's address.
	Brokers []string
	// EmbeddedDB and EmbeddedBroker tell what was started here.
	EmbeddedDB, EmbeddedBroker bool
	// Broker is the embedded broker (nil when brokers were configured).
	Broker *broker.Broker
	// Postgres is the private cluster (nil when DATABASE_URL was set).
	Postgres *pgserver.Server

	stops []func() error
}

// Options says what is configured and how to start what is not.
type Options struct {
	DatabaseURL string
	Brokers     []string
	// Partitions is the partition count of topics the embedded broker
	// creates; Topics are created at start.
	Partitions int32
	Topics     []string
	// PostgresSettings are extra postgresql.conf settings of the private
	// cluster.
	PostgresSettings map[string]string
	// PostgresDir keeps the private cluster in this directory (reused
	// when it holds one already, never removed); "" means a temporary
	// directory removed by Close.
	PostgresDir string
	// PostgresPort is the private cluster's port on 127.0.0.1; 0 picks a
	// free one.
	PostgresPort int
	// BrokerPort is the embedded broker's port on 127.0.0.1; 0 picks a
	// free one.
	BrokerPort int
	// NoPostgres starts no PostgreSQL even when DatabaseURL is empty
	// (Env.DatabaseURL then stays empty).
	NoPostgres bool
	// BrokerDataDir persists the embedded broker's state; "" keeps it in
	// memory.
	BrokerDataDir string
	Logger        *slog.Logger
}

// Start starts what opts leaves unconfigured. It fails when the private
// PostgreSQL cannot be started (binaries missing and not installable) or the
// broker cannot listen; whatever it started before the failure is stopped.
func Start(ctx context.Context, opts Options) (*Env, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	env := &Env{DatabaseURL: opts.DatabaseURL, Brokers: opts.Brokers}
	if env.DatabaseURL == "" && !opts.NoPostgres {
		srv, err := pgserver.Start(ctx, pgserver.Options{Logger: log, Settings: opts.PostgresSettings,
			Dir: opts.PostgresDir, Port: opts.PostgresPort})
		if err != nil {
			return nil, fmt.Errorf("DATABASE_URL is unset, so starting a private PostgreSQL: %w", err)
		}
		env.Postgres = srv
		env.EmbeddedDB = true
		env.DatabaseURL = srv.URL("postgres")
		env.stops = append(env.stops, srv.Stop)
		log.Info("started a private PostgreSQL", "port", srv.Port(), "dir", srv.Dir())
	}
	if len(env.Brokers) == 0 {
		b, err := broker.Start(ctx, broker.Options{Partitions: opts.Partitions, Topics: opts.Topics,
			Port: opts.BrokerPort, DataDir: opts.BrokerDataDir, Logger: opts.Logger})
		if err != nil {
			_ = env.Close()
			return nil, fmt.Errorf("EXACTLY_KAFKA_BROKERS is unset, so starting an embedded broker: %w", err)
		}
		env.Broker = b
		env.EmbeddedBroker = true
		env.Brokers = b.Addrs()
		env.stops = append(env.stops, func() error { b.Close(); return nil })
		log.Info("started an embedded kfake broker", "addrs", env.Brokers)
	}
	return env, nil
}

// Close stops what Start started, the broker first. It returns the errors
// of stopping, joined.
func (e *Env) Close() error {
	var errs []error
	for i := len(e.stops) - 1; i >= 0; i-- {
		errs = append(errs, e.stops[i]())
	}
	e.stops = nil
	return errors.Join(errs...)
}
