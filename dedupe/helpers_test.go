package dedupe_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// testDB returns a pool on a fresh database, dropped after the test.
func testDB(t testing.TB) *pgxpool.Pool { return testenv.DB(t) }
