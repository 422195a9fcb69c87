package handler_test

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/handler"
)

// RowsAffected is the check a pipelined handler queues an UPDATE with when
// the row must exist: q.QueueCheck(handler.RowsAffected(1), sql, args...).
// The executor calls it with the statement's command tag before COMMIT;
// its error, reachable with errors.As from the record's dead-letter
// reason, names the command and both counts.
func ExampleRowsAffected() {
	check := handler.RowsAffected(1)
	fmt.Println(check(pgconn.NewCommandTag("UPDATE 1")))
	err := check(pgconn.NewCommandTag("UPDATE 0"))
	var rae *handler.RowsAffectedError
	fmt.Println(err, errors.As(err, &rae), rae.Want, rae.Got)
	// Output:
	// <nil>
	// UPDATE affected 0 rows, want 1 true 1 0
}
