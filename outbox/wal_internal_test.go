package outbox

import (
	"bytes"
	"errors"
	"testing"

	"github.com/exactly-go/exactly/handler"
)

// TestWALPayloadRoundTrip checks that a payload keeps nil apart from empty
// keys and values, keeps headers in order, drops a copied message-id
// header, publishes Message.ID, and that damaged payloads fail with
// ErrBadWALPayload.
func TestWALPayloadRoundTrip(t *testing.T) {
	cases := []Message{
		{Topic: "t", Key: nil, Value: nil},
		{Topic: "t", Key: []byte{}, Value: []byte{}},
		{Topic: "orders.v1", Key: []byte("k\x00"), Value: bytes.Repeat([]byte("v"), 300), ID: "given",
			Headers: []handler.Header{{Key: "a", Value: []byte("1")}, {Key: HeaderMessageID, Value: []byte("copied")}, {Key: "b", Value: nil}}},
	}
	for _, msg := range cases {
		p, err := encodeWAL(msg, msg.Headers)
		if err != nil {
			t.Fatal(err)
		}
		m, err := decodeWAL(p)
		if err != nil {
			t.Fatal(err)
		}
		if m.topic != msg.Topic || (m.key == nil) != (msg.Key == nil) || !bytes.Equal(m.key, msg.Key) ||
			(m.value == nil) != (msg.Value == nil) || !bytes.Equal(m.value, msg.Value) {
			t.Fatalf("round trip of %+v gave %+v", msg, m)
		}
		if msg.ID != "" && m.id != msg.ID || msg.ID == "" && len(m.id) != 36 {
			t.Fatalf("id %q for Message.ID %q", m.id, msg.ID)
		}
		if len(msg.Headers) > 0 && (len(m.headers) != 2 || m.headers[0].Key != "a" || m.headers[1].Key != "b") {
			t.Fatalf("headers %+v", m.headers)
		}
		for i := range len(p) {
			if _, err := decodeWAL(p[:i]); !errors.Is(err, ErrBadWALPayload) {
				t.Fatalf("payload cut to %d of %d bytes: %v", i, len(p), err)
			}
		}
	}
	if _, err := encodeWAL(Message{Topic: "t"}, []handler.Header{{Key: "bad\x00"}}); !errors.Is(err, ErrInvalidMessage) {
		t.Fatalf("NUL header name: %v", err)
	}
}
