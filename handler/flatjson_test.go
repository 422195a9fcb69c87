package handler

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// flatPayload is a flat command: every kind of field the flat decoder
// sets, at several sizes, with a field named by the Go name, an omitempty
// option, an ignored field and an unexported one.
type flatPayload struct {
	ID      string  `json:"id"`
	Amount  int64   `json:"amount"`
	Small   int8    `json:"small"`
	Count   uint16  `json:"count"`
	Big     uint64  `json:"big"`
	Price   float64 `json:"price,omitempty"`
	Ratio   float32 `json:"ratio"`
	OK      bool    `json:"ok"`
	Plain   string
	Skipped string `json:"-"`
	//lint:ignore U1000 the field is there to be ignored: encoding/json never sets it
	hidden string
}

// flatJSONInputs are what a flat payload's decoders must agree on: plain
// commands the flat decoder takes, and every way an input can leave the
// plain form (whose value encoding/json decides).
var flatJSONInputs = []string{
	`{"id":"a","amount":5}`,
	`{"id":"b","amount":-7,"small":-128,"count":65535,"big":18446744073709551615,"price":12.5,"ratio":0.25,"ok":true,"Plain":"p"}`,
	" \t\r\n{ \"id\" :\n\"c\" ,\t\"ok\" : false } \n",
	`{}`, `{ }`, `{"id":""}`, `{"id":"é ü 日本 😀"}`,
	// limits of each size
	`{"small":127}`, `{"small":128}`, `{"small":-129}`, `{"count":65536}`, `{"count":-1}`,
	`{"amount":9223372036854775807}`, `{"amount":9223372036854775808}`, `{"amount":-9223372036854775808}`,
	`{"amount":-9223372036854775809}`, `{"big":18446744073709551616}`, `{"big":99999999999999999999999}`,
	`{"ratio":3.5e38}`, `{"ratio":3.5e39}`, `{"price":1e308}`, `{"price":1e400}`, `{"price":1e-400}`,
	`{"price":-0}`, `{"price":-0.0}`, `{"price":0.1e1}`, `{"price":1E+2}`, `{"price":1e-2}`, `{"price":123456789012345678901234567890}`,
	// numbers that are not integers, or not JSON
	`{"amount":1.0}`, `{"amount":1e3}`, `{"amount":-0}`, `{"amount":01}`, `{"amount":-}`, `{"amount":+1}`,
	`{"amount":1.}`, `{"price":.5}`, `{"price":1e}`, `{"price":1e+}`, `{"price":--1}`, `{"amount":0x10}`,
	`{"amount":"5"}`, `{"id":5}`, `{"ok":"true"}`, `{"ok":1}`,
	// literals
	`{"ok":true}`, `{"ok":tru}`, `{"ok":truex}`, `{"ok":falsey}`, `{"ok":null}`, `{"id":null}`, `{"amount":null}`,
	// names
	`{"ID":"upper"}`, `{"Id":"x","id":"y"}`, `{"id":"x","ID":"y"}`, `{"plain":"lower"}`, `{"Plain":"exact"}`,
	`{"id":"first","id":"second"}`, `{"hidden":"h"}`, `{"Skipped":"s"}`, `{"-":"dash"}`, `{"color":"red"}`,
	`{"color":{"deep":[1,2]},"id":"z"}`, `{"i\u0064":"escaped name"}`, "{\"id\xff\":\"x\"}",
	// strings
	`{"id":"esc \" quote"}`, `{"id":"esc \\ backslash"}`, `{"id":"\u00e9"}`, "{\"id\":\"bad \xff utf8\"}",
	"{\"id\":\"ctl \x01\"}", "{\"id\":\"tab \t\"}", "{\"id\":\"del \x7f\"}", `{"id":"unterminated}`,
	// structure
	``, ` `, `null`, `[]`, `"s"`, `12`, `{`, `}`, `{"id"}`, `{"id":}`, `{"id" "a"}`, `{,}`, `{"id":"a",}`,
	`{"id":"a"`, `{"id":"a"}x`, `{"id":"a"} {"id":"b"}`, `{"id":"a"}}`, `{"id":"a"};`, `{"id":"a" "amount":1}`,
	"\ufeff{\"id\":\"bom\"}", `{"id":"a"}` + "\x00",
	`{"id":"` + strings.Repeat("h", 64<<10) + `","amount":8}`,
}

