package handler_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/handler"
)

type fuzzCredit struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

func noop[T any](context.Context, pgx.Tx, handler.Message[T]) error { return nil }

// FuzzPrepare feeds arbitrary record values, keys and headers through the
// record-to-message path (decode, derive the key) of handlers keyed by
// payload, by header and by coordinates, and the derived keys through
// dedupe.NormalizeKey. PrepareUnit must never panic; it either fails with a
// permanent *DecodeError or *KeyError or yields a non-empty key; the
// normalized key is what the guard table can store. The seed corpus is in
// testdata/fuzz/FuzzPrepare; `go test` runs it, `go test -fuzz=FuzzPrepare`
// explores.
func FuzzPrepare(f *testing.F) {
	f.Add([]byte(`{"order_id":"order-1","amount":5}`), []byte("k"), "message-id", []byte("m-1"))
	byPayload := handler.New("credit",
		handler.FromPayload(func(c fuzzCredit) string {
			if c.OrderID == "" {
				return ""
			}
			return dedupe.Key("credit", c.OrderID)
		}), noop[fuzzCredit])
	byHeader := handler.New("notify", handler.FromHeader[fuzzCredit]("message-id"), noop[fuzzCredit])
	byCoords := handler.New("audit", handler.FromCoordinates[fuzzCredit](), noop[fuzzCredit])
	f.Fuzz(func(t *testing.T, value, key []byte, headerName string, headerValue []byte) {
		rec := handler.Record{
			Topic: "credits", Partition: 3, Offset: 42, Key: key, Value: value,
			Headers: []handler.Header{{Key: "traceparent", Value: headerValue}, {Key: headerName, Value: headerValue}},
		}
		for _, h := range []*handler.Handler[fuzzCredit]{byPayload, byHeader, byCoords} {
			p, err := h.PrepareUnit(rec)
			if err != nil {
				var de *handler.DecodeError
				var ke *handler.KeyError
				if !errors.As(err, &de) && !errors.As(err, &ke) {
					t.Fatalf("%s: PrepareUnit failed with %T %v, want a *DecodeError or *KeyError", h.Name(), err, err)
				}
				if len(value) == 0 && !errors.As(err, &de) {
					t.Fatalf("%s: empty value gave %v, want a *DecodeError", h.Name(), err)
				}
				continue
			}
			if p.Key == "" {
				t.Fatalf("%s: PrepareUnit succeeded with an empty key", h.Name())
			}
			if h == byHeader {
				want, _ := rec.Header("message-id")
				if p.Key != string(want) {
					t.Fatalf("header key = %q, want the header's value %q", p.Key, want)
				}
			}
			if h == byCoords && p.Key != "credits/3/42" {
				t.Fatalf("coordinates key = %q", p.Key)
			}
			checkNormalized(t, p.Key)
		}
		checkNormalized(t, string(key))
		checkNormalized(t, string(headerValue))
	})
}

// checkNormalized checks dedupe.NormalizeKey's documented rule on key.
func checkNormalized(t *testing.T, key string) {
	t.Helper()
	n := dedupe.NormalizeKey(key)
	if !utf8.ValidString(n) || strings.IndexByte(n, 0) >= 0 || len(n) > dedupe.MaxKeyLen {
		t.Fatalf("NormalizeKey(%q) = %q: not storable (valid UTF-8, no NUL, <= %d bytes)", key, n, dedupe.MaxKeyLen)
	}
	if dedupe.NormalizeKey(n) != n {
		t.Fatalf("NormalizeKey is not idempotent on %q", key)
	}
	verbatim := utf8.ValidString(key) && strings.IndexByte(key, 0) < 0 && len(key) <= dedupe.MaxKeyLen
	if verbatim != (n == key) {
		t.Fatalf("NormalizeKey(%q) = %q: a storable key must be kept verbatim and only such a key", key, n)
	}
	if !verbatim && (!strings.HasPrefix(n, "sha256:") || len(n) != len("sha256:")+64) {
		t.Fatalf("NormalizeKey(%q) = %q, want sha256:<64 hex>", key, n)
	}
}
