package redact

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"unicode/utf8"
)

// MaxValueBytes is how many bytes of a user-supplied value (a record's key
// or deduplication key, a topic, a header, a handler's error text) Bound
// keeps for logs and span attributes.
const MaxValueBytes = 256

// Bound returns s when it is at most MaxValueBytes long. A longer s is cut
// to its first MaxValueBytes bytes (at a rune boundary) and followed by
// "…(<n> bytes, sha256:<16 hex digits>)": n is its full length and the
// digits begin the SHA-256 of the whole of s, so that a log line or span
// stays small and still names the value (the dead-letter record keeps it
// whole). It never fails.
func Bound(s string) string {
	head, note := Cut(s, MaxValueBytes)
	if note == "" {
		return s
	}
	return head + "…" + note
}

// Cut splits s for display at limit bytes: a longer s gives its first
// limit bytes (cut back to a rune boundary) and the note
// "(<n> bytes, sha256:<16 hex digits>)" naming the whole of s; an s of at
// most limit bytes gives s and an empty note. It never fails.
func Cut(s string, limit int) (head, note string) {
	if len(s) <= limit {
		return s, ""
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut], SizeNote([]byte(s))
}

// SizeNote is "(<n> bytes, sha256:<16 hex digits>)": b's length and the
// start of its SHA-256, the note Bound and Cut add to what they cut.
func SizeNote(b []byte) string {
	sum := sha256.Sum256(b)
	return "(" + strconv.Itoa(len(b)) + " bytes, sha256:" + hex.EncodeToString(sum[:8]) + ")"
}
