package telemetry

import (
	"net/url"
	"regexp"
	"strings"
)

// Redacted replaces a secret in redacted output.
const Redacted = "xxxxx"

// secretParams are URL query parameters and key=value DSN keys whose values
// are secrets.
var secretParams = []string{"password", "sslpassword", "sslkey", "pass", "secret", "token", "sasl_password"}

// dsnSecret matches password=... in a libpq key/value connection string,
// quoted ('it”s') or not.
var dsnSecret = regexp.MustCompile(`(?i)\b(password|sslpassword)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)`)

// RedactURL returns s, a connection string (a URL such as
// postgres://user:secret@host/db, or a libpq key/value string such as
// "host=h password=secret"), with every password replaced by [Redacted]:
// the URL's user info password and secret query parameters, or the
// password= pairs. A string that is neither is returned unchanged unless it
// contains password= pairs. It is meant for logs and span attributes.
func RedactURL(s string) string {
	if s == "" {
		return s
	}
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err == nil {
			if u.User != nil {
				if _, has := u.User.Password(); has {
					u.User = url.UserPassword(u.User.Username(), Redacted)
				}
			}
			if u.RawQuery != "" {
				q := u.Query()
				for k := range q {
					if isSecretParam(k) {
						q.Set(k, Redacted)
					}
				}
				u.RawQuery = q.Encode()
			}
			return u.String()
		}
		// Unparseable URL: hide everything between "://" and the last '@'.
		scheme, rest, _ := strings.Cut(s, "://")
		if at := strings.LastIndexByte(rest, '@'); at >= 0 {
			return scheme + "://" + Redacted + rest[at:]
		}
	}
	return dsnSecret.ReplaceAllString(s, "${1}="+Redacted)
}

func isSecretParam(k string) bool {
	k = strings.ToLower(k)
	for _, p := range secretParams {
		if k == p {
			return true
		}
	}
	return false
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

// URLPassword returns the password in a connection string (URL or libpq
// key/value), or "".
func URLPassword(s string) string {
	if strings.Contains(s, "://") {
		if u, err := url.Parse(s); err == nil {
			if u.User != nil {
				if p, ok := u.User.Password(); ok {
					return p
				}
			}
			for k, v := range u.Query() {
				if isSecretParam(k) && len(v) > 0 {
					return v[0]
				}
			}
		}
		return ""
	}
	if m := dsnSecret.FindStringSubmatch(s); m != nil {
		return strings.Trim(m[2], "'")
	}
	return ""
}

// urlInText matches a URL-like connection string inside free text.
var urlInText = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s'"<>]+`)

// RedactText returns s, free text such as an error message, with the
// secrets of every connection string in it replaced by [Redacted]: each
// URL is passed through RedactURL, and libpq password= pairs are hidden.
func RedactText(s string) string {
	s = urlInText.ReplaceAllStringFunc(s, RedactURL)
	return dsnSecret.ReplaceAllString(s, "${1}="+Redacted)
}
