package apply

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/handler"
)

// TestRetryReasonTellsContentionAndUnavailableServicesFromOutages checks
// that a deadlock, a serialization failure and a codec's service down are
// counted under reasons of their own, so that the alert on transient
// retries pages for the database, not for hot rows or a schema registry.
func TestRetryReasonTellsContentionAndUnavailableServicesFromOutages(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("commit: %w", &pgconn.PgError{Code: "40P01"}), retryContention},
		{fmt.Errorf("claim: %w", &pgconn.PgError{Code: "40001"}), retryContention},
		{fmt.Errorf("decode: %w", &handler.UnavailableError{Service: "schema registry", Err: errors.New("503")}), retryUnavailable},
		{fmt.Errorf("begin: %w", &pgconn.PgError{Code: "57P01"}), retryTransient},
		{errors.New("dial tcp: connection refused"), retryTransient},
	} {
		if got := retryReason(tc.err); got != tc.want {
			t.Errorf("retryReason(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
