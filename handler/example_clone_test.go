package handler_test

import (
	"fmt"

	"github.com/exactly-go/exactly/handler"
)

// A hook that keeps records past its call (here, the last few dead-letter
// candidates, for a status page) keeps clones: the consumer lends a
// record's memory to later fetches once it is done with it.
func ExampleRecord_Clone() {
	var recent []handler.Record
	keep := func(rec *handler.Record) { recent = append(recent, rec.Clone()) }

	buf := []byte(`{"order_id":"order-8812"}`)
	rec := handler.Record{Topic: "credits", Offset: 41, Value: buf}
	keep(&rec)
	copy(buf, "reused memory, another record")

	fmt.Println(string(recent[0].Value))
	// Output: {"order_id":"order-8812"}
}
