// Package v2reader holds the tests of a handler built on version 2 of the
// test's Protobuf message: a test binary holds one generated type per
// message name, so version 1's tests live with the protobuf package and
// version 2's here.
package v2reader
