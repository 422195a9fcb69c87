package handler

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// fastPayload is a payload with the shapes a command carries: strings,
// numbers, a slice, a map, a pointer, an embedded struct, a `string`
// option, an ignored field and a field without a tag.
type fastPayload struct {
	fastEmbedded
	ID      string         `json:"id"`
	Amount  int64          `json:"amount"`
	Price   float64        `json:"price,omitempty"`
	Quoted  int            `json:"quoted,string"`
	Tags    []string       `json:"tags"`
	Extra   map[string]any `json:"extra"`
	Note    *string        `json:"note"`
	Ignored string         `json:"-"`
	Untyped any            `json:"untyped"`
	Plain   bool
}

type fastEmbedded struct {
	Region string `json:"region"`
}

// fastJSONInputs are the inputs both decoders get: valid commands, and
// what encoding/json's semantics decide in their own way (case-insensitive
// names, duplicate names, invalid UTF-8, escapes, null fields, big
// numbers, trailing data, wrong types).
var fastJSONInputs = []string{
	`{"id":"a","amount":5}`,
	"{\"id\":\"b\"}  \n\t ",
	` {"id":"c","tags":["x","y"]}`,
	`{"id":"d","color":"red"}`,
	``, "  \n", ` null `,
	`{"id":"e"} {"id":"f"}`,
	`{"id":"g"}x`, `{"id":"h"}}`, `{"id":"i"} ]`,
	`{"id":"j"`, `{"id":}`, `{"id":"k","amount":"five"}`,
	`{"extra":{"n":1,"m":[1,2],"s":"t","b":true,"z":null}}`,
	`"just a string"`, `12`, `[1,2]`, `true`,
	`{"ID":"upper","AMOUNT":9,"Region":"eu"}`,
	`{"id":"first","id":"second"}`,
	"{\"id\":\"bad \xff utf8\"}",
	`{"id":"esc \u00e9 \ud83d\ude00 \n \" \\"}`,
	`{"id":"lone surrogate \ud800"}`,
	`{"id":null,"amount":null,"tags":null,"note":null}`,
	`{"note":"n","untyped":{"a":[1,"b",null]}}`,
	`{"amount":9223372036854775807}`, `{"amount":9223372036854775808}`,
	`{"amount":1e3}`, `{"amount":1.5}`, `{"amount":-0}`, `{"price":1e400}`,
	`{"quoted":"42"}`, `{"quoted":42}`, `{"quoted":"x"}`,
	`{"Ignored":"x","-":"y"}`,
	`{"plain":true,"Plain":false}`,
	`{"tags":"notalist"}`, `{"tags":[1]}`, `{"extra":[]}`,
	`{"region":"us","fastEmbedded":{"region":"x"}}`,
	`{"id":"` + strings.Repeat("h", 100<<10) + `","amount":8}`,
	`{"id":"n"}`,
	"{\"id\":\"ctl \x01\"}",
	`{"id" : "spaces" , "amount" : 3 }`,
	`{,}`, `{"id":"o",}`, `[]`, `{}`,
}

// checkFastJSON decodes in with the handler's path (the fast path, then
// JSON.Unmarshal on refusal) and with JSON.Unmarshal alone, and fails when
// they differ in value or in error.
func checkFastJSON(t *testing.T, codec JSON, in string) {
	t.Helper()
	checkFastJSONOf[fastPayload](t, codec, in)
}

// checkFastJSONOf is checkFastJSON for a payload of type T.
func checkFastJSONOf[T any](t *testing.T, codec JSON, in string) {
	t.Helper()
	h := newCore("p", FromPayload(func(T) string { return "k" }), false, []Option{WithCodec(codec)})
	var want, got T
	wantErr := codec.Unmarshal([]byte(in), &want)
	gotErr := h.decode([]byte(in), &got)
	if (wantErr == nil) != (gotErr == nil) || (wantErr != nil && wantErr.Error() != gotErr.Error()) {
		t.Errorf("strict=%v, %.80q: error %v, want %v", codec.DisallowUnknownFields, in, gotErr, wantErr)
		return
	}
	if wantErr == nil && !reflect.DeepEqual(got, want) {
		t.Errorf("strict=%v, %.80q: %+v, want %+v", codec.DisallowUnknownFields, in, got, want)
	}
}

// TestFastJSONDecodesLikeEncodingJSON: a handler with the JSON codec
// decodes every input to encoding/json's value, and fails every input
// encoding/json refuses with its error, with and without
// DisallowUnknownFields.
func TestFastJSONDecodesLikeEncodingJSON(t *testing.T) {
	for _, strict := range []bool{false, true} {
		for _, in := range fastJSONInputs {
			checkFastJSON(t, JSON{DisallowUnknownFields: strict}, in)
		}
	}
}

