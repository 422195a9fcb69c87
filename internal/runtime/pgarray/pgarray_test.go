package pgarray_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/exactly-go/exactly/internal/runtime/pgarray"
	"github.com/exactly-go/exactly/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The wire bytes of an argument in pgx's binary format, as pgx would send
// them for a parameter of type oid.
// Each is appended to a buffer that already holds a previous argument,
// which must stay as it was.
func encode(t *testing.T, m *pgtype.Map, oid uint32, v any) []byte {
	t.Helper()
	const prev = "previous"
	buf, err := m.Encode(oid, pgtype.BinaryFormatCode, v, append(make([]byte, 0, 10), prev...))
	if err != nil {
		t.Fatalf("encoding %T: %v", v, err)
	}
	if buf == nil {
		return nil
	}
	if string(buf[:len(prev)]) != prev {
		t.Fatalf("encoding %T changed the previous argument to %q", v, buf[:len(prev)])
	}
	return buf[len(prev):]
}

// maps are the type maps the types encode with: pgx's own, and one with
// the package's codecs registered.
func maps() map[string]*pgtype.Map {
	registered := pgtype.NewMap()
	pgarray.Register(registered)
	pgarray.Register(registered) // a second time changes nothing
	return map[string]*pgtype.Map{"pgx's codecs": pgtype.NewMap(), "registered": registered}
}

// TestEncodesAsPgxEncodesPlainSlices: each type puts on the wire the bytes
// pgx puts there for the plain slice, NULL array and NULL elements
// included, with pgx's codecs and with the package's registered.
func TestEncodesAsPgxEncodesPlainSlices(t *testing.T) {
	for name, m := range maps() {
		t.Run(name, func(t *testing.T) { encodesAsPlainSlices(t, m) })
	}
}

func encodesAsPlainSlices(t *testing.T, ours *pgtype.Map) {
	m := pgtype.NewMap()
	texts := [][]string{nil, {}, {"a"}, {"", "ключ", "with,comma", "x\"y"}}
	for _, s := range texts {
		want, got := encode(t, m, pgtype.TextArrayOID, s), encode(t, ours, pgtype.TextArrayOID, pgarray.Text(s))
		if !bytes.Equal(got, want) || (got == nil) != (want == nil) {
			t.Errorf("Text(%q) encodes as %x, want %x (pgx's []string)", s, got, want)
		}
		if plain := encode(t, ours, pgtype.TextArrayOID, s); !bytes.Equal(plain, want) || (plain == nil) != (want == nil) {
			t.Errorf("the plain %q encodes as %x, want %x as with pgx's codecs", s, plain, want)
		}
	}
	str := func(s string) *string { return &s }
	nullTexts := [][]*string{nil, {}, {nil}, {str(""), nil, str("{\"k\":1}"), str("ключ")}}
	for _, s := range nullTexts {
		var nt pgarray.NullText
		if s != nil {
			nt = make(pgarray.NullText, len(s))
			for i, p := range s {
				if p != nil {
					nt[i] = pgarray.NullString{S: *p, Valid: true}
				}
			}
		}
		want, got := encode(t, m, pgtype.TextArrayOID, s), encode(t, ours, pgtype.TextArrayOID, nt)
		if !bytes.Equal(got, want) || (got == nil) != (want == nil) {
			t.Errorf("NullText(%v) encodes as %x, want %x (pgx's []*string)", nt, got, want)
		}
	}
	byteas := [][][]byte{nil, {}, {nil}, {{}, nil, []byte("k"), {0, 1, 2, 255}}}
	for _, s := range byteas {
		want, got := encode(t, m, pgtype.ByteaArrayOID, s), encode(t, ours, pgtype.ByteaArrayOID, pgarray.Bytea(s))
		if !bytes.Equal(got, want) || (got == nil) != (want == nil) {
			t.Errorf("Bytea(%q) encodes as %x, want %x (pgx's [][]byte)", s, got, want)
		}
	}
}

// TestServerReadsTheArrays sends each type to PostgreSQL and reads the
// elements back: order, empty and NULL elements, and a NULL array; through
// pgx's codecs, and through a connection that Use readied.
func TestServerReadsTheArrays(t *testing.T) {
	ctx := context.Background()
	pool := testenv.DB(t)
	t.Run("pgx's codecs", func(t *testing.T) { serverReads(t, pool) })
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	pgarray.Use(conn.Conn())
	if _, ok := conn.Conn().PgConn().CustomData()["exactly.pgarray"]; !ok {
		t.Error("Use left no mark on the connection")
	}
	pgarray.Use(conn.Conn())
	t.Run("Use", func(t *testing.T) { serverReads(t, conn) })
}

// serverReads is TestServerReadsTheArrays through q.
func serverReads(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) {
	ctx := context.Background()
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

// TestRegisteredGrowsTheBufferOnce: with the package's codecs registered, a
// 100-element array appended to pgx's 256-byte parameter buffer allocates
// once, where pgx's codec grows the buffer step by step.
func TestRegisteredGrowsTheBufferOnce(t *testing.T) {
	registered := pgtype.NewMap()
	pgarray.Register(registered)
	keys, values := make(pgarray.Text, 100), make(pgarray.Bytea, 100)
	nulls := make(pgarray.NullText, 100)
	for i := range keys {
		keys[i], values[i] = "order-0000001234", []byte(`{"order_id":"order-0000001234","account":42,"amount":1250}`)
		nulls[i] = pgarray.NullString{S: keys[i], Valid: i%3 > 0}
	}
	for _, c := range []struct {
		name string
		oid  uint32
		v    any
	}{{"Text", pgtype.TextArrayOID, keys}, {"Bytea", pgtype.ByteaArrayOID, values}, {"NullText", pgtype.TextArrayOID, nulls}} {
		allocs := func(m *pgtype.Map) float64 {
			return testing.AllocsPerRun(50, func() {
				if _, err := m.Encode(c.oid, pgtype.BinaryFormatCode, c.v, make([]byte, 0, 256)); err != nil {
					t.Fatal(err)
				}
			})
		}
		// The 256 bytes are allocated by the test, once per run.
		if got, theirs := allocs(registered)-1, allocs(pgtype.NewMap())-1; got != 1 || theirs < 3 {
			t.Errorf("%s: %v allocations with the package's codecs, %v with pgx's; want 1 and at least 3", c.name, got, theirs)
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
