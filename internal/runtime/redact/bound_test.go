package redact_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/exactly-go/exactly/internal/runtime/redact"
)

// Bound leaves a short value alone and cuts a long one at a rune boundary,
// naming it by length and SHA-256.
func TestBound(t *testing.T) {
	short := strings.Repeat("a", redact.MaxValueBytes)
	if got := redact.Bound(short); got != short {
		t.Errorf("Bound changed a %d-byte value", len(short))
	}
	long := strings.Repeat("é", 450_000) // 900,000 bytes, 2 per rune: a cut may fall inside one
	got := redact.Bound("x" + long)
	sum := sha256.Sum256([]byte("x" + long))
	want := "…(900001 bytes, sha256:" + hex.EncodeToString(sum[:8]) + ")"
	if !strings.HasSuffix(got, want) || !utf8.ValidString(got) || len(got) > redact.MaxValueBytes+len(want) {
		t.Errorf("Bound of 900,001 bytes = %q; want at most %d bytes of valid UTF-8 ending in %q", got, redact.MaxValueBytes, want)
	}
	if !strings.HasPrefix(got, "x"+strings.Repeat("é", (redact.MaxValueBytes-1)/2)) {
		t.Errorf("Bound did not keep the value's start: %q", got)
	}
}

// The slog handler bounds every text value after scrubbing the secrets, so
// a secret that straddles the cut is hidden too.
func TestHandlerBoundsAfterScrubbing(t *testing.T) {
	const secret = "s3cr3t-straddling"
	var buf bytes.Buffer
	log := slog.New(redact.Handler(slog.NewTextHandler(&buf, nil), secret))
	// The secret begins 4 bytes before the cut.
	v := strings.Repeat("k", redact.MaxValueBytes-4) + secret + strings.Repeat("k", 10_000)
	log.Info("m", "key", v)
	out := buf.String()
	if strings.Contains(out, secret[:4]+"…") || strings.Contains(out, secret) {
		t.Errorf("part of the secret shows at the cut: %.400s", out)
	}
	if len(out) > 1024 || !strings.Contains(out, "bytes, sha256:") {
		t.Errorf("log line not bounded (%d bytes): %.400s", len(out), out)
	}
	// Without secrets the handler bounds too.
	buf.Reset()
	slog.New(redact.Handler(slog.NewTextHandler(&buf, nil))).Info("m", "key", strings.Repeat("k", 900_000))
	if buf.Len() > 1024 {
		t.Errorf("a handler without secrets wrote a %d-byte line", buf.Len())
	}
}