// FuzzFastJSONDecodesLikeEncodingJSON is TestFastJSONDecodesLikeEncodingJSON
// over generated inputs (`go test -fuzz FuzzFastJSON ./handler/`); make test
// runs its seeds.
func FuzzFastJSONDecodesLikeEncodingJSON(f *testing.F) {
	for _, in := range fastJSONInputs {
		if len(in) < 1<<10 { // a huge seed makes every mutation slow to minimize
			f.Add(in, false)
		}
	}
	f.Fuzz(func(t *testing.T, in string, strict bool) {
		checkFastJSON(t, JSON{DisallowUnknownFields: strict}, in)
	})
}

// TestFastJSONTakesTheFastPath: the fast path decodes a valid command by
// itself (so the speed-up is real), and refuses what it must leave to
// encoding/json.
func TestFastJSONTakesTheFastPath(t *testing.T) {
	f := newFastJSON(JSON{}, reflect.TypeFor[fastPayload]())
	var p fastPayload
	if !f.decode([]byte(`{"id":"a","amount":5,"tags":["x"]}`), &p) || p.ID != "a" || p.Amount != 5 {
		t.Errorf("a valid command: fast path refused it or decoded %+v", p)
	}
	for _, in := range []string{``, `null`, `{"id":"g"}x`, `{"amount":"five"}`} {
		if f.decode([]byte(in), &p) {
			t.Errorf("%q: the fast path accepted it", in)
		}
	}
	strict := newFastJSON(JSON{DisallowUnknownFields: true}, reflect.TypeFor[fastPayload]())
	if strict.decode([]byte(`{"id":"d","color":"red"}`), &p) {
		t.Error("DisallowUnknownFields: the fast path accepted an unknown field")
	}
}

// panicky panics when decoded, as a user's UnmarshalJSON may.
type panicky struct{}

func (*panicky) UnmarshalJSON([]byte) error { panic("boom") }

// TestFastJSONPanicIsTheCodecs: a value whose decoding panics fails its
// record as it did with encoding/json alone ("codec panicked"), and the
// fast path itself reports a panic as a refusal instead of panicking.
func TestFastJSONPanicIsTheCodecs(t *testing.T) {
	type withPanicky struct {
		P panicky `json:"p"`
	}
	f := newFastJSON(JSON{}, reflect.TypeFor[withPanicky]())
	var v withPanicky
	if f.decode([]byte(`{"p":1}`), &v) {
		t.Error("the fast path accepted a value whose decoding panicked")
	}
	h := newCore("p", FromPayload(func(withPanicky) string { return "k" }), false, nil)
	if err := h.decode([]byte(`{"p":1}`), &v); err == nil || !strings.Contains(err.Error(), "codec panicked: boom") {
		t.Errorf("decode: %v, want the codec's panic", err)
	}
}

// numbered holds encoding/json.Number, which the v2 code does not know: it
// took `{"n":"x"}` (encoding/json refuses it) and refused `{"n":12.5}`.
type numbered struct {
	N    json.Number            `json:"n"`
	Deep map[string][]*numbered `json:"deep"`
}

// TestFastJSONLeavesJSONNumberToEncodingJSON: a payload type holding an
// encoding/json.Number anywhere has no fast path, and decodes exactly as
// encoding/json decodes it.
func TestFastJSONLeavesJSONNumberToEncodingJSON(t *testing.T) {
	if newFastJSON(JSON{}, reflect.TypeFor[numbered]()) != nil {
		t.Error("a type holding json.Number got the fast path")
	}
	if newFastJSON(JSON{}, reflect.TypeFor[struct {
		P *struct{ L []map[string]json.Number }
	}]()) != nil {
		t.Error("a type holding json.Number deep inside got the fast path")
	}
	if newFastJSON(JSON{}, reflect.TypeFor[fastPayload]()) == nil {
		t.Error("a type without json.Number has no fast path")
	}
	h := newCore("p", FromPayload(func(numbered) string { return "k" }), false, nil)
	for _, in := range []string{`{"n":"x"}`, `{"n":12.5}`, `{"n":"12"}`, `{"deep":{"a":[{"n":"y"}]}}`} {
		var want, got numbered
		wantErr := JSON{}.Unmarshal([]byte(in), &want)
		gotErr := h.decode([]byte(in), &got)
		if (wantErr == nil) != (gotErr == nil) || (wantErr == nil && !reflect.DeepEqual(got, want)) {
			t.Errorf("%s: %+v, %v; want %+v, %v", in, got, gotErr, want, wantErr)
		}
	}
}