// TestFlatJSONDecodesLikeEncodingJSON: a handler whose payload is a flat
// struct decodes every input to encoding/json's value, and fails every
// input encoding/json refuses with its error, with and without
// DisallowUnknownFields.
func TestFlatJSONDecodesLikeEncodingJSON(t *testing.T) {
	for _, strict := range []bool{false, true} {
		for _, in := range flatJSONInputs {
			checkFastJSONOf[flatPayload](t, JSON{DisallowUnknownFields: strict}, in)
		}
	}
}

// FuzzFlatJSONDecodesLikeEncodingJSON is TestFlatJSONDecodesLikeEncodingJSON
// over generated inputs (`go test -fuzz FuzzFlatJSON ./handler/`); make test
// runs its seeds.
func FuzzFlatJSONDecodesLikeEncodingJSON(f *testing.F) {
	for _, in := range flatJSONInputs {
		if len(in) < 1<<10 {
			f.Add(in, false)
		}
	}
	f.Fuzz(func(t *testing.T, in string, strict bool) {
		checkFastJSONOf[flatPayload](t, JSON{DisallowUnknownFields: strict}, in)
	})
}

// TestFlatJSONTakesThePlainInputs: the flat decoder decodes a plain
// command by itself (so the speed-up is real), and refuses, leaving the
// value zero, what it must leave to the general decoders.
func TestFlatJSONTakesThePlainInputs(t *testing.T) {
	f := newFlatJSON(reflect.TypeFor[flatPayload]())
	if f == nil {
		t.Fatal("a flat struct has no flat decoder")
	}
	var p flatPayload
	in := `{"id":"a","amount":-5,"small":3,"count":9,"big":7,"price":1.5,"ratio":2,"ok":true,"Plain":"q"}`
	want := flatPayload{ID: "a", Amount: -5, Small: 3, Count: 9, Big: 7, Price: 1.5, Ratio: 2, OK: true, Plain: "q"}
	if !f.decode([]byte(in), &p) || p != want {
		t.Errorf("a plain command: refused, or decoded %+v", p)
	}
	for _, in := range []string{`{"id":"a","ID":"b"}`, `{"id":"a","color":"red"}`, `{"id":"a\n"}`, `{"id":"a","amount":1e3}`, `{"id":"a","ok":null}`} {
		var p flatPayload
		if f.decode([]byte(in), &p) {
			t.Errorf("%s: the flat decoder took it", in)
		}
		if p != (flatPayload{}) {
			t.Errorf("%s: refused, but left %+v", in, p)
		}
	}
}

// upperText decodes itself from a JSON string.
type upperText string

func (u *upperText) UnmarshalText(b []byte) error {
	*u = upperText(strings.ToUpper(string(b)))
	return nil
}

// TestFlatJSONOnlyForFlatStructs: a payload with a field the flat decoder
// cannot set as encoding/json would has none, and is decoded as before.
func TestFlatJSONOnlyForFlatStructs(t *testing.T) {
	type embedded struct{ ID string }
	notFlat := map[string]reflect.Type{
		"a time.Time field": reflect.TypeFor[struct {
			At time.Time `json:"at"`
		}](),
		"a field that decodes itself": reflect.TypeFor[struct {
			U upperText `json:"u"`
		}](),
		"the string option": reflect.TypeFor[struct {
			N int `json:"n,string"`
		}](),
		"an embedded struct": reflect.TypeFor[struct {
			embedded
			N int
		}](),
		"a slice":   reflect.TypeFor[struct{ L []string }](),
		"a pointer": reflect.TypeFor[struct{ P *int }](),
		"names equal without case": reflect.TypeFor[struct {
			A int `json:"x"`
			B int `json:"X"`
		}](),
		"a name with other bytes": reflect.TypeFor[struct {
			A int `json:"a-b"`
		}](),
		"no field":                     reflect.TypeFor[struct{}](),
		"not a struct":                 reflect.TypeFor[map[string]int](),
		"the general payload":          reflect.TypeFor[fastPayload](),
		"a struct that decodes itself": reflect.TypeFor[upperStruct](),
	}
	for why, typ := range notFlat {
		if newFlatJSON(typ) != nil {
			t.Errorf("%s: got a flat decoder", why)
		}
	}
	type upperHolder struct {
		U upperText `json:"u"`
	}
	checkFastJSONOf[upperHolder](t, JSON{}, `{"u":"loud"}`)
	checkFastJSONOf[upperStruct](t, JSON{}, `{"S":"loud"}`)
}

// upperStruct is a flat struct with its own UnmarshalJSON.
type upperStruct struct{ S string }

func (u *upperStruct) UnmarshalJSON(b []byte) error {
	u.S = strings.ToUpper(string(b))
	return nil
}
