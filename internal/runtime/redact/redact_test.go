package redact_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/internal/runtime/redact"
)

// TestRedactURL is the module's one redaction rule on hostile connection
// strings: each secret is gone from the output (and from ConnSecrets'
// complement), and what is not a secret is kept as written; what does not
// parse is redacted whole.
func TestRedactURL(t *testing.T) {
	const x = redact.Redacted
	for _, tc := range []struct {
		in, want string
		secrets  []string // what ConnSecrets finds
	}{
		{"", "", nil},
		{"postgres://app@db/credit", "postgres://app@db/credit", nil},
		{"postgres://app:hunter2@db:5432/credit?sslmode=disable",
			"postgres://app:" + x + "@db:5432/credit?sslmode=disable", []string{"hunter2"}},
		// Percent-escapes in the password and an unescaped '@' in it.
		{"postgresql://app:p%40ss%2Fw0rd@db/credit", "postgresql://app:" + x + "@db/credit", []string{"p@ss/w0rd"}},
		{"postgres://app:p@ss@db/credit", "postgres://app:" + x + "@db/credit", []string{"p@ss"}},
		// Every libpq secret parameter in the query, order kept, a
		// percent-escaped parameter name included.
		{"postgres://u:pw@h/db?password=x1&sslmode=require&sslpassword=y2&sslkey=k3&pass%77ord=z4",
			"postgres://u:" + x + "@h/db?password=" + x + "&sslmode=require&sslpassword=" + x + "&sslkey=" + x + "&pass%77ord=" + x,
			[]string{"pw", "x1", "y2", "k3", "z4"}},
		{"postgres://h/db?PASSWORD=a%26b", "postgres://h/db?PASSWORD=" + x, []string{"a&b"}},
		// Multi-host URLs.
		{"postgres://u:pw@h1:5432,h2:5433/db", "postgres://u:" + x + "@h1:5432,h2:5433/db", []string{"pw"}},
		// A fragment is not a libpq part; it may hold anything.
		{"postgres://u@h/db#password=f1", "postgres://u@h/db#" + x, nil},
		// Unparsable URLs are redacted whole: a space in the user info, a
		// bad escape, a semicolon-free bad query escape, a password whose
		// unescaped '/' or '?' cut the authority short.
		{"postgres://u:se cret@h/db", "postgres://" + x, nil},
		{"postgres://u:%zzsecret@h/db", "postgres://" + x, nil},
		{"postgres://h/db?password=%zzsecret", "postgres://" + x, nil},
		{"postgres://u:12/secret@h/db", "postgres://" + x, nil},
		{"postgres://u:12?secret@h/db", "postgres://" + x, nil},
		{"postgres://u:pw@[::1/db", "postgres://" + x, nil},
		// The key/value form, as libpq parses it.
		{"host=db user=app password=hunter4 dbname=credit", "host=db user=app password=" + x + " dbname=credit", []string{"hunter4"}},
		{"host=h password='se cret' user=u", "host=h password=" + x + " user=u", []string{"se cret"}},
		{"host=h password = 'it\\'s \\\\ x' user=u", "host=h password = " + x + " user=u", []string{"it's \\ x"}},
		{"host=h password=se\\ cret user=u", "host=h password=" + x + " user=u", []string{"se cret"}},
		{"host=h\tsslpassword=k1\nsslkey='/k 2' PASSWORD=p3", "host=h\tsslpassword=" + x + "\nsslkey=" + x + " PASSWORD=" + x, []string{"k1", "/k 2", "p3"}},
		// An empty value takes the next word, as in libpq.
		{"password= host=h", "password= " + x, []string{"host=h"}},
		{"password=''", "password=" + x, nil},
		// A value that does not follow libpq's grammar: redacted whole.
		{"host=h password='unterminated secret", x, nil},
		{"host=h secretword", x, nil},
		{"u:secret@h", x, nil},
		{"postgres:u:secret@h", x, nil},
	} {
		got := redact.URL(tc.in)
		if got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
		for _, leak := range []string{"secret", "hunter", "cret", "x1", "y2", "k3", "z4", "a&b", "f1", "k1", "p3", "it's"} {
			if strings.Contains(got, leak) {
				t.Errorf("URL(%q) = %q: %q leaked", tc.in, got, leak)
			}
		}
		if secrets := redact.ConnSecrets(tc.in); strings.Join(secrets, "|") != strings.Join(tc.secrets, "|") {
			t.Errorf("ConnSecrets(%q) = %q, want %q", tc.in, secrets, tc.secrets)
		}
	}
}

// Text hides the secrets of connection strings quoted in free text,
// by the same key list and value grammar.
func TestRedactText(t *testing.T) {
	const x = redact.Redacted
	for in, want := range map[string]string{
		"dial postgres://u:pw1@h/db?sslpassword=k1 failed":                    "dial postgres://u:" + x + "@h/db?sslpassword=" + x + " failed",
		"cannot parse `host=h password = 'se cret' sslkey=k2`: bad":           "cannot parse `host=h password=" + x + " sslkey=" + x + " bad", // an unquoted value runs to the next space
		"cannot parse `host=h password=se\\ cret`: bad":                       "cannot parse `host=h password=" + x + " bad",
		"cannot parse `host=h password='unterminated secret to the end":       "cannot parse `host=h password=" + x,
		"no connection string here: password must be set, PASSWORD unchanged": "no connection string here: password must be set, PASSWORD unchanged",
		"env: PGPASSWORD=hunter2 PGSSLPASSWORD='k 3' psql":                    "env: PGPASSWORD=" + x + " PGSSLPASSWORD=" + x + " psql", // libpq's environment variables
	} {
		if got := redact.Text(in); got != want {
			t.Errorf("Text(%q) = %q, want %q", in, got, want)
		}
	}
}

// Error scrubs the connection string's secrets from a driver's error
// and keeps the error reachable with errors.Is.
func TestRedactError(t *testing.T) {
	base := errors.New("cannot parse `host=h password = se\\ cret`: invalid")
	err := redact.Error(base, "host=h password = se\\ cret")
	if strings.Contains(err.Error(), "cret") || !errors.Is(err, base) {
		t.Errorf("Error = %q (errors.Is %t), want the secret gone and the error kept", err, errors.Is(err, base))
	}
	if redact.Error(nil, "password=x") != nil {
		t.Error("Error(nil) is not nil")
	}
}
