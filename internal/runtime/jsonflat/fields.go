package jsonflat

import (
	"encoding/json"
	"reflect"
	"strings"
)

// MaxFields is the most fields a flat struct has: a decoder keeps the
// fields it has seen in one 64-bit mask.
const MaxFields = 64

// Field is one field of a flat struct as encoding/json sees it.
type Field struct {
	// Name is the field's JSON name: its tag's name, or the Go name.
	Name string
	// Index is the field's index in the struct (reflect.Value.Field).
	Index int
	// Kind is the field's kind: string, bool, an int, a uint or a float.
	Kind reflect.Kind
	// Bits is the size of a number's kind in bits (0 for string and bool).
	Bits int
	// OmitEmpty and OmitZero are the tag's omitempty and omitzero options.
	OmitEmpty, OmitZero bool
}

// Fields returns the fields of struct type t as encoding/json encodes and
// decodes them, or nil when t is not flat: not a struct; a field that is
// embedded, or of another kind than string, bool, int, uint (not uintptr)
// or float; an encoding/json.Number (a string written as a number); a field
// or t itself for which codesItself is true; a tag with
// another option than omitempty and omitzero (the `string` option
// included); a name of other characters than ASCII letters, digits and
// underscores; two names equal without regard to case; no field, or more
// than MaxFields. Unexported fields and fields tagged "-" are left out, as
// encoding/json leaves them.
func Fields(t reflect.Type, codesItself func(reflect.Type) bool) []Field {
	if t.Kind() != reflect.Struct || codesItself(t) {
		return nil
	}
	var fields []Field
	for i := range t.NumField() {
		sf := t.Field(i)
		if sf.Anonymous {
			return nil
		}
		tag := sf.Tag.Get("json")
		if !sf.IsExported() || tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		f := Field{Name: name, Index: i, Kind: sf.Type.Kind()}
		for opt := range strings.SplitSeq(opts, ",") {
			switch opt {
			case "":
			case "omitempty":
				f.OmitEmpty = true
			case "omitzero":
				f.OmitZero = true
			default:
				return nil
			}
		}
		if f.Name == "" {
			f.Name = sf.Name
		}
		if !PlainName(f.Name) || codesItself(sf.Type) || sf.Type == numberType {
			return nil
		}
		switch f.Kind {
		case reflect.String, reflect.Bool:
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
			reflect.Float32, reflect.Float64:
			f.Bits = sf.Type.Bits()
		default:
			return nil
		}
		for _, o := range fields {
			if strings.EqualFold(o.Name, f.Name) {
				return nil
			}
		}
		fields = append(fields, f)
	}
	if len(fields) == 0 || len(fields) > MaxFields {
		return nil
	}
	return fields
}

// PlainName reports whether name is made of ASCII letters, digits and
// underscores only (and is not empty): a name JSON writes without escapes,
// and encoding/json takes from a tag as it is.
func PlainName(name string) bool {
	if name == "" {
		return false
	}
	for i := range len(name) {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// numberType is encoding/json's Number: a string kind that encoding/json
// writes and reads as a JSON number.
var numberType = reflect.TypeFor[json.Number]()
