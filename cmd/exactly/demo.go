package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/exactly-go/exactly/cmd/exactly/internal/demo"
	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/consumer/otelexport"
)

// runDemo is `exactly demo`: the experiment of Making Background Jobs
// Idempotent on embedded defaults.
func runDemo(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stdout)
	commands := fs.Int("commands", 100, "distinct credit commands")
	copies := fs.Int("copies", 3, "deliveries of each command, to different partitions")
	verbose := fs.Bool("v", false, "log what the consumers do")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: exactly demo [flags]\n\nRuns the experiment of Making Background Jobs Idempotent: the same credit\ncommands, each delivered -copies times, through a naive consumer and a\nguarded one, and prints what each applied. Uses DATABASE_URL and\nEXACTLY_KAFKA_BROKERS when set, else a private PostgreSQL and an embedded\nbroker.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	cfg, err := consumer.ConfigFromEnv(ctx)
	if err != nil {
		return err
	}
	level := slog.LevelWarn + 4 // quiet unless -v
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	tel, err := otelexport.Setup(ctx, otelexport.Config{ServiceName: "exactly-demo", Prometheus: cfg.MetricsAddr != "", Logger: log})
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.WithoutCancel(ctx))
	if tel.MetricsHandler != nil {
		stop, err := serveMetrics(cfg.MetricsAddr, tel.MetricsHandler, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	start := time.Now()
	_, err = demo.Run(ctx, demo.Config{
		Commands: *commands, Copies: *copies,
		DatabaseURL: cfg.DatabaseURL, Brokers: cfg.Brokers, Logger: log,
		TracerProvider: tel.TracerProvider, MeterProvider: tel.MeterProvider,
	}, stdout)
	if err != nil {
		return err
	}
	if tel.TracesEndpoint != "" {
		fmt.Fprintf(stdout, "demo: traces sent to %s: in Jaeger (http://localhost:16686 with docker compose), service %q, search the tag exactly.outcome=duplicate\n",
			tel.TracesEndpoint, "exactly-demo")
	} else {
		fmt.Fprintln(stdout, "demo: traces off; set OTEL_EXPORTER_OTLP_ENDPOINT (e.g. http://localhost:4317 with `make up`) to see each duplicate skip in Jaeger")
	}
	fmt.Fprintf(stdout, "demo: finished in %s\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}

// serveMetrics serves h at http://addr/metrics until stop is called. It
// fails when addr cannot be listened on.
func serveMetrics(addr string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics endpoint EXACTLY_METRICS_ADDR=%q: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("metrics endpoint stopped", "error", err)
		}
	}()
	return func() { _ = srv.Close() }, nil
}
