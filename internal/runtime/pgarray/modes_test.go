package pgarray_test

import (
	"bytes"
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/exactly-go/exactly/internal/runtime/pgarray"
	"github.com/exactly-go/exactly/internal/testenv"
)

// execModes are pgx's query exec modes, by the name default_query_exec_mode
// takes in a URL.
var execModes = map[string]pgx.QueryExecMode{
	"cache_statement": pgx.QueryExecModeCacheStatement,
	"cache_describe":  pgx.QueryExecModeCacheDescribe,
	"describe_exec":   pgx.QueryExecModeDescribeExec,
	"exec":            pgx.QueryExecModeExec,
	"simple_protocol": pgx.QueryExecModeSimpleProtocol,
}

// TestEveryExecModeSendsTheArrays: in each of pgx's query exec modes (exec
// and simple_protocol send parameters in the text format, of unknown type)
// the server reads back exactly the elements sent, with the characters an
// array literal must escape, a "NULL" string that is not NULL, NULL
// elements, every byte value and a NULL array.
func TestEveryExecModeSendsTheArrays(t *testing.T) {
	url := testenv.DBURL(t)
	texts := pgarray.Text{"", "a", `x"y`, `back\slash`, "with,comma", "{braces}", "NULL", " spaced ", "ключ", "'quote'"}
	allBytes := make([]byte, 256)
	for i := range allBytes {
		allBytes[i] = byte(i)
	}
	byteas := pgarray.Bytea{nil, {}, []byte(`\x00"`), allBytes}
	nulls := pgarray.NullText{{S: "NULL", Valid: true}, {}, {S: `"\`, Valid: true}, {S: "", Valid: true}}
	for name, mode := range execModes {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			cfg, err := pgx.ParseConfig(url)
			if err != nil {
				t.Fatal(err)
			}
			cfg.DefaultQueryExecMode = mode
			conn, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			for _, use := range []bool{false, true} {
				if use {
					pgarray.Use(conn) // the codecs the consumer's connections run with
				}
				var gotTexts []string
				var gotNulls []*string
				var gotByteas [][]byte
				err := conn.QueryRow(ctx, `select $1::text[], $2::text[], $3::bytea[]`, texts, nulls, byteas).Scan(&gotTexts, &gotNulls, &gotByteas)
				if err != nil {
					t.Fatalf("Use %v: sending the arrays: %v", use, err)
				}
				if !slices.Equal(gotTexts, texts) {
					t.Errorf("Use %v: Text read back as %q, want %q", use, gotTexts, texts)
				}
				if len(gotNulls) != len(nulls) {
					t.Fatalf("Use %v: NullText read back with %d elements, want %d", use, len(gotNulls), len(nulls))
				}
				for i, n := range nulls {
					if (gotNulls[i] != nil) != n.Valid || (n.Valid && *gotNulls[i] != n.S) {
						t.Errorf("Use %v: NullText element %d read back as %v, want %+v", use, i, gotNulls[i], n)
					}
				}
				if len(gotByteas) != len(byteas) {
					t.Fatalf("Use %v: Bytea read back with %d elements, want %d", use, len(gotByteas), len(byteas))
				}
				for i, b := range byteas {
					if (gotByteas[i] == nil) != (b == nil) || !bytes.Equal(gotByteas[i], b) {
						t.Errorf("Use %v: Bytea element %d read back as %x, want %x", use, i, gotByteas[i], b)
					}
				}
				var null bool
				err = conn.QueryRow(ctx, `select $1::text[] is null and $2::bytea[] is null and $3::text[] is null`,
					pgarray.Text(nil), pgarray.Bytea(nil), pgarray.NullText(nil)).Scan(&null)
				if err != nil || !null {
					t.Errorf("Use %v: nil arrays: NULL %v, err %v; want NULL arrays", use, null, err)
				}
			}
		})
	}
}

// The text format, which pgx asks for when it does not know the type:
// exactly the literal PostgreSQL reads.
func TestTextValue(t *testing.T) {
	m := pgtype.NewMap()
	for _, c := range []struct {
		v    any
		want string
	}{
		{pgarray.Text{}, `{}`},
		{pgarray.Text{`a"b\c`, ""}, `{"a\"b\\c",""}`},
		{pgarray.NullText{{S: "NULL", Valid: true}, {}}, `{"NULL",NULL}`},
		{pgarray.Bytea{{0xde, 0xad}, nil, {}}, `{"\\xdead",NULL,"\\x"}`},
	} {
		got, err := m.Encode(0, pgtype.TextFormatCode, c.v, nil)
		if err != nil || string(got) != c.want {
			t.Errorf("%#v in the text format: %q, %v; want %q", c.v, got, err, c.want)
		}
	}
	for _, v := range []any{pgarray.Text(nil), pgarray.Bytea(nil), pgarray.NullText(nil)} {
		if got, err := m.Encode(0, pgtype.TextFormatCode, v, nil); got != nil || err != nil {
			t.Errorf("a nil %T in the text format: %q, %v; want NULL", v, got, err)
		}
	}
}
