// Package jsonflat knows the commonest JSON payload, a flat struct of
// strings, booleans and numbers, well enough to encode and decode it
// without encoding/json's general machinery, and only where the result is
// encoding/json's byte for byte (or value for value).
//
// Fields walks a struct type once and says whether it is flat. Encoder
// writes a flat struct as json.Marshal would, and refuses (so that the
// caller falls back to json.Marshal) a value whose output is not plain to
// see: a string that json.Marshal would escape, a float that is not
// finite. Encoders keeps one Encoder per type for a long-lived owner (an
// outbox). The decoding side, a single scan of plain records, is the
// handler package's (handler/flatjson.go), built on Fields.
package jsonflat
