// Package sendbuf sizes a pgx connection's send buffer for a pipeline
// before pgx encodes it.
//
// pgx encodes the messages of a pipeline (pgx.Conn.SendBatch) by appending
// them to its connection's send buffer, which it cuts back to 1 KiB after
// every write. A pipeline of tens of kilobytes (a batch's queued
// statements and outbox rows) therefore grows the buffer again step by
// step each time, allocating about four times its size in buffers that are
// garbage at once. Reserve grows it once, to Size's estimate of the
// pipeline, before SendBatch encodes it: the messages and the bytes on the
// wire are pgx's own, only the buffer they are written into is allocated
// once, and kept with the connection (pgconn.PgConn.CustomData) for its
// next pipelines.
package sendbuf

import (
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/exactly-go/exactly/internal/runtime/pgarray"
)

// minReserve is the size below which Reserve does nothing: pgx's buffer
// starts at 1 KiB and is kept at that size between writes.
const minReserve = 1024

// Reserve makes room for n more bytes in conn's send buffer, so that the
// next messages, up to n bytes of them, are encoded without growing it
// again. It sends no bytes: it gives the connection's pgproto3.Frontend a
// message that encodes as nothing (a Frontend tracing its messages logs it
// as an unknown message of length 0). conn must be idle and owned by the
// caller, as for any use of it. Reserve cannot fail.
//
// The buffer it grows is kept in conn's CustomData (up to maxKept bytes)
// and given to conn's Frontend again by its next reservations: pgx drops
// a buffer after writing it (or keeps using it, when it wrote at most 1
// KiB), and never hands it to another connection, so only conn's messages
// are ever encoded into it, one pipeline at a time.
func Reserve(conn *pgconn.PgConn, n int) {
	if n < minReserve {
		return
	}
	conn.Frontend().Send(&grow{n: n, conn: conn})
}

// maxKept bounds the buffer Reserve keeps with a connection: a larger
// pipeline gets a buffer of its own, garbage once written.
const maxKept = 1 << 20

// keptKey is the key of the kept buffer in a connection's CustomData.
const keptKey = "exactly.sendbuf"

// grow is a frontend message that encodes as no bytes, growing the buffer
// it is appended to by n bytes into conn's kept buffer.
type grow struct {
	n    int
	conn *pgconn.PgConn
}

// Frontend marks grow as a frontend message.
func (*grow) Frontend() {}

// Encode returns dst with room for g.n more bytes, and no more bytes in
// it: dst itself when it has the room, else dst's bytes copied into the
// connection's kept buffer (or a larger one, kept in its place). The kept
// buffer may be dst itself (pgx kept it), in which case the copy moves
// nothing.
func (g *grow) Encode(dst []byte) ([]byte, error) {
	need := len(dst) + g.n
	if cap(dst) >= need {
		return dst, nil
	}
	data := g.conn.CustomData()
	kept, _ := data[keptKey].([]byte)
	if cap(kept) < need {
		kept = make([]byte, 0, need)
		if need <= maxKept {
			data[keptKey] = kept
		}
	}
	return append(kept[:0], dst...), nil
}

// Decode refuses: grow is never received.
func (grow) Decode([]byte) error {
	return errors.New("sendbuf: decoding a buffer reservation, which is never received")
}

var _ pgproto3.FrontendMessage = (*grow)(nil)

// Per-message sizes of pgx's extended protocol (cached statements): a
// Bind with its statement's cached name ("stmtcache_" and 48 hex digits)
// and one format code per parameter, the Describe pgx sends for a
// statement that returns no rows, and an Execute.
const (
	bindFixed     = 1 + 4 + 1 + (10 + 48 + 1) + 2 + 2 + 2
	perParam      = 2 + 4
	describeBytes = 1 + 4 + 1 + 1
	executeBytes  = 1 + 4 + 1 + 4
	syncBytes     = 1 + 4
	// arrayHeader is a one-dimensional array's header: dimensions, flags,
	// element type, length and lower bound.
	arrayHeader = pgarray.HeaderSize
	// unknownArg is the estimate of an argument of another type.
	unknownArg = 16
)

// Size estimates the bytes pgx sends for b: its messages as pgx encodes
// them when every statement is already prepared and cached (the
// connection's default mode), and the Sync that ends the pipeline. An
// argument of a type it does not know counts a few bytes: the buffer then
// grows from the estimate, as it would have without one.
func Size(b *pgx.Batch) int {
	n := syncBytes
	for _, q := range b.QueuedQueries {
		n += bindFixed + describeBytes + executeBytes
		for _, a := range q.Arguments {
			n += perParam + argSize(a)
		}
	}
	return n
}

// argSize estimates the encoded size of one argument.
func argSize(a any) int {
	switch v := a.(type) {
	case nil:
		return 0
	case string:
		return len(v)
	case []byte:
		return len(v)
	case bool, int8, uint8:
		return 1
	case int16, uint16:
		return 2
	case int32, uint32, float32:
		return 4
	case int, int64, uint64, float64:
		return 8
	case pgarray.Text:
		return pgarray.VarlenSize(v)
	case []string:
		return pgarray.VarlenSize(v)
	case pgarray.Bytea:
		return pgarray.VarlenSize(v)
	case [][]byte:
		return pgarray.VarlenSize(v)
	case pgarray.NullText:
		return pgarray.NullTextSize(v)
	case []int32:
		return arrayHeader + 8*len(v)
	case []int64:
		return arrayHeader + 12*len(v)
	case []bool:
		return arrayHeader + 5*len(v)
	}
	return unknownArg
}
