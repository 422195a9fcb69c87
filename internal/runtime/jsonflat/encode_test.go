package jsonflat_test

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/exactly-go/exactly/internal/runtime/jsonflat"
)

type event struct {
	OrderID string `json:"order_id"`
	Account int64  `json:"account"`
	Amount  int64  `json:"amount"`
}

type kinds struct {
	S   string
	B   bool
	I   int
	I8  int8
	I16 int16
	I32 int32
	I64 int64
	U   uint
	U8  uint8
	U16 uint16
	U32 uint32
	U64 uint64
	F32 float32
	F64 float64
}

type omitted struct {
	S    string  `json:"s,omitempty"`
	B    bool    `json:"b,omitempty"`
	I    int     `json:"i,omitempty"`
	U    uint16  `json:"u,omitempty"`
	F    float64 `json:"f,omitempty"`
	ZF   float64 `json:"zf,omitzero"`
	ZS   string  `json:"zs,omitzero"`
	Both float32 `json:"both,omitempty,omitzero"`
	skip int
	Dash int `json:"-"`
}

type named string

type namedKinds struct {
	N named `json:"n"`
	K int   `json:",omitempty"`
}

// marshalLikeJSON checks that es encodes v as json.Marshal does, and that
// it takes v (does not leave it to json.Marshal) exactly when wantFlat.
func marshalLikeJSON(t *testing.T, es *jsonflat.Encoders, v any, wantFlat bool) {
	t.Helper()
	want, werr := json.Marshal(v)
	got, ok := es.Marshal(v)
	if ok && werr != nil {
		t.Fatalf("Marshal(%#v) = %s, but json.Marshal fails: %v", v, got, werr)
	}
	if ok && !bytes.Equal(got, want) {
		t.Fatalf("Marshal(%#v) = %s, want json.Marshal's %s", v, got, want)
	}
	if ok != wantFlat {
		t.Fatalf("Marshal(%#v) took it: %v, want %v", v, ok, wantFlat)
	}
}

func TestEncodesLikeEncodingJSON(t *testing.T) {
	var es jsonflat.Encoders
	flat := []any{
		event{OrderID: "order-1", Account: 7, Amount: -250},
		&event{OrderID: "", Account: math.MinInt64, Amount: math.MaxInt64},
		event{},
		kinds{},
		kinds{S: "a b ~!@#$%^*()_+=-`{}[]|:;',./?", B: true, I: -1, I8: math.MinInt8, I16: math.MaxInt16, I32: math.MinInt32, I64: math.MaxInt64,
			U: math.MaxUint, U8: math.MaxUint8, U16: math.MaxUint16, U32: math.MaxUint32, U64: math.MaxUint64,
			F32: math.MaxFloat32, F64: math.SmallestNonzeroFloat64},
		omitted{},
		omitted{S: "x", B: true, I: -3, U: 9, F: 1.5, ZF: -0.5, ZS: "y", Both: 2, skip: 4, Dash: 5},
		omitted{F: math.Copysign(0, -1), ZF: math.Copysign(0, -1), Both: float32(math.Copysign(0, -1))},
		namedKinds{N: "named"},
		namedKinds{N: "", K: 3},
	}
	for _, f := range []float64{0, 1, -1, 0.1, 1e-6, 9.99999e-7, 1e-7, 123456789, 1e20, 1e21, 1.5e300, -2.5e-10, 5e-324, 1e-9, 3.14159, 100, 1e6} {
		flat = append(flat, kinds{F64: f}, kinds{F64: -f})
		if f32 := float32(f); !math.IsInf(float64(f32), 0) {
			flat = append(flat, kinds{F32: f32}, kinds{F32: -f32})
		}
	}
	for _, v := range flat {
		marshalLikeJSON(t, &es, v, true)
	}
	refused := []any{
		event{OrderID: `quote"`},
		event{OrderID: `back\slash`},
		event{OrderID: "<html>"},
		event{OrderID: "a&b"},
		event{OrderID: "tab\t"},
		event{OrderID: "nul\x00"},
		event{OrderID: "é"},
		event{OrderID: "\u2028"},
		event{OrderID: "\xff"},
		kinds{F64: math.NaN()},
		kinds{F32: float32(math.Inf(1))},
		kinds{F64: math.Inf(-1)},
		(*event)(nil),
		42,
		"string",
		[]event{{}},
		map[string]int{"a": 1},
		nil,
	}
	for _, v := range refused {
		marshalLikeJSON(t, &es, v, false)
	}
}

