package handler

import (
	"encoding"
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"unicode/utf8"

	"github.com/exactly-go/exactly/internal/runtime/jsonflat"
)

// flatJSON decodes the commonest command payload, a JSON object whose
// members are a flat struct's strings, booleans and numbers, by scanning it
// once: no tokenizer, no per-call options, one allocation per string
// field. It accepts only inputs whose encoding/json value is plain to see,
// and refuses (leaving the value zero) everything else, which the general
// decoders then decide:
//
//   - the value is one object, with JSON whitespace around its tokens;
//   - every member name is, byte for byte, the JSON name of one of the
//     struct's fields, and appears once (encoding/json prefers an exact
//     match to a case-insensitive one, so an exact name means that field);
//   - a string holds no escape, no control character and only valid UTF-8
//     (which encoding/json keeps as it is);
//   - an integer is written without fraction or exponent and fits its
//     field; a float is what strconv.ParseFloat reads at the field's size,
//     as encoding/json reads it;
//   - no member is null.
//
// newFlatJSON builds one only for a struct whose fields it can decode
// exactly so (see there).
type flatJSON struct {
	fields []flatField
}

// flatField is one struct field flatJSON sets.
type flatField struct {
	jsonflat.Field
}

var (
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// newFlatJSON returns the flat decoder of struct type t, or nil when t is
// not flat (jsonflat.Fields: a field that is embedded, of another kind than
// string, bool, int, uint or float, or with the `string` option, a name of
// other characters than ASCII letters, digits and underscores, two names
// equal without regard to case, more than 64 fields) or decodes itself or
// a field (json.Unmarshaler, encoding.TextUnmarshaler). Unexported fields
// and fields tagged "-" are left out, as encoding/json leaves them.
func newFlatJSON(t reflect.Type) *flatJSON {
	fields := jsonflat.Fields(t, decodesItself)
	if fields == nil {
		return nil
	}
	f := &flatJSON{fields: make([]flatField, len(fields))}
	for i, field := range fields {
		f.fields[i] = flatField{field}
	}
	return f
}

// decodesItself reports whether encoding/json decodes a value of type t
// through the value's own method.
func decodesItself(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return t.Implements(jsonUnmarshalerType) || t.Implements(textUnmarshalerType) ||
		p.Implements(jsonUnmarshalerType) || p.Implements(textUnmarshalerType)
}

// decode decodes data into v, a pointer to the zero value of the struct
// newFlatJSON was given, reporting whether it did. When it refuses, v is
// zero again.
func (f *flatJSON) decode(data []byte, v any) bool {
	rv := reflect.ValueOf(v).Elem()
	if f.decodeInto(data, rv) {
		return true
	}
	rv.SetZero()
	return false
}

// decodeInto is decode, which may leave rv partly set when it refuses.
func (f *flatJSON) decodeInto(data []byte, rv reflect.Value) bool {
	i := skipJSONSpace(data, 0)
	if i == len(data) || data[i] != '{' {
		return false
	}
	i = skipJSONSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return skipJSONSpace(data, i+1) == len(data)
	}
	var seen uint64
	for {
		name, next, ok := plainString(data, i)
		if !ok {
			return false
		}
		fi := f.field(name)
		if fi < 0 || seen&(1<<fi) != 0 {
			return false
		}
		seen |= 1 << fi
		i = skipJSONSpace(data, next)
		if i == len(data) || data[i] != ':' {
			return false
		}
		if i, ok = f.fields[fi].decode(data, skipJSONSpace(data, i+1), rv); !ok {
			return false
		}
		i = skipJSONSpace(data, i)
		if i == len(data) {
			return false
		}
		switch data[i] {
		case ',':
			i = skipJSONSpace(data, i+1)
		case '}':
			return skipJSONSpace(data, i+1) == len(data)
		default:
			return false
		}
	}
}

// field returns the index in f.fields of the field named name exactly, or
// -1.
func (f *flatJSON) field(name []byte) int {
	for i := range f.fields {
		if string(name) == f.fields[i].Name {
			return i
		}
	}
	return -1
}

