package dedupe

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxKeyLen is the longest key, in bytes, stored verbatim; longer keys are
// replaced by their SHA-256 (see NormalizeKey). It keeps guard rows far below
// PostgreSQL's btree entry limit (about 2700 bytes).
const MaxKeyLen = 256

// hashedPrefix starts every key NormalizeKey replaced by its hash.
const hashedPrefix = "sha256:"

// Key builds a key naming a business operation: kind, a colon, then the
// parts formatted with fmt.Sprint and joined by colons. Key("credit",
// "order-8812") is "credit:order-8812"; Key("fee", "account-7", "2026-10") is
// "fee:account-7:2026-10". With no parts it is kind followed by a colon.
// Parts must not be random or time-of-delivery values, or every delivery
// gets a new key. Key never fails.
func Key(kind string, parts ...any) string {
	var b strings.Builder
	n := len(kind) + 1
	for _, p := range parts {
		if s, ok := p.(string); ok {
			n += len(s) + 1
		} else {
			n += 21
		}
	}
	b.Grow(n)
	b.WriteString(kind)
	b.WriteByte(':')
	var num [24]byte
	for i, p := range parts {
		if i > 0 {
			b.WriteByte(':')
		}
		switch v := p.(type) {
		case string:
			b.WriteString(v)
		case int:
			b.Write(strconv.AppendInt(num[:0], int64(v), 10))
		case int64:
			b.Write(strconv.AppendInt(num[:0], v, 10))
		case int32:
			b.Write(strconv.AppendInt(num[:0], int64(v), 10))
		case uint64:
			b.Write(strconv.AppendUint(num[:0], v, 10))
		case uint:
			b.Write(strconv.AppendUint(num[:0], uint64(v), 10))
		default:
			// Not fmt.Fprint(&b, v): that would move b to the heap, one
			// more allocation for every key, of any parts.
			b.WriteString(fmt.Sprint(v))
		}
	}
	return b.String()
}

// NormalizeKey returns the form of key stored in the guard table. A key that
// is valid UTF-8, contains no NUL byte and is at most MaxKeyLen bytes long is
// returned unchanged (no allocation). Any other key (which PostgreSQL text
// would reject or which would bloat the index) is replaced by "sha256:"
// followed by the lowercase hex SHA-256 of its raw bytes: stable across
// processes and, up to SHA-256 collisions, distinct for distinct keys. The
// rule is idempotent: NormalizeKey(NormalizeKey(k)) == NormalizeKey(k). Do not
// start your own keys with "sha256:" followed by 64 hex digits, as such a key
// would be indistinguishable from a hashed one. NormalizeKey never fails; the
// empty key is returned unchanged and refused by the methods that take keys.
func NormalizeKey(key string) string {
	if len(key) <= MaxKeyLen && strings.IndexByte(key, 0) < 0 && utf8.ValidString(key) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	var buf [len(hashedPrefix) + 2*sha256.Size]byte
	copy(buf[:], hashedPrefix)
	hex.Encode(buf[len(hashedPrefix):], sum[:])
	return string(buf[:])
}