// Types that are not flat are left to json.Marshal, whatever their value.
func TestEncodersOnlyForFlatStructs(t *testing.T) {
	type (
		inner     struct{ A int }
		embedding struct {
			inner
			B int
		}
		nested  struct{ In inner }
		slice   struct{ S []int }
		pointer struct{ P *int }
		quoted  struct {
			N int `json:"n,string"`
		}
		oddName struct {
			N int `json:"n-1"`
		}
		clash struct {
			A int `json:"x"`
			B int `json:"X"`
		}
		number struct{ N json.Number }
		stamp  struct{ T time.Time }
		iface  struct{ V any }
		//lint:ignore U1000 a struct whose only field is unexported encodes as {}
		empty  struct{ unexported int }
		zeroer struct {
			D time.Duration `json:"d,omitzero"`
			Z isZeroer      `json:"z,omitzero"`
		}
	)
	var es jsonflat.Encoders
	for _, v := range []any{embedding{}, nested{}, slice{}, pointer{}, quoted{N: 1}, oddName{}, clash{}, number{N: "1"},
		stamp{}, iface{}, empty{}, zeroer{}, selfMarshaled{}, &selfMarshaled{}, textMarshaled{}, ptrMarshaled{A: 1}, &ptrMarshaled{A: 1}} {
		marshalLikeJSON(t, &es, v, false)
	}
	if jsonflat.NewEncoder(reflect.TypeFor[selfMarshaled]()) != nil {
		t.Fatal("NewEncoder built an encoder for a type with MarshalJSON")
	}
}

type isZeroer int

func (z isZeroer) IsZero() bool { return z == 7 }

type selfMarshaled struct{ A int }

func (selfMarshaled) MarshalJSON() ([]byte, error) { return []byte(`"self"`), nil }

type textMarshaled struct{ A int }

func (textMarshaled) MarshalText() ([]byte, error) { return []byte("text"), nil }

type ptrMarshaled struct{ A int }

func (*ptrMarshaled) MarshalJSON() ([]byte, error) { return []byte(`"ptr"`), nil }

// Each encoding is a new slice: a caller may keep it (an outbox row does).
func TestMarshalReturnsNewSlices(t *testing.T) {
	var es jsonflat.Encoders
	a, _ := es.Marshal(event{OrderID: "a"})
	b, _ := es.Marshal(event{OrderID: "b"})
	if string(a) != `{"order_id":"a","account":0,"amount":0}` || string(b) != `{"order_id":"b","account":0,"amount":0}` {
		t.Fatalf("encodings %s and %s", a, b)
	}
}

func FuzzEncodesLikeEncodingJSON(f *testing.F) {
	f.Add("order-1", int64(1), int64(2), 1.5, float32(0.25), true, uint32(3))
	f.Add("<&>", int64(-1), int64(0), math.Inf(1), float32(1e30), false, uint32(0))
	f.Add("", int64(0), int64(0), 0.0, float32(0), false, uint32(0))
	f.Fuzz(func(t *testing.T, s string, i, j int64, x float64, y float32, b bool, u uint32) {
		var es jsonflat.Encoders
		v := struct {
			S  string  `json:"s"`
			SE string  `json:"se,omitempty"`
			I  int64   `json:"i"`
			J  int16   `json:"j,omitempty"`
			X  float64 `json:"x,omitzero"`
			Y  float32 `json:"y"`
			B  bool    `json:"b"`
			U  uint32  `json:"u,omitempty"`
		}{s, strings.ToUpper(s), i, int16(j), x, y, b, u}
		want, werr := json.Marshal(v)
		got, ok := es.Marshal(v)
		if !ok {
			return
		}
		if werr != nil || !bytes.Equal(got, want) {
			t.Fatalf("Marshal(%#v) = %s, json.Marshal = %s, %v", v, got, want, werr)
		}
	})
}

func BenchmarkMarshal(b *testing.B) {
	v := event{OrderID: "order-0001234", Account: 1234, Amount: 250}
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Encoders", func(b *testing.B) {
		var es jsonflat.Encoders
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := es.Marshal(v); !ok {
				b.Fatal("refused")
			}
		}
	})
}
