package main

import (
	"testing"

	"github.com/exactly-go/exactly/internal/testenv"
)

// TestMain gives the command tests that need PostgreSQL a server
// (DATABASE_URL's, or a private one).
func TestMain(m *testing.M) { testenv.Main(m) }
