package dedupe_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/exactly-go/exactly/dedupe"
)

// FuzzNormalizeKey checks NormalizeKey's documented rule on arbitrary
// bytes: the result is valid UTF-8 without NUL and at most MaxKeyLen bytes;
// a key that already is so is kept verbatim; any other becomes
// "sha256:" + hex(SHA-256(key)); the rule is idempotent; two distinct keys
// never share a normalized form unless one is the hash form of the other.
// The seed corpus is in testdata/fuzz/FuzzNormalizeKey.
func FuzzNormalizeKey(f *testing.F) {
	f.Add("credit:order-1", "credit:order-2")
	f.Fuzz(func(t *testing.T, a, b string) {
		na, nb := dedupe.NormalizeKey(a), dedupe.NormalizeKey(b)
		for _, c := range [][2]string{{a, na}, {b, nb}} {
			k, n := c[0], c[1]
			if !utf8.ValidString(n) || strings.IndexByte(n, 0) >= 0 || len(n) > dedupe.MaxKeyLen {
				t.Fatalf("NormalizeKey(%q) = %q is not storable", k, n)
			}
			if dedupe.NormalizeKey(n) != n {
				t.Fatalf("not idempotent on %q", k)
			}
			storable := utf8.ValidString(k) && strings.IndexByte(k, 0) < 0 && len(k) <= dedupe.MaxKeyLen
			sum := sha256.Sum256([]byte(k))
			if storable && n != k {
				t.Fatalf("NormalizeKey(%q) = %q, want it verbatim", k, n)
			}
			if !storable && n != "sha256:"+hex.EncodeToString(sum[:]) {
				t.Fatalf("NormalizeKey(%q) = %q, want its sha256 form", k, n)
			}
		}
		if a != b && na == nb && na != a && na != b {
			t.Fatalf("distinct keys %q and %q normalize alike to %q", a, b, na)
		}
	})
}
