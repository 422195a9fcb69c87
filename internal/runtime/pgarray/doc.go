// Package pgarray holds slice types that pgx encodes as one-dimensional
// PostgreSQL arrays without boxing each element.
//
// pgx encodes a []string or [][]byte argument through its array codec,
// which asks for each element as an `any`. A string or a slice does not fit
// an interface as is, so each element is copied to the heap: one allocation
// per element, per array, per statement. The types here hand pgx a pointer
// to the element instead (a pointer fits an interface without copying),
// which encodes the same bytes on the wire with none of those allocations.
// The consumer's per-batch statements (the guard's claims, the outbox's
// rows, the effects' deferred results) send their arrays this way, and
// send an array whose elements are all the same (a batch's one topic or
// partition) as its first element alone (Once), for statements that read
// unnest's padding nulls as that element.
//
// They encode in the text format too (TextValue: an array literal), which
// pgx uses in the exec and simple_protocol query exec modes, where it does
// not know a parameter's type; the statements cast them ($1::text[]).
package pgarray