// decode reads the value at data[i:] into its field of rv, returning the
// index after it and whether it could.
func (f *flatField) decode(data []byte, i int, rv reflect.Value) (int, bool) {
	fv := rv.Field(f.Index)
	switch f.Kind {
	case reflect.String:
		s, next, ok := plainString(data, i)
		if !ok {
			return 0, false
		}
		fv.SetString(string(s))
		return next, true
	case reflect.Bool:
		switch {
		case len(data)-i >= 4 && string(data[i:i+4]) == "true":
			fv.SetBool(true)
			return i + 4, true
		case len(data)-i >= 5 && string(data[i:i+5]) == "false":
			return i + 5, true // the zero value already
		}
		return 0, false
	case reflect.Float32, reflect.Float64:
		end := jsonNumberEnd(data, i)
		if end == i {
			return 0, false
		}
		n, err := strconv.ParseFloat(string(data[i:end]), f.Bits)
		if err != nil {
			return 0, false
		}
		fv.SetFloat(n)
		return end, true
	}
	neg := i < len(data) && data[i] == '-'
	if neg {
		i++
	}
	u, end, ok := jsonDigits(data, i)
	signed := reflect.Int <= f.Kind && f.Kind <= reflect.Int64
	if !ok || (neg && !signed) {
		return 0, false
	}
	if signed {
		limit := uint64(1)<<(f.Bits-1) - 1
		if neg {
			limit++
		}
		if u > limit {
			return 0, false
		}
		n := int64(u)
		if neg {
			n = -n
		}
		fv.SetInt(n)
	} else {
		if f.Bits < 64 && u >= uint64(1)<<f.Bits {
			return 0, false
		}
		fv.SetUint(u)
	}
	return end, true
}

// plainString reads the JSON string at data[i:] when it holds no escape,
// no control character and only valid UTF-8, returning its bytes (not
// copied) and the index after its closing quote.
func plainString(data []byte, i int) (s []byte, next int, ok bool) {
	if i == len(data) || data[i] != '"' {
		return nil, 0, false
	}
	start, ascii := i+1, true
	for j := start; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			s = data[start:j]
			if !ascii && !utf8.Valid(s) {
				return nil, 0, false
			}
			return s, j + 1, true
		case c == '\\' || c < 0x20:
			return nil, 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, 0, false
}

// jsonDigits reads the digits of a JSON integer at data[i:] (a lone 0, or
// digits not starting with 0), returning their value and the index after
// them; ok is false for no digits, a leading zero before a digit, or a
// value above math.MaxUint64. A fraction or exponent after them is left to
// the caller, which refuses it as a delimiter it does not expect.
func jsonDigits(data []byte, i int) (u uint64, end int, ok bool) {
	start := i
	for ; i < len(data) && '0' <= data[i] && data[i] <= '9'; i++ {
		d := uint64(data[i] - '0')
		if u > (math.MaxUint64-d)/10 {
			return 0, 0, false
		}
		u = u*10 + d
	}
	if i == start || (data[start] == '0' && i-start > 1) {
		return 0, 0, false
	}
	return u, i, true
}

// jsonNumberEnd returns the index after the JSON number at data[i:], or i
// when none is there.
func jsonNumberEnd(data []byte, i int) int {
	j := i
	if j < len(data) && data[j] == '-' {
		j++
	}
	d := digitsEnd(data, j)
	if d == j || (data[j] == '0' && d-j > 1) {
		return i
	}
	j = d
	if j < len(data) && data[j] == '.' {
		if d = digitsEnd(data, j+1); d == j+1 {
			return i
		}
		j = d
	}
	if j < len(data) && (data[j] == 'e' || data[j] == 'E') {
		k := j + 1
		if k < len(data) && (data[k] == '+' || data[k] == '-') {
			k++
		}
		if d = digitsEnd(data, k); d == k {
			return i
		}
		j = d
	}
	return j
}

// digitsEnd returns the index of the first byte at or after i that is not
// an ASCII digit.
func digitsEnd(data []byte, i int) int {
	for i < len(data) && '0' <= data[i] && data[i] <= '9' {
		i++
	}
	return i
}

// skipJSONSpace returns the index of the first byte at or after i that is
// not JSON whitespace.
func skipJSONSpace(data []byte, i int) int {
	for i < len(data) {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}
