package status

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/internal/testenv"
)

// The transaction every collector read runs in is read-only: PostgreSQL
// reports transaction_read_only on inside it and refuses a write in it
// with read_only_sql_transaction (25006). (With the read-only access mode
// dropped, the status page's reads ran in transactions that could write,
// and no other test noticed: they only read.)
func TestCollectorReadsInReadOnlyTransactions(t *testing.T) {
	pool := testenv.DB(t)
	c, err := NewCollector(Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	var readOnlySetting string
	err = readOnly(t.Context(), c, func(tx pgx.Tx) error {
		if err := tx.QueryRow(t.Context(), `show transaction_read_only`).Scan(&readOnlySetting); err != nil {
			return err
		}
		_, err := tx.Exec(t.Context(), `create table written_by_status (id int)`)
		return err
	})
	if readOnlySetting != "on" {
		t.Errorf("transaction_read_only is %q inside the collector's transaction, want on", readOnlySetting)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Errorf("a write in the collector's transaction: %v; want it refused as read_only_sql_transaction (25006)", err)
	}
}

// Two sessions holding one table's relay (what a session lock taken
// through a transaction-mode pooler can come to) is a problem naming both
// holders and what to do, whether or not rows wait; one holder is not.
func TestMoreThanOneRelayIsAProblem(t *testing.T) {
	c := &Collector{cfg: Config{}.withDefaults()}
	r := &Report{Outbox: Outbox{Table: `"exactly_outbox"`},
		Relay: Relay{Mechanism: "advisory lock", Active: true, Holders: []RelayHolder{{Holder: "backend pid 10", PID: 10}, {Holder: "backend pid 11", PID: 11}}}}
	c.relayProblems(r)
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "more than one relay holds the advisory lock") ||
		!strings.Contains(r.Problems[0], `"backend pid 10"`) || !strings.Contains(r.Problems[0], `"backend pid 11"`) ||
		!strings.Contains(r.Problems[0], "docs/operations.md#exactlymorethanonerelay") {
		t.Errorf("problems %q", r.Problems)
	}
	r.Problems, r.Relay.Holders = nil, r.Relay.Holders[:1]
	c.relayProblems(r)
	if len(r.Problems) != 0 {
		t.Errorf("one holder: problems %q", r.Problems)
	}
}
