package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/exactly-go/exactly/dedupe"
)

// runPrune prunes the guard once (seals its current generation when due,
// drops expired generations, deletes expired rows in batches: see
// dedupe.Pruner) and prints how many rows it removed, or that it skipped because another pruner holds the table's
// prune lock. It fails on bad flags, an unset DATABASE_URL, a retention
// shorter than the redelivery horizon (unless -allow-short-retention), or a
// database error.
func runPrune(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("prune", flag.ContinueOnError)
	fs.SetOutput(stdout)
	guard := guardFlags(fs)
	retention := fs.Duration("retention", dedupe.DefaultRetention, "delete guard rows older than this")
	horizon := fs.Duration("horizon", dedupe.DefaultRedeliveryHorizon, "redelivery horizon: the longest retry plus dead-letter replay window; retention must not be shorter")
	allowShort := fs.Bool("allow-short-retention", false, "accept a retention shorter than the horizon (late replays would apply again)")
	batch := fs.Int("batch", dedupe.DefaultPruneBatchSize, "rows deleted per statement")
	span := fs.Duration("generation-span", 0, "how long the guard's current generation takes claims before it is sealed (0: half the retention)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: exactly prune [flags]\n\nDeletes expired rows from the guard table on DATABASE_URL, once.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return fmt.Errorf("parsing flags: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *retention <= 0 || *horizon <= 0 || *batch <= 0 || *span < 0 {
		return fmt.Errorf("-retention, -horizon and -batch must be positive, -generation-span not negative")
	}
	pool, err := poolFromDatabaseURL(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	g := guard()
	p, err := g.NewPruner(pool, dedupe.PrunerConfig{
		Retention:           *retention,
		RedeliveryHorizon:   *horizon,
		AllowShortRetention: *allowShort,
		BatchSize:           *batch,
		GenerationSpan:      *span,
	})
	var short *dedupe.RetentionError
	if errors.As(err, &short) {
		return fmt.Errorf("%w; the flag is -allow-short-retention", err)
	}
	if err != nil {
		return err
	}
	deleted, ran, err := p.PruneOnce(ctx)
	if err != nil {
		return fmt.Errorf("pruning %s (%d rows deleted before the error): %w", g.Table().Sanitize(), deleted, err)
	}
	if !ran {
		fmt.Fprintf(stdout, "guard table %s: skipped, another pruner is running\n", g.Table().Sanitize())
		return nil
	}
	fmt.Fprintf(stdout, "guard table %s: deleted %d rows older than %v\n", g.Table().Sanitize(), deleted, *retention)
	return nil
}
