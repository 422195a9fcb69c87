package outbox

import (
	"testing"

	"github.com/jackc/pgx/v5"
)

// New takes the default table's quoted name and channel from constants
// instead of building them: they must be what building them gives.
func TestDefaultQuotedIsSanitizedDefaultTable(t *testing.T) {
	o := New()
	if want := (pgx.Identifier{DefaultTable}).Sanitize(); o.quoted != want || defaultQuoted != want {
		t.Errorf("default table quoted %q (constant %q), want %q", o.quoted, defaultQuoted, want)
	}
	if want := channelName("", DefaultTable); o.channel != want {
		t.Errorf("default channel %q, want %q", o.channel, want)
	}
	if o := New(WithTable("", "other")); o.quoted != `"other"` || o.channel != "other" {
		t.Errorf("table other: quoted %q, channel %q", o.quoted, o.channel)
	}
}
