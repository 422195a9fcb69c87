package handler

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"
)

// Codec turns record values into payloads and payloads into record values.
// Implementations must be safe for concurrent use.
type Codec interface {
	// Name identifies the codec in logs and dead-letter headers.
	Name() string
	// Unmarshal decodes data into v, a pointer to the payload type. It
	// returns an error describing what was wrong with data.
	Unmarshal(data []byte, v any) error
	// Marshal encodes v. It returns an error when v cannot be encoded.
	Marshal(v any) ([]byte, error)
}

// JSON is the default codec: encoding/json. With DisallowUnknownFields, a
// payload carrying a field the type does not have fails to decode (and goes
// to the dead-letter topic) instead of being silently accepted.
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

// jsonDecoders decodes records for one handler whose codec is a [JSON],
// as [JSON.Unmarshal] does, with reused encoding/json Decoders:
// json.Unmarshal allocates its decoding state on every call, a reused
// Decoder only what it decodes.
type jsonDecoders struct {
	codec JSON
	pool  sync.Pool // of *reusedDecoder
}

// reusedDecoder is a Decoder fed one record value after another through r;
// fed counts the bytes it was fed.
type reusedDecoder struct {
	r   bytes.Reader
	dec *json.Decoder
	fed int64
}

// unmarshal decodes one JSON value into v and fails like JSON.Unmarshal.
// A Decoder that failed is dropped, not reused.
func (j *jsonDecoders) unmarshal(data []byte, v any) error {
	if err := checkJSONValue(data); err != nil {
		return err
	}
	d, _ := j.pool.Get().(*reusedDecoder)
	if d == nil {
		d = &reusedDecoder{}
		d.dec = json.NewDecoder(&d.r)
		if j.codec.DisallowUnknownFields {
			d.dec.DisallowUnknownFields()
		}
	}
	d.r.Reset(data)
	d.fed += int64(len(data))
	if err := d.dec.Decode(v); err != nil {
		return fmt.Errorf("decoding json: %w", err)
	}
	// What the Decoder has not consumed of data: anything but whitespace
	// is trailing data (the earlier values' leftovers were whitespace).
	if rest := d.fed - d.dec.InputOffset(); rest > 0 && len(bytes.TrimSpace(data[int64(len(data))-rest:])) > 0 {
		return fmt.Errorf("decoding json: trailing data after the value")
	}
	if len(data) <= maxReusedJSON {
		j.pool.Put(d) // a huge record's buffer is not kept for the next
	}
	return nil
}

// maxReusedJSON is the largest record value after which a Decoder is
// reused: its buffer grows to the value's size and would stay with it.
const maxReusedJSON = 64 << 10
