package handler

import (
	"reflect"
	"strings"
	"testing"
)

// A handler's reused JSON Decoders decode as JSON.Unmarshal does, value
// for value and error for error, however the inputs before left the
// Decoder: each input runs, in turn, through one jsonDecoders (after
// values with trailing whitespace, after failures of every kind) and
// through JSON.Unmarshal, and the results must match.
func TestReusedJSONDecodersDecodeLikeUnmarshal(t *testing.T) {
	type payload struct {
		ID     string         `json:"id"`
		Amount int64          `json:"amount"`
		Tags   []string       `json:"tags"`
		Extra  map[string]any `json:"extra"`
	}
	inputs := []string{
		`{"id":"a","amount":5}`,
		"{\"id\":\"b\"}  \n\t ",
		` {"id":"c","tags":["x","y"]}`,
		`{"id":"d","color":"red"}`,
		``, "  \n", ` null `,
		`{"id":"e"} {"id":"f"}`,
		`{"id":"g"}x`, `{"id":"h"}}`, `{"id":"i"} ]`,
		`{"id":"j"`, `{"id":}`, `{"id":"k","amount":"five"}`,
		`{"extra":{"n":1,"m":[1,2]}}`,
		`{"id":"l"}`,
		`"just a string"`, `12`, `[1,2]`,
		`{"id":"m","amount":7}  `,
		`{"id":"` + strings.Repeat("h", 100<<10) + `","amount":8}`, // past maxReusedJSON: not reused
		`{"id":"n"}`,
	}
	for _, strict := range []bool{false, true} {
		codec := JSON{DisallowUnknownFields: strict}
		j := &jsonDecoders{codec: codec}
		for round := range 2 {
			for _, in := range inputs {
				var want, got payload
				wantErr := codec.Unmarshal([]byte(in), &want)
				gotErr := j.unmarshal([]byte(in), &got)
				if (wantErr == nil) != (gotErr == nil) || (wantErr != nil && wantErr.Error() != gotErr.Error()) {
					t.Errorf("strict=%v round %d, %q: error %v, want %v", strict, round, in, gotErr, wantErr)
					continue
				}
				if wantErr == nil && !reflect.DeepEqual(got, want) {
					t.Errorf("strict=%v round %d, %q: %+v, want %+v", strict, round, in, got, want)
				}
			}
		}
	}
}
