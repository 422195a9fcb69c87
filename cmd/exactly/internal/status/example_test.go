package status_test

import (
	"fmt"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
)

// The status page binds to loopback addresses only, unless remote access
// is asked for explicitly.
func ExampleCheckListenAddr() {
	fmt.Println(status.CheckListenAddr("127.0.0.1:8090", false) == nil)
	fmt.Println(status.CheckListenAddr(":8090", false) == nil)
	fmt.Println(status.CheckListenAddr(":8090", true) == nil)
	// Output:
	// true
	// false
	// true
}

// Keys and header values are shown as text when they are printable, and as
// hex otherwise.
func ExamplePrintable() {
	fmt.Println(status.Printable([]byte("order-8812")))
	fmt.Println(status.Printable([]byte{0, 1, 0xff}))
	fmt.Println(status.Printable(nil))
	// Output:
	// order-8812
	// 0x0001ff
	// (null)
}
