package pgarray_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/exactly-go/exactly/internal/runtime/pgarray"
	"github.com/exactly-go/exactly/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The wire bytes of an argument in pgx's binary format, as pgx would send
// them for a parameter of type oid.
func encode(t *testing.T, m *pgtype.Map, oid uint32, v any) []byte {
	t.Helper()
	buf, err := m.Encode(oid, pgtype.BinaryFormatCode, v, nil)
	if err != nil {
		t.Fatalf("encoding %T: %v", v, err)
	}
	return buf
}

// TestEncodesAsPgxEncodesPlainSlices: each type puts on the wire the bytes
// pgx puts there for the plain slice, NULL array and NULL elements
// included.
func TestEncodesAsPgxEncodesPlainSlices(t *testing.T) {
	m := pgtype.NewMap()
	texts := [][]string{nil, {}, {"a"}, {"", "ключ", "with,comma", "x\"y"}}
	for _, s := range texts {
		want, got := encode(t, m, pgtype.TextArrayOID, s), encode(t, m, pgtype.TextArrayOID, pgarray.Text(s))
		if !bytes.Equal(got, want) || (got == nil) != (want == nil) {
			t.Errorf("Text(%q) encodes as %x, want %x (pgx's []string)", s, got, want)
		}
	}
	str := func(s string) *string { return &s }
	nullTexts := [][]*string{nil, {}, {nil}, {str(""), nil, str("{\"k\":1}"), str("ключ")}}
	for _, s := range nullTexts {
		var ours pgarray.NullText
		if s != nil {
			ours = make(pgarray.NullText, len(s))
			for i, p := range s {
				if p != nil {
					ours[i] = pgarray.NullString{S: *p, Valid: true}
				}
			}
		}
		want, got := encode(t, m, pgtype.TextArrayOID, s), encode(t, m, pgtype.TextArrayOID, ours)
		if !bytes.Equal(got, want) || (got == nil) != (want == nil) {
			t.Errorf("NullText(%v) encodes as %x, want %x (pgx's []*string)", ours, got, want)
		}
	}
	byteas := [][][]byte{nil, {}, {nil}, {{}, nil, []byte("k"), {0, 1, 2, 255}}}
	for _, s := range byteas {
		want, got := encode(t, m, pgtype.ByteaArrayOID, s), encode(t, m, pgtype.ByteaArrayOID, pgarray.Bytea(s))
		if !bytes.Equal(got, want) || (got == nil) != (want == nil) {
			t.Errorf("Bytea(%q) encodes as %x, want %x (pgx's [][]byte)", s, got, want)
		}
	}
}

// TestServerReadsTheArrays sends each type to PostgreSQL and reads the
// elements back: order, empty and NULL elements, and a NULL array.
func TestServerReadsTheArrays(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	var texts []string
	var n int
	err := pool.QueryRow(ctx, `select $1::text[], cardinality($1::text[])`, pgarray.Text{"b", "", "a"}).Scan(&texts, &n)
	if err != nil {
		t.Fatal(err)
	}
	if len(texts) != 3 || texts[0] != "b" || texts[1] != "" || texts[2] != "a" || n != 3 {
		t.Errorf("text[] read back as %q (cardinality %d), want [b  a] (3)", texts, n)
	}
	var nulls, empties int
	var whole []byte
	err = pool.QueryRow(ctx, `select count(*) filter (where e is null), count(*) filter (where e = ''::bytea), string_agg(e, '\x2c'::bytea order by i)
from unnest($1::bytea[]) with ordinality as u(e, i)`, pgarray.Bytea{nil, {}, []byte("x"), []byte("yz")}).Scan(&nulls, &empties, &whole)
	if err != nil {
		t.Fatal(err)
	}
	if nulls != 1 || empties != 1 || string(whole) != ",x,yz" {
		t.Errorf("bytea[] read back with %d NULL and %d empty elements, joined %q; want 1, 1 and \",x,yz\"", nulls, empties, whole)
	}
	var isNull bool
	if err := pool.QueryRow(ctx, `select $1::text[] is null and $2::bytea[] is null and $3::text[] is null`, pgarray.Text(nil), pgarray.Bytea(nil), pgarray.NullText(nil)).Scan(&isNull); err != nil {
		t.Fatal(err)
	}
	if !isNull {
		t.Error("a nil Text, Bytea or NullText did not arrive as a NULL array")
	}
	var shape string
	err = pool.QueryRow(ctx, `select string_agg(coalesce(e, '<null>'), ',' order by i) from unnest($1::text[]) with ordinality as u(e, i)`,
		pgarray.NullText{{S: "a", Valid: true}, {}, {S: "", Valid: true}, {S: "ignored"}}).Scan(&shape)
	if err != nil {
		t.Fatal(err)
	}
	if shape != "a,<null>,,<null>" {
		t.Errorf("NullText read back as %q, want \"a,<null>,,<null>\" (an invalid element is NULL whatever its string)", shape)
	}
}

// TestEncodingDoesNotBoxElements: the types exist to save an allocation per
// element. Encoding 100 elements allocates a constant few times (the
// dimensions), where pgx's plain slices allocate once per element.
func TestEncodingDoesNotBoxElements(t *testing.T) {
	m := pgtype.NewMap()
	texts, byteas := make([]string, 100), make([][]byte, 100)
	ptrs, nulls := make([]*string, 100), make(pgarray.NullText, 100)
	for i := range texts {
		texts[i], byteas[i] = "key", []byte("value")
		if i%2 == 0 {
			ptrs[i], nulls[i] = &texts[i], pgarray.NullString{S: texts[i], Valid: true}
		}
	}
	buf := make([]byte, 0, 8192)
	allocs := func(oid uint32, v any) float64 {
		return testing.AllocsPerRun(50, func() {
			if _, err := m.Encode(oid, pgtype.BinaryFormatCode, v, buf[:0]); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, c := range []struct {
		name        string
		oid         uint32
		plain, ours any
	}{
		{"Text", pgtype.TextArrayOID, texts, pgarray.Text(texts)},
		{"Bytea", pgtype.ByteaArrayOID, byteas, pgarray.Bytea(byteas)},
		{"NullText", pgtype.TextArrayOID, ptrs, nulls},
	} {
		plain, ours := allocs(c.oid, c.plain), allocs(c.oid, c.ours)
		if ours > 5 || plain < 50 {
			t.Errorf("%s: %v allocations to encode 100 elements (pgx's plain slice: %v); want at most 5 and the plain slice at least 50", c.name, ours, plain)
		}
	}
}

// Once sends a repeated value once, and anything else whole.
func TestOnce(t *testing.T) {
	cases := []struct{ in, want []int32 }{
		{nil, nil},
		{[]int32{}, []int32{}},
		{[]int32{7}, []int32{7}},
		{[]int32{7, 7, 7}, []int32{7}},
		{[]int32{7, 7, 8}, []int32{7, 7, 8}},
		{[]int32{8, 7, 7}, []int32{8, 7, 7}},
	}
	for _, c := range cases {
		got := pgarray.Once(c.in)
		if len(got) != len(c.want) || (got == nil) != (c.want == nil) {
			t.Errorf("Once(%v) = %v, want %v", c.in, got, c.want)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("Once(%v) = %v, want %v", c.in, got, c.want)
			}
		}
	}
	if got := pgarray.Once(pgarray.Text{"t", "t"}); len(got) != 1 || got[0] != "t" {
		t.Errorf(`Once(Text{"t", "t"}) = %v, want [t]`, got)
	}
}
