package protobuf

import (
	"maps"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// The message indexes of a .proto text: nested messages numbered within
// their parent, enums, oneofs, services, options and comments (braces and
// "message" in them included) not counted.
func TestTextMessageNamesFollowTheIndexes(t *testing.T) {
	const text = `// A comment with { braces } and message Fake {
syntax = "proto3";
package shop.v1;
import "google/protobuf/timestamp.proto";
option java_package = "com.shop { message Nope {";

/* block comment: message Gone { } */
message Order {
  message Line {
    message Tax { int64 cents = 1; }
    string sku = 1;
  }
  enum State { NEW = 0; PAID = 1; }
  oneof payment { string card = 2; string iban = 3; }
  repeated Line lines = 1;
  map<string, string> labels = 4 [deprecated = true];
}
enum Top { A = 0; }
service Orders { rpc Get(Order) returns (Order) { option deprecated = true; } }
message Refund { string id = 1; }
`
	got, err := textMessageNames(text)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]protoreflect.FullName{
		"0": "shop.v1.Order", "0.0": "shop.v1.Order.Line", "0.0.0": "shop.v1.Order.Line.Tax", "1": "shop.v1.Refund",
	}
	if !maps.Equal(got, want) {
		t.Errorf("message names %v; want %v", got, want)
	}
	if _, err := textMessageNames("message A { message B {"); err == nil {
		t.Error("unbalanced braces were accepted")
	}
}
