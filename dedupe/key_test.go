package dedupe_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/dedupe"
)

type order struct {
	ID      string
	Account int
}

type orderID int

func (o orderID) String() string { return fmt.Sprintf("order-%d", int(o)) }

func TestKey(t *testing.T) {
	cases := []struct{ got, want string }{
		{dedupe.Key("credit", "order-8812"), "credit:order-8812"},
		{dedupe.Key("fee", "account-7", "2026-10"), "fee:account-7:2026-10"},
		{dedupe.Key("fee", "account", 7, int64(-3), uint(9)), "fee:account:7:-3:9"},
		{dedupe.Key("credit"), "credit:"},
		{dedupe.Key("credit", orderID(8812)), "credit:order-8812"},
		{dedupe.Key("x", 1.5, true), "x:1.5:true"},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("Key = %q, want %q", c.got, c.want)
		}
	}
}

// Two code paths that enqueue the same logical operation, one from a struct
// and one from separate fields, must build the same key.
func TestKeyTwoCodePathsAgree(t *testing.T) {
	o := order{ID: "order-8812", Account: 7}
	fromStruct := func(o order) string { return dedupe.Key("credit", o.ID) }
	fromFields := func(id int) string { return dedupe.Key("credit", orderID(id)) }
	if a, b := fromStruct(o), fromFields(8812); a != b {
		t.Fatalf("code paths disagree: %q vs %q", a, b)
	}
	if a, b := dedupe.Key("fee", "account", o.Account), dedupe.Key("fee", "account", "7"); a != b {
		t.Fatalf("int and string parts disagree: %q vs %q", a, b)
	}
}

func TestNormalizeKey(t *testing.T) {
	hash := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	long := strings.Repeat("k", dedupe.MaxKeyLen+1)
	maxLen := strings.Repeat("k", dedupe.MaxKeyLen)
	cases := []struct{ in, want string }{
		{"credit:order-8812", "credit:order-8812"},
		{"crédit:ünïcode", "crédit:ünïcode"},
		{maxLen, maxLen},
		{long, hash(long)},
		{"a\x00b", hash("a\x00b")},
		{"bad\xffutf8", hash("bad\xffutf8")},
	}
	for _, c := range cases {
		got := dedupe.NormalizeKey(c.in)
		if got != c.want {
			t.Errorf("NormalizeKey(%q) = %q, want %q", c.in, got, c.want)
		}
		if again := dedupe.NormalizeKey(got); again != got {
			t.Errorf("NormalizeKey not idempotent: %q -> %q", got, again)
		}
	}
	if dedupe.NormalizeKey("a\x00b") == dedupe.NormalizeKey("a\x00c") {
		t.Error("distinct invalid keys collide")
	}
}

func BenchmarkNormalizeKeyVerbatim(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = dedupe.NormalizeKey("credit:order-8812")
	}
}

func BenchmarkKey(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = dedupe.Key("credit", "order", 8812)
	}
}
