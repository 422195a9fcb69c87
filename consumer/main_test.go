package consumer_test

import (
	"os"
	"testing"

	"github.com/exactly-go/exactly/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(relayChildEnv) != "" {
		os.Exit(runChildRelay())
	}
	if os.Getenv(childEnv) != "" {
		os.Exit(runChildConsumer())
	}
	testenv.Main(m)
}
