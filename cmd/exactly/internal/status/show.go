package status

import (
	"encoding/hex"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/exactly-go/exactly/internal/runtime/redact"
)

// ShowKey renders a key (or any user-supplied bytes) for a listing, so
// that no two keys look alike and no key can forge a line: printable text
// in double quotes (Go's escapes), anything else as hex:… without quotes,
// nil as (null) without quotes. A key longer than redact.MaxValueBytes
// (its hex form: twice that) is cut, and the part left out is described
// outside the quotes by its full length and the start of its SHA-256, as
// logs bound keys (redact.Bound): "abc…"(5000 bytes, sha256:…).
func ShowKey(b []byte) string {
	if b == nil {
		return "(null)"
	}
	if utf8.Valid(b) && strings.IndexFunc(string(b), unicode.IsControl) < 0 {
		return ShowText(string(b))
	}
	h := hex.EncodeToString(b)
	if len(h) <= 2*redact.MaxValueBytes {
		return "hex:" + h
	}
	return "hex:" + h[:2*redact.MaxValueBytes] + "…" + redact.SizeNote(b)
}

// ShowText renders text for a listing: double-quoted with Go's escapes
// (control characters cannot forge lines), cut past
// redact.MaxValueBytes with its full length and the start of its SHA-256
// after the closing quote.
func ShowText(s string) string { return showBounded(s, redact.MaxValueBytes) }

// ShowError renders an error's text for a listing as ShowText does, cut
// past four times redact.MaxValueBytes: errors (a database's, a
// handler's) run longer than keys and say more in full.
func ShowError(s string) string { return showBounded(s, 4*redact.MaxValueBytes) }

func showBounded(s string, limit int) string {
	head, note := redact.Cut(s, limit)
	if note == "" {
		return strconv.Quote(s)
	}
	return strconv.Quote(head+"…") + note
}
