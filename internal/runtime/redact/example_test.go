package redact_test

import (
	"fmt"

	"github.com/exactly-go/exactly/internal/runtime/redact"
)

// Connection strings are shown with their secrets redacted, in both forms;
// what does not parse is hidden whole.
func ExampleURL() {
	fmt.Println(redact.URL("postgres://app:s3cret@db:5432/orders?sslmode=require&sslpassword=k3y"))
	fmt.Println(redact.URL(`host=db user=app password='se cret' dbname=orders`))
	fmt.Println(redact.URL("postgres://app:s3 cret@db/orders"))
	// Output:
	// postgres://app:xxxxx@db:5432/orders?sslmode=require&sslpassword=xxxxx
	// host=db user=app password=xxxxx dbname=orders
	// postgres://xxxxx
}
