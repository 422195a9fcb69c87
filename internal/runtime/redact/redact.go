package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// Redacted replaces a secret in redacted output. It is what pgx prints in
// place of a password too.
const Redacted = "xxxxx"

// secretKeys are the connection parameters whose values are secrets, as
// URL query parameters or key/value pairs, compared case-insensitively:
// libpq's two secret parameters (password and sslpassword, the ones
// PQconndefaults marks as "*"), sslkey (a file name, unless pgx's
// sslinline=true makes it the private key itself), and the names other
// schemes commonly use for credentials.
var secretKeys = []string{"password", "sslpassword", "sslkey", "pass", "passwd", "secret", "token", "sasl_password", "sasl.password"}

func isSecretKey(k string) bool {
	k = strings.ToLower(strings.TrimSpace(k))
	for _, p := range secretKeys {
		if k == p {
			return true
		}
	}
	return false
}

// urlScheme matches the start of a URL-form connection string.
var urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)

// URL returns s, a connection string, with every secret replaced by
// [Redacted]. It is the one redaction rule of the module, for logs, errors,
// span attributes, Config.String and the status page. It reads:
//
//   - the URL form (postgres://user:secret@host/db?sslpassword=secret):
//     the user info password, and the values of secret query parameters
//     (password, sslpassword, sslkey, …; percent-escaped names included)
//     and any fragment;
//   - the libpq key/value form (host=h password='se cret'), by libpq's own
//     grammar: spaces around '=', quoted values with backslash escapes,
//     unquoted values with backslash escapes.
//
// It fails closed: a string that does not parse as either form (an
// unterminated quote, a bad escape, a password holding an unescaped '/'
// or '?' so that its '@' lands after the host) is replaced whole by
// [Redacted], or by scheme://[Redacted] for a URL, never returned with a
// secret left in it. The empty string is returned unchanged.
func URL(s string) string {
	out, _ := redactConn(s)
	return out
}

// ConnSecrets returns the secret values of a connection string (the
// passwords and keys [URL] hides), for [Scrub] and [Handler];
// none when s has none or does not parse.
func ConnSecrets(s string) []string {
	_, secrets := redactConn(s)
	return secrets
}

// redactConn returns s redacted and the secrets it held.
func redactConn(s string) (string, []string) {
	if strings.TrimSpace(s) == "" {
		return s, nil
	}
	if scheme := urlScheme.FindString(s); scheme != "" {
		out, secrets, ok := redactURLForm(s)
		if !ok {
			return scheme + Redacted, nil
		}
		return out, secrets
	}
	out, secrets, ok := redactKeyValue(s)
	if !ok {
		return Redacted, nil
	}
	return out, secrets
}

// redactURLForm redacts a URL-form connection string; ok is false when it
// must be redacted whole.
func redactURLForm(s string) (out string, secrets []string, ok bool) {
	u, err := url.Parse(s)
	if err != nil || u.Opaque != "" {
		return "", nil, false
	}
	// An '@' after the authority means the user info held a '/', '?' or
	// '#' and was cut short: part of the password is in the path, the
	// query or the fragment, or the host.
	if strings.Contains(u.Path, "@") || strings.Contains(u.RawQuery, "@") || strings.Contains(u.Fragment, "@") {
		return "", nil, false
	}
	if u.User != nil {
		if p, has := u.User.Password(); has {
			secrets = append(secrets, p)
			u.User = url.UserPassword(u.User.Username(), Redacted)
		}
	}
	if u.RawQuery != "" {
		pairs := strings.Split(u.RawQuery, "&")
		for i, pair := range pairs {
			k, v, _ := strings.Cut(pair, "=")
			key, err := url.QueryUnescape(k)
			if err != nil {
				return "", nil, false
			}
			val, err := url.QueryUnescape(v)
			if err != nil {
				return "", nil, false
			}
			if isSecretKey(key) {
				if val != "" {
					secrets = append(secrets, val)
				}
				pairs[i] = k + "=" + Redacted
			}
		}
		u.RawQuery = strings.Join(pairs, "&")
	}
	if u.Fragment != "" {
		u.Fragment, u.RawFragment = Redacted, ""
	}
	return u.String(), secrets, true
}

