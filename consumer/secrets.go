package consumer

import (
	"reflect"
	"strings"

	"github.com/exactly-go/exactly/internal/runtime/redact"
)

// Secrets returns the configuration's secrets, which the consumer scrubs
// from its logs and spans: the secrets in DATABASE_URL and
// EXACTLY_LISTEN_DATABASE_URL (their password,
// sslpassword and sslkey, as the module's one redaction rule reads them)
// and the value of every non-empty string variable whose name ends in
// _PASSWORD or _SECRET (the SASL password).
func (c Config) Secrets() []string {
	s := append(redact.ConnSecrets(c.DatabaseURL), redact.ConnSecrets(c.ListenDatabaseURL)...)
	v := reflect.ValueOf(c)
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("env"), ",")
		if !strings.HasSuffix(name, "_PASSWORD") && !strings.HasSuffix(name, "_SECRET") {
			continue
		}
		if f := v.Field(i); f.Kind() == reflect.String && f.String() != "" {
			s = append(s, f.String())
		}
	}
	return s
}
