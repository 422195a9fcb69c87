package outbox_test

import (
	"strings"
	"testing"

	"github.com/exactly-go/exactly/outbox"
)

// A ConnString that does not parse fails NewWALRelay without quoting its
// secrets, even where the driver's own message quotes them.
func TestNewWALRelayErrorHidesSecrets(t *testing.T) {
	cs := "host=db password = 'hunter3 tail9' sslpassword=hunter4 port=notaport"
	_, err := outbox.NewWALRelay([]string{"127.0.0.1:1"}, outbox.WALRelayConfig{ConnString: cs})
	if err == nil || !strings.Contains(err.Error(), "ConnString") {
		t.Fatalf("NewWALRelay with a bad ConnString: %v, want an error naming ConnString", err)
	}
	if strings.Contains(err.Error(), "hunter") || strings.Contains(err.Error(), "tail9") {
		t.Errorf("the error shows a secret: %v", err)
	}
}
