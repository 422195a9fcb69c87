package pgarray

import "github.com/jackc/pgx/v5/pgtype"

// Text is a []string that pgx encodes as a one-dimensional text array
// (a parameter typed text[]) without boxing its elements. A nil Text is a
// NULL array; an element is never NULL. Encoding fails only as pgx's text
// encoding of the same strings does (a parameter of another type).
type Text []string

// textElem is an element of a Text.
type textElem string

// TextValue returns the element as a non-NULL text.
func (e *textElem) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*e), Valid: true}, nil
}

// Dimensions returns the array's one dimension, or nil for a nil slice (a
// NULL array).
func (a Text) Dimensions() []pgtype.ArrayDimension { return dims(a == nil, len(a)) }

// Index returns a pointer to element i.
func (a Text) Index(i int) any { return (*textElem)(&a[i]) }

// IndexType returns the type Index returns, for pgx's encode plan.
func (a Text) IndexType() any { return new(textElem) }

// Bytea is a [][]byte that pgx encodes as a one-dimensional bytea array
// (a parameter typed bytea[]) without boxing its elements. A nil Bytea is
// a NULL array, and a nil element is a NULL element (an empty, non-nil
// one is an empty bytea), as pgx encodes a [][]byte. Encoding fails only
// as pgx's encoding of the same slices does.
type Bytea [][]byte

// byteaElem is an element of a Bytea.
type byteaElem []byte

// BytesValue returns the element's bytes; nil encodes as NULL.
func (e *byteaElem) BytesValue() ([]byte, error) { return []byte(*e), nil }

// Dimensions returns the array's one dimension, or nil for a nil slice (a
// NULL array).
func (a Bytea) Dimensions() []pgtype.ArrayDimension { return dims(a == nil, len(a)) }

// Index returns a pointer to element i.
func (a Bytea) Index(i int) any { return (*byteaElem)(&a[i]) }

// IndexType returns the type Index returns, for pgx's encode plan.
func (a Bytea) IndexType() any { return new(byteaElem) }

// NullText is a text array whose elements may be NULL, encoded as
// NullText's own elements say, without boxing them: it stands for a
// []*string without a pointer (and an allocation) per element. A nil
// NullText is a NULL array. Encoding fails only as pgx's text encoding of
// the same strings does.
type NullText []NullString

// NullString is an element of a NullText: S when Valid, NULL otherwise.
type NullString struct {
	S     string
	Valid bool
}

// TextValue returns the element as a text, NULL unless Valid.
func (e *NullString) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: e.S, Valid: e.Valid}, nil
}

// Dimensions returns the array's one dimension, or nil for a nil slice (a
// NULL array).
func (a NullText) Dimensions() []pgtype.ArrayDimension { return dims(a == nil, len(a)) }

// Index returns a pointer to element i.
func (a NullText) Index(i int) any { return &a[i] }

// IndexType returns the type Index returns, for pgx's encode plan.
func (a NullText) IndexType() any { return new(NullString) }

// Once returns s, or its first element alone when every element is the
// same: a statement that reads the padding nulls unnest adds to a shorter
// array as that element is sent the repeated value once.
func Once[S ~[]E, E comparable](s S) S {
	for _, v := range s {
		if v != s[0] {
			return s
		}
	}
	return s[:min(len(s), 1)]
}

// dims returns the dimensions of a one-dimensional array of n elements, or
// nil for a NULL array.
func dims(null bool, n int) []pgtype.ArrayDimension {
	if null {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(n), LowerBound: 1}}
}
