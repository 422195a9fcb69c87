package consumer

import (
	"reflect"
	"strings"

	"github.com/exactly-go/exactly/internal/runtime/telemetry"
)

// Secrets returns the configuration's secrets, which the consumer scrubs
// from its logs and spans: the password in DATABASE_URL and the value of
// every non-empty string variable whose name ends in _PASSWORD or _SECRET
// (the SASL password).
func (c Config) Secrets() []string {
	var s []string
	if p := telemetry.URLPassword(c.DatabaseURL); p != "" {
		s = append(s, p)
	}
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