// redactKeyValue redacts a libpq key/value connection string, following
// libpq's conninfo_parse: pairs separated by whitespace, whitespace allowed
// around '=', a value either single-quoted (backslash escapes the next
// character) or running to the next whitespace (backslash escapes the next
// character too). ok is false when s does not follow that grammar.
func redactKeyValue(s string) (out string, secrets []string, ok bool) {
	var b strings.Builder
	i, last := 0, 0
	space := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' }
	for {
		for i < len(s) && space(s[i]) {
			i++
		}
		if i == len(s) {
			break
		}
		ks := i
		for i < len(s) && !space(s[i]) && s[i] != '=' {
			i++
		}
		key := s[ks:i]
		for i < len(s) && space(s[i]) {
			i++
		}
		if i == len(s) || s[i] != '=' || key == "" {
			return "", nil, false
		}
		i++
		for i < len(s) && space(s[i]) {
			i++
		}
		vs := i
		var val strings.Builder
		if i < len(s) && s[i] == '\'' {
			i++
			closed := false
			for i < len(s) {
				c := s[i]
				if c == '\\' && i+1 < len(s) {
					val.WriteByte(s[i+1])
					i += 2
					continue
				}
				i++
				if c == '\'' {
					closed = true
					break
				}
				val.WriteByte(c)
			}
			if !closed {
				return "", nil, false
			}
		} else {
			for i < len(s) && !space(s[i]) {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				val.WriteByte(s[i])
				i++
			}
		}
		if isSecretKey(key) {
			if val.Len() > 0 {
				secrets = append(secrets, val.String())
			}
			b.WriteString(s[last:vs])
			b.WriteString(Redacted)
			last = i
		}
	}
	b.WriteString(s[last:])
	return b.String(), secrets, true
}

// Scrub returns s with every non-empty secret replaced by [Redacted], for
// text (error messages) that might quote a configured secret verbatim.
func Scrub(s string, secrets ...string) string {
	for _, sec := range secrets {
		if sec != "" && strings.Contains(s, sec) {
			s = strings.ReplaceAll(s, sec, Redacted)
		}
	}
	return s
}

// urlInText matches a URL-like connection string inside free text.
var urlInText = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s'"<>]+`)

// kvSecretInText matches a secret key=value pair inside free text: the
// key/value grammar of [URL], with an unterminated quote running to
// the end of the text. A key may carry libpq's environment prefix
// (PGPASSWORD, PGSSLPASSWORD).
var kvSecretInText = regexp.MustCompile(`(?is)\b((?:PG)?(?:` + secretKeyPattern() + `))\s*=\s*('(?:[^'\\]|\\.)*'?|(?:[^\s\\]|\\.)+)`)

func secretKeyPattern() string {
	q := make([]string, len(secretKeys))
	for i, k := range secretKeys {
		q[i] = regexp.QuoteMeta(k)
	}
	return strings.Join(q, "|")
}

// Text returns s, free text such as an error message, with the
// secrets of every connection string in it replaced by [Redacted]: each
// URL is passed through [URL], and secret key=value pairs are
// hidden by the same key list and value grammar.
func Text(s string) string {
	s = urlInText.ReplaceAllStringFunc(s, URL)
	return kvSecretInText.ReplaceAllString(s, "${1}="+Redacted)
}

// redactedError is an error whose message was redacted; errors.Is and
// errors.As still reach the original.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// Error returns err with its message passed through [Text]
// and with the secrets of connString ([ConnSecrets]) scrubbed, for errors
// from drivers that quote the connection string they were given (pgx
// redacts the password, not every secret parameter). errors.Is and
// errors.As still reach err. A nil err gives nil.
func Error(err error, connString string) error {
	if err == nil {
		return nil
	}
	msg := Scrub(Text(err.Error()), ConnSecrets(connString)...)
	if msg == err.Error() {
		return err
	}
	return &redactedError{msg: msg, err: err}
}
