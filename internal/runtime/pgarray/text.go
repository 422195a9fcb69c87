package pgarray

import (
	"encoding/hex"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"
)

// The text format. pgx sends a parameter in the text format when it does
// not know the parameter's type: always in the exec and simple_protocol
// query exec modes (pgx.QueryExecModeExec, QueryExecModeSimpleProtocol),
// which prepare nothing and so never learn the statement's parameter
// types; those are the modes a transaction-mode pooler needs. There pgx
// looks for the value's type by its Go type, finds none for these named
// slices, and, before it gives up, asks a value for its TextValue; the
// server then reads the array literal as the statement's cast says
// ($1::text[], $1::bytea[]). A known binary type is encoded as before: the
// codecs Register installs, or pgx's array codec, plan those first.

// TextValue returns the array literal of a ({"a","b"}), every element
// quoted, or a NULL text for a nil Text. It is how the array is sent in
// the text format; it cannot fail.
func (a Text) TextValue() (pgtype.Text, error) {
	if a == nil {
		return pgtype.Text{}, nil
	}
	var b strings.Builder
	b.Grow(2 + VarlenSize(a))
	b.WriteByte('{')
	for i, s := range a {
		if i > 0 {
			b.WriteByte(',')
		}
		quote(&b, s)
	}
	b.WriteByte('}')
	return pgtype.Text{String: b.String(), Valid: true}, nil
}

// TextValue returns the array literal of a, an element that is not Valid
// as NULL, or a NULL text for a nil NullText. It cannot fail.
func (a NullText) TextValue() (pgtype.Text, error) {
	if a == nil {
		return pgtype.Text{}, nil
	}
	var b strings.Builder
	b.Grow(2 + NullTextSize(a))
	b.WriteByte('{')
	for i, s := range a {
		if i > 0 {
			b.WriteByte(',')
		}
		if !s.Valid {
			b.WriteString("NULL")
			continue
		}
		quote(&b, s.S)
	}
	b.WriteByte('}')
	return pgtype.Text{String: b.String(), Valid: true}, nil
}

// TextValue returns the array literal of a, each element in bytea's hex
// format ("\\x0102"), a nil element as NULL, or a NULL text for a nil
// Bytea. It cannot fail.
func (a Bytea) TextValue() (pgtype.Text, error) {
	if a == nil {
		return pgtype.Text{}, nil
	}
	n := 2
	for _, e := range a {
		n += 6 + 2*len(e)
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteByte('{')
	var buf []byte
	for i, e := range a {
		if i > 0 {
			b.WriteByte(',')
		}
		if e == nil {
			b.WriteString("NULL")
			continue
		}
		b.WriteString(`"\\x`)
		buf = hex.AppendEncode(buf[:0], e)
		b.Write(buf)
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return pgtype.Text{String: b.String(), Valid: true}, nil
}

// quote writes s as a double-quoted array element, its backslashes and
// double quotes escaped with a backslash.
func quote(b *strings.Builder, s string) {
	b.WriteByte('"')
	for {
		i := strings.IndexAny(s, `"\`)
		if i < 0 {
			break
		}
		b.WriteString(s[:i])
		b.WriteByte('\\')
		b.WriteByte(s[i])
		s = s[i+1:]
	}
	b.WriteString(s)
	b.WriteByte('"')
}
