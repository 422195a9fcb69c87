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
	if len(s) <= MaxValueBytes {
		return s
	}
	cut := MaxValueBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	sum := sha256.Sum256([]byte(s))
	return s[:cut] + "…(" + strconv.Itoa(len(s)) + " bytes, sha256:" + hex.EncodeToString(sum[:8]) + ")"
}
