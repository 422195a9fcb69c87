package handler_test

import (
	"strings"
	"testing"

	"github.com/exactly-go/exactly/handler"
)

// handler.JSON decodes exactly one JSON value: whitespace around it is
// fine; an empty value, a null, trailing data and malformed JSON fail with
// an error saying so; unknown fields are ignored unless
// DisallowUnknownFields is set; a value of the wrong type fails.
func TestJSONCodecSemantics(t *testing.T) {
	type payload struct {
		ID     string         `json:"id"`
		Amount int64          `json:"amount"`
		Extra  map[string]any `json:"extra"`
	}
	cases := []struct {
		name, in string
		strict   bool
		want     payload
		err      string // substring of the error; "" for success
	}{
		{name: "object", in: `{"id":"a","amount":5}`, want: payload{ID: "a", Amount: 5}},
		{name: "whitespace around", in: " \n\t{\"id\":\"a\"}\r\n ", want: payload{ID: "a"}},
		{name: "unknown field ignored", in: `{"id":"a","color":"red"}`, want: payload{ID: "a"}},
		{name: "unknown field rejected", in: `{"id":"a","color":"red"}`, strict: true, err: `unknown field "color"`},
		{name: "strict known fields", in: `{"id":"a","amount":2}`, strict: true, want: payload{ID: "a", Amount: 2}},
		{name: "numbers in any are float64", in: `{"extra":{"n":1}}`, want: payload{Extra: map[string]any{"n": 1.0}}},
		{name: "empty", in: ``, err: "empty value"},
		{name: "blank", in: "  \n", err: "empty value"},
		{name: "null", in: ` null `, err: "value is null"},
		{name: "two values", in: `{"id":"a"} {"id":"b"}`, err: "trailing data after the value"},
		{name: "strict two values", in: `{"id":"a"} {"id":"b"}`, strict: true, err: "trailing data after the value"},
		{name: "trailing garbage", in: `{"id":"a"}x`, err: "trailing data after the value"},
		{name: "trailing brace", in: `{"id":"a"}}`, err: "trailing data after the value"},
		{name: "strict trailing brace", in: `{"id":"a"}}`, strict: true, err: "trailing data after the value"},
		{name: "trailing bracket", in: `{"id":"a"} ]`, err: "trailing data after the value"},
		{name: "truncated", in: `{"id":"a"`, err: "unexpected EOF"},
		{name: "malformed", in: `{"id":}`, err: "invalid character '}'"},
		{name: "wrong type", in: `{"id":"a","amount":"five"}`, err: "cannot unmarshal string into Go struct field payload.amount of type int64"},
		{name: "strict wrong type", in: `{"id":"a","amount":"five"}`, strict: true, err: "cannot unmarshal string into Go struct field payload.amount of type int64"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got payload
			err := handler.JSON{DisallowUnknownFields: c.strict}.Unmarshal([]byte(c.in), &got)
			switch {
			case c.err == "" && err != nil:
				t.Fatalf("Unmarshal(%q) failed: %v", c.in, err)
			case c.err != "" && err == nil:
				t.Fatalf("Unmarshal(%q) = %+v, want an error containing %q", c.in, got, c.err)
			case c.err != "" && (!strings.Contains(err.Error(), c.err) || !strings.HasPrefix(err.Error(), "decoding json: ")):
				t.Fatalf("Unmarshal(%q) error %q, want \"decoding json: ...%s...\"", c.in, err, c.err)
			case c.err == "" && (got.ID != c.want.ID || got.Amount != c.want.Amount || len(got.Extra) != len(c.want.Extra) || (c.want.Extra != nil && got.Extra["n"] != c.want.Extra["n"])):
				t.Fatalf("Unmarshal(%q) = %+v, want %+v", c.in, got, c.want)
			}
		})
	}
}
