package jsonflat

import (
	"encoding"
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
)

var (
	marshalerType     = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

// EncodesItself reports whether encoding/json encodes a value of type t
// (or one reached through a pointer, whose fields are addressable) through
// a method of its own.
func EncodesItself(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return t.Implements(marshalerType) || t.Implements(textMarshalerType) ||
		p.Implements(marshalerType) || p.Implements(textMarshalerType)
}

// hasIsZero reports whether t (or *t) has the IsZero method that
// encoding/json's omitzero calls instead of comparing with the zero value.
func hasIsZero(t reflect.Type) bool {
	_, ok := t.MethodByName("IsZero")
	_, pok := reflect.PointerTo(t).MethodByName("IsZero")
	return ok || pok
}

// Encoder writes one flat struct type as json.Marshal does. Build it with
// NewEncoder; it is safe for concurrent use.
type Encoder struct {
	fields []Field
	// keys are the fields' `,"name":`, the comma left out before the
	// first member written.
	keys [][]byte
	// size estimates an encoding's length (the names, punctuation and 20
	// bytes a value) so that Append mostly grows its buffer once.
	size int
}

// NewEncoder returns the encoder of struct type t, or nil when t is not
// flat (see Fields), encodes itself or a field that does (EncodesItself),
// or has a field with omitzero whose type has an IsZero method.
func NewEncoder(t reflect.Type) *Encoder {
	fields := Fields(t, EncodesItself)
	if fields == nil {
		return nil
	}
	e := &Encoder{fields: fields, keys: make([][]byte, len(fields)), size: 2}
	for i, f := range fields {
		if f.OmitZero && hasIsZero(t.Field(f.Index).Type) {
			return nil
		}
		e.keys[i] = []byte(`,"` + f.Name + `":`)
		e.size += len(e.keys[i]) + 20
	}
	return e
}

// Append appends the JSON encoding of rv, a value of the encoder's struct
// type, to dst and reports whether it could: it refuses a string that
// json.Marshal would escape (a control character, a quote, a backslash,
// '<', '>', '&' or any byte beyond ASCII) and a float that is not finite
// (json.Marshal fails on it), and the caller then encodes the value with
// json.Marshal. On refusal, the returned slice is to be ignored.
func (e *Encoder) Append(dst []byte, rv reflect.Value) ([]byte, bool) {
	open := len(dst)
	for i := range e.fields {
		f := &e.fields[i]
		fv := rv.Field(f.Index)
		if f.omitted(fv) {
			continue
		}
		dst = append(dst, e.keys[i]...)
		var ok bool
		if dst, ok = f.appendValue(dst, fv); !ok {
			return dst, false
		}
	}
	if len(dst) == open {
		return append(dst, '{', '}'), true
	}
	dst[open] = '{' // the first member's comma
	return append(dst, '}'), true
}

// omitted reports whether encoding/json leaves fv out: empty under
// omitempty, or reflect's zero (what encoding/json asks) under omitzero.
func (f *Field) omitted(fv reflect.Value) bool {
	switch {
	case f.OmitZero && fv.IsZero():
		return true
	case !f.OmitEmpty:
		return false
	}
	switch f.Kind {
	case reflect.String:
		return fv.Len() == 0
	case reflect.Bool:
		return !fv.Bool()
	case reflect.Float32, reflect.Float64:
		return fv.Float() == 0
	}
	if reflect.Int <= f.Kind && f.Kind <= reflect.Int64 {
		return fv.Int() == 0
	}
	return fv.Uint() == 0
}

// appendValue appends fv's JSON value, refusing what Append refuses.
func (f *Field) appendValue(dst []byte, fv reflect.Value) ([]byte, bool) {
	switch f.Kind {
	case reflect.String:
		s := fv.String()
		for i := range len(s) {
			if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
				return dst, false
			}
		}
		dst = append(dst, '"')
		dst = append(dst, s...)
		return append(dst, '"'), true
	case reflect.Bool:
		return strconv.AppendBool(dst, fv.Bool()), true
	case reflect.Float32, reflect.Float64:
		return appendFloat(dst, fv.Float(), f.Bits)
	}
	if reflect.Int <= f.Kind && f.Kind <= reflect.Int64 {
		return strconv.AppendInt(dst, fv.Int(), 10), true
	}
	return strconv.AppendUint(dst, fv.Uint(), 10), true
}

// appendFloat appends x as encoding/json writes a float of the given size:
// the shortest decimal that reads back as x, in exponent form below 1e-6
// and from 1e21 on (with the exponent's leading zero dropped). It refuses
// NaN and the infinities.
func appendFloat(dst []byte, x float64, bits int) ([]byte, bool) {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return dst, false
	}
	abs := math.Abs(x)
	format := byte('f')
	if abs != 0 {
		if bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
			format = 'e'
		}
	}
	dst = strconv.AppendFloat(dst, x, format, -1, bits)
	if format == 'e' {
		if n := len(dst); n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
			dst[n-2] = dst[n-1]
			dst = dst[:n-1]
		}
	}
	return dst, true
}

// Encoders keeps the Encoder of each type it is asked to marshal (or that
// the type has none). The zero value is ready; it is safe for concurrent
// use and must not be copied after first use.
type Encoders struct {
	m    sync.Map                // reflect.Type → *Encoder (nil: not flat)
	last atomic.Pointer[encoded] // the type marshaled last, looked at first
}

// encoded is one type's entry in Encoders.
type encoded struct {
	t reflect.Type
	e *Encoder
}

// Marshal returns v's encoding as json.Marshal returns it, in a new slice,
// when v is a flat struct (or a non-nil pointer to one) whose encoding
// Append does not refuse; otherwise ok is false and the caller encodes v
// itself.
func (es *Encoders) Marshal(v any) (b []byte, ok bool) {
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return nil, false
		}
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct {
		return nil, false
	}
	t := rv.Type()
	var e *Encoder
	if last := es.last.Load(); last != nil && last.t == t {
		e = last.e
	} else {
		if got, found := es.m.Load(t); found {
			e = got.(*Encoder)
		} else {
			e = NewEncoder(t)
			es.m.Store(t, e)
		}
		es.last.Store(&encoded{t: t, e: e})
	}
	if e == nil {
		return nil, false
	}
	return e.Append(make([]byte, 0, e.size), rv)
}
