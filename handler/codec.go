package handler

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"

	jsonv2 "github.com/go-json-experiment/json"
	jsonv1 "github.com/go-json-experiment/json/v1"
)

// Codec turns record values into payloads and payloads into record values.
// Implementations must be safe for concurrent use.
type Codec interface {
	// Name identifies the codec in logs and dead-letter headers.
	Name() string
	// Unmarshal decodes data into v, a pointer to the payload type. It
	// returns an error describing what was wrong with data (the record is
	// dead-lettered), or an [*UnavailableError] when a service it reads
	// from did not answer (the record is retried until it does).
	Unmarshal(data []byte, v any) error
	// Marshal encodes v. It returns an error when v cannot be encoded.
	Marshal(v any) ([]byte, error)
}

// JSON is the default codec: encoding/json. With DisallowUnknownFields, a
// payload carrying a field the type does not have fails to decode (and goes
// to the dead-letter topic) instead of being silently accepted.
//
// A handler whose codec is a JSON decodes its records with faster
// implementations of the same rules first, and with Unmarshal only the
// records they refuse: the values a handler gets are encoding/json's, and
// a record that cannot be decoded fails with Unmarshal's error. A payload
// that is a flat struct (strings, booleans and numbers, no field that
// decodes itself) is read by a single scan when the record is plain (one
// object of its fields' exact names, strings without escapes), and
// otherwise, as other payloads are, by encoding/json/v2's code (from
// github.com/go-json-experiment/json, set to encoding/json's options). A
// payload type holding an encoding/json.Number, which that implementation
// does not know, decodes with Unmarshal alone. A refused record's
// UnmarshalJSON methods (the payload's own) may run twice.
type JSON struct {
	DisallowUnknownFields bool
}

// Name returns "json".
func (JSON) Name() string { return "json" }

// Unmarshal decodes one JSON value into v. Trailing data after the value is
// an error, as is a JSON null: a command that decodes to nothing is not a
// command.
func (c JSON) Unmarshal(data []byte, v any) error {
	if err := checkJSONValue(data); err != nil {
		return err
	}
	if !c.DisallowUnknownFields {
		// json.Unmarshal checks the whole input is one value before
		// decoding, and costs about half of a Decoder. A syntax error
		// (trailing data included) leaves v untouched: the Decoder below
		// then says what was wrong, as it always did.
		err := json.Unmarshal(data, v)
		if _, syntax := err.(*json.SyntaxError); !syntax {
			if err != nil {
				return fmt.Errorf("decoding json: %w", err)
			}
			return nil
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if c.DisallowUnknownFields {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding json: %w", err)
	}
	// Anything but whitespace after the value (dec.More would let a
	// closing '}' or ']' through).
	if len(bytes.TrimSpace(data[dec.InputOffset():])) > 0 {
		return fmt.Errorf("decoding json: trailing data after the value")
	}
	return nil
}

// Marshal encodes v as JSON.
func (JSON) Marshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding json: %w", err)
	}
	return b, nil
}

// checkJSONValue refuses an empty value and a JSON null.
func checkJSONValue(data []byte) error {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return fmt.Errorf("decoding json: empty value")
	}
	if string(trimmed) == "null" {
		return fmt.Errorf("decoding json: value is null")
	}
	return nil
}

// fastJSON decodes records for one handler whose codec is a [JSON] with
// the encoding/json/v2 implementation (github.com/go-json-experiment/json,
// which mirrors the standard library's and becomes it from Go 1.27) set to
// encoding/json's semantics (its v1 options: field names matched without
// regard to case, duplicate names allowed, invalid UTF-8 replaced, …). It
// decodes a small payload about three times as fast as encoding/json,
// allocating only what the value holds. A record it refuses is decoded
// again by [JSON.Unmarshal], which decides, and whose error says what was
// wrong as it always did: the fast path only ever accepts what encoding/json
// accepts, with the same value (TestFastJSONDecodesLikeEncodingJSON and
// FuzzFastJSONDecodesLikeEncodingJSON).
type fastJSON struct {
	codec JSON
	opts  jsonv2.Options
	// flat, when the payload is a flat struct (newFlatJSON), decodes the
	// plain inputs before the v2 code is asked.
	flat *flatJSON
}

// newFastJSON returns the fast path for values of type t, or nil when t
// holds an encoding/json.Number anywhere: the v2 code does not know that
// type, and accepts into it strings that encoding/json refuses.
func newFastJSON(codec JSON, t reflect.Type) *fastJSON {
	if holdsJSONNumber(t, map[reflect.Type]bool{}) {
		return nil
	}
	opts := jsonv1.DefaultOptionsV1()
	if codec.DisallowUnknownFields {
		opts = jsonv2.JoinOptions(opts, jsonv2.RejectUnknownMembers(true))
	}
	return &fastJSON{codec: codec, opts: opts, flat: newFlatJSON(t)}
}

// decode decodes data, one JSON value, into v, reporting whether it did:
// false (a refusal, or a panic of the fast path) leaves v in any state,
// and the caller decodes again with JSON.Unmarshal.
func (f *fastJSON) decode(data []byte, v any) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false // JSON.Unmarshal decides, panicking or not as it would
		}
	}()
	if f.flat != nil && f.flat.decode(data, v) {
		return true // a refusal leaves v zero for the v2 code
	}
	if checkJSONValue(data) != nil {
		return false
	}
	return jsonv2.Unmarshal(data, v, f.opts) == nil
}

// jsonNumber is encoding/json's Number type.
var jsonNumber = reflect.TypeFor[json.Number]()

// holdsJSONNumber reports whether a value of type t can hold an
// encoding/json.Number (in a field, element, key or pointee); seen guards
// against recursive types.
func holdsJSONNumber(t reflect.Type, seen map[reflect.Type]bool) bool {
	if t == jsonNumber {
		return true
	}
	if seen[t] {
		return false
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return holdsJSONNumber(t.Elem(), seen)
	case reflect.Map:
		return holdsJSONNumber(t.Key(), seen) || holdsJSONNumber(t.Elem(), seen)
	case reflect.Struct:
		for i := range t.NumField() {
			if holdsJSONNumber(t.Field(i).Type, seen) {
				return true
			}
		}
	}
	return false
}
