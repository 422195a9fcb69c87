package schemaregistry

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/twmb/franz-go/pkg/sr"
)

// The Confluent wire format: a magic byte 0, the schema id as a 4-byte
// big-endian integer, for Protobuf the message indexes (zig-zag varints),
// then the body in the schema's format.

// Frame is a record value split at its Confluent header.
type Frame struct {
	// ID is the schema id the producer wrote.
	ID int
	// Body is the value after the header (for Protobuf, after the
	// message indexes, which Index holds).
	Body []byte
}

// Split reads the header of data. It fails with a [*SchemaError] when data
// is shorter than the header or does not start with the magic byte 0 (a
// value not written by a Schema Registry serializer: bare JSON, say).
func Split(data []byte) (Frame, error) {
	if len(data) < 5 {
		return Frame{}, &SchemaError{Err: fmt.Errorf("value of %d bytes is shorter than the Confluent wire format's 5-byte header", len(data))}
	}
	if data[0] != 0 {
		return Frame{}, &SchemaError{Err: fmt.Errorf("value is not in the Confluent wire format: first byte 0x%02x, want the magic byte 0x00", data[0])}
	}
	id := binary.BigEndian.Uint32(data[1:5])
	if id > math.MaxInt32 {
		// The registry's ids are signed 32-bit: no registry holds this
		// one, and asking it would read as an outage for ever.
		return Frame{}, &SchemaError{ID: int(id), Err: fmt.Errorf("schema id %d is past the registry's largest (%d): %w", id, math.MaxInt32, ErrUnknownSchema)}
	}
	return Frame{ID: int(id), Body: data[5:]}, nil
}

// SplitIndex reads the Protobuf message indexes at the start of f.Body:
// the path of the message type in its schema ([0] for the first top-level
// message), and returns them with the body after them. It fails when they
// are malformed.
func SplitIndex(f Frame) ([]int, []byte, error) {
	var h sr.ConfluentHeader
	idx, rest, err := h.DecodeIndex(f.Body, 64)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the protobuf message indexes: %w", err)
	}
	return idx, rest, nil
}

// AppendHeader appends the Confluent header for schema id, with the
// Protobuf message indexes index when not nil, to b.
func AppendHeader(b []byte, id int, index []int) []byte {
	b = append(b, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(id))
	if index == nil {
		return b
	}
	if len(index) == 1 && index[0] == 0 {
		return append(b, 0) // the common case: a zero-length list
	}
	b = binary.AppendVarint(b, int64(len(index)))
	for _, i := range index {
		b = binary.AppendVarint(b, int64(i))
	}
	return b
}

// Decode reads the header of data and looks its schema up: the frame and
// the schema, or the errors of [Split] and [Registry.Lookup].
func (r *Registry) Decode(ctx context.Context, data []byte) (Frame, *Schema, error) {
	f, err := Split(data)
	if err != nil {
		return Frame{}, nil, err
	}
	s, err := r.Lookup(ctx, f.ID)
	if err != nil {
		return Frame{}, nil, err
	}
	return f, s, nil
}
