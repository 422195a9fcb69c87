package dedupe_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
)

// TestShortGenerationSpanWarns checks that a span keeping more than 16
// sealed generations (each one probed by every claim) is logged at start,
// and the default span is not.
func TestShortGenerationSpanWarns(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // never connects
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, tc := range []struct {
		span time.Duration
		warn bool
	}{{0, false}, {24 * time.Hour, false}, {time.Hour, true}} {
		var buf bytes.Buffer
		logger := slog.New(slog.NewTextHandler(&buf, nil))
		if _, err := dedupe.New().NewPruner(pool, dedupe.PrunerConfig{GenerationSpan: tc.span, Logger: logger}); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(buf.String(), "many sealed generations"); got != tc.warn {
			t.Errorf("span %v (retention %v): warned = %v, want %v; log: %q", tc.span, dedupe.DefaultRetention, got, tc.warn, buf.String())
		}
	}
}
