// Package testenv is what the project's own tests use to get PostgreSQL and
// Kafka without any setup.
//
// A package that needs PostgreSQL calls Main from its TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// Main uses the server named by DATABASE_URL when it is set, and otherwise
// starts a private one (internal/testenv/pgserver) for the test binary and sets
// DATABASE_URL for the tests. Each test then takes a fresh database with DB
// or DBURL, dropped when the test ends.
//
// Kafka comes from Kafka (or KafkaWith, for extra kfake options), an
// in-process kfake cluster per test. RecordGroups records every offset
// commit and group assignment such a cluster sees, checks them against
// partition ownership (GroupLog.Violations), and can fence a member or
// refuse its commits.
//
// PgBouncer in front of that server, for the tests of poolers, comes from
// internal/testenv/pgbouncer.
package testenv
