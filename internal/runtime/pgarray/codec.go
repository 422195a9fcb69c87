package pgarray

import (
	"encoding/binary"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// usedKey marks, in a connection's CustomData, that Use has readied its
// type map.
const usedKey = "exactly.pgarray"

// Use readies conn to encode Text, Bytea and NullText arguments in one
// pass into a buffer grown once to their size (Register on its type map,
// pgx.Conn.TypeMap). It does so once per connection (marked in its
// CustomData), so that it costs a map lookup afterwards. conn must be idle
// and owned by the caller, as for any use of it. Use cannot fail.
func Use(conn *pgx.Conn) {
	data := conn.PgConn().CustomData()
	if data[usedKey] != nil {
		return
	}
	data[usedKey] = true
	Register(conn.TypeMap())
}

// Register makes m encode Text, Bytea and NullText values in one pass
// into a buffer grown once to their size. Without it they encode through
// pgx's array codec, element by element: the same bytes, but pgx's
// parameter buffer, cut back to 256 bytes for every statement, then grows
// by doubling, allocating about three times an array's size (a batch's
// outbox values, tens of kilobytes, in every transaction).
//
// Register wraps the codecs m has for text[] and bytea[] in codecs that
// plan this package's types themselves and hand every other value, and
// every decoding, to the wrapped codec: a value of any other type is
// encoded, and every result decoded, exactly as before. Registering again
// changes nothing; a map without those types is left without them. m
// must not be in use by another goroutine. Register cannot fail.
func Register(m *pgtype.Map) {
	for _, oid := range []uint32{pgtype.TextArrayOID, pgtype.ByteaArrayOID} {
		t, ok := m.TypeForOID(oid)
		if !ok {
			continue
		}
		if _, done := t.Codec.(*codec); done {
			continue
		}
		m.RegisterType(&pgtype.Type{Name: t.Name, OID: t.OID, Codec: &codec{Codec: t.Codec, oid: oid}})
	}
}

// codec is a text[] or bytea[] codec that encodes this package's types of
// its element type in binary by itself, and leaves everything else to the
// codec it wraps.
type codec struct {
	pgtype.Codec
	oid uint32
}

// PlanEncode returns this package's plan for a Text or NullText (text[])
// or a Bytea (bytea[]) in binary, else the wrapped codec's plan.
func (c *codec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if format == pgtype.BinaryFormatCode {
		switch value.(type) {
		case Text:
			if c.oid == pgtype.TextArrayOID {
				return textPlan{}
			}
		case NullText:
			if c.oid == pgtype.TextArrayOID {
				return nullTextPlan{}
			}
		case Bytea:
			if c.oid == pgtype.ByteaArrayOID {
				return byteaPlan{}
			}
		}
	}
	return c.Codec.PlanEncode(m, oid, format, value)
}

// textPlan encodes a Text as a binary text[].
type textPlan struct{}

// Encode appends value's binary array to buf, grown once, or returns nil
// (NULL) for a nil Text.
func (textPlan) Encode(value any, buf []byte) ([]byte, error) {
	return encodeText(value.(Text), buf), nil
}

// byteaPlan encodes a Bytea as a binary bytea[].
type byteaPlan struct{}

// Encode appends value's binary array to buf, grown once, or returns nil
// (NULL) for a nil Bytea; a nil element is NULL.
func (byteaPlan) Encode(value any, buf []byte) ([]byte, error) {
	return encodeBytea(value.(Bytea), buf), nil
}

// nullTextPlan encodes a NullText as a binary text[].
type nullTextPlan struct{}

// Encode appends value's binary array to buf, grown once, or returns nil
// (NULL) for a nil NullText; an element that is not Valid is NULL.
func (nullTextPlan) Encode(value any, buf []byte) ([]byte, error) {
	a := value.(NullText)
	if a == nil {
		return nil, nil
	}
	null := slices.ContainsFunc(a, func(s NullString) bool { return !s.Valid })
	buf = appendHeader(growBy(buf, NullTextSize(a)), len(a), null, pgtype.TextOID)
	for _, s := range a {
		if !s.Valid {
			buf = binary.BigEndian.AppendUint32(buf, nullLength)
			continue
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(s.S)))
		buf = append(buf, s.S...)
	}
	return buf, nil
}

// HeaderSize is the size of a one-dimensional array's binary header: the
// number of dimensions, the null flag, the element type, and the
// dimension's length and lower bound.
const HeaderSize = 5 * 4

// VarlenSize returns the size of the binary one-dimensional array of s's
// text or bytea elements, as this package and pgx encode it (a NULL
// element counts its length word alone). It cannot fail.
func VarlenSize[S ~[]E, E ~string | ~[]byte](s S) int {
	n := HeaderSize
	for _, e := range s {
		n += 4 + len(e)
	}
	return n
}

// NullTextSize is VarlenSize for a NullText (an element that is not Valid
// counts its length word alone, whatever its string). It cannot fail.
func NullTextSize(a NullText) int {
	n := HeaderSize
	for _, e := range a {
		if e.Valid {
			n += len(e.S)
		}
		n += 4
	}
	return n
}

// growSlack is the room growBy leaves after an array.
const growSlack = 64

// nullLength is an element's length that marks it NULL.
const nullLength = 0xFFFFFFFF

// encodeText appends the binary text[] of a to buf, or returns nil for a
// nil a.
func encodeText(a Text, buf []byte) []byte {
	if a == nil {
		return nil
	}
	buf = appendHeader(growBy(buf, VarlenSize(a)), len(a), false, pgtype.TextOID)
	for _, s := range a {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(s)))
		buf = append(buf, s...)
	}
	return buf
}

// encodeBytea appends the binary bytea[] of a to buf, a nil element as
// NULL, or returns nil for a nil a.
func encodeBytea(a Bytea, buf []byte) []byte {
	if a == nil {
		return nil
	}
	null := slices.ContainsFunc(a, func(b []byte) bool { return b == nil })
	buf = appendHeader(growBy(buf, VarlenSize(a)), len(a), null, pgtype.ByteaOID)
	for _, b := range a {
		if b == nil {
			buf = binary.BigEndian.AppendUint32(buf, nullLength)
			continue
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(b)))
		buf = append(buf, b...)
	}
	return buf
}

// appendHeader appends the binary header of a one-dimensional array of n
// elements of type elem, with its null flag, as pgx writes it.
func appendHeader(buf []byte, n int, null bool, elem uint32) []byte {
	var flag uint32
	if null {
		flag = 1
	}
	buf = binary.BigEndian.AppendUint32(buf, 1)
	buf = binary.BigEndian.AppendUint32(buf, flag)
	buf = binary.BigEndian.AppendUint32(buf, elem)
	buf = binary.BigEndian.AppendUint32(buf, uint32(n))
	return binary.BigEndian.AppendUint32(buf, 1)
}

// growBy returns buf with room for n more bytes, allocated at most once,
// and growSlack more: room for the small parameters a statement may send
// after an array (a NULL, a one-element array) without growing again.
func growBy(buf []byte, n int) []byte {
	if cap(buf)-len(buf) >= n {
		return buf
	}
	grown := make([]byte, len(buf), len(buf)+n+growSlack)
	copy(grown, buf)
	return grown
}
