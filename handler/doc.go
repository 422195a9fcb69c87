// Package handler defines typed Kafka record handlers for exactly.
//
// A handler is a function over a decoded payload type T that runs inside the
// PostgreSQL transaction in which exactly also claims the record's guard row
// and writes its outbox rows:
//
//	credit := handler.New("credit",
//		handler.FromPayload(func(c Credit) string { return dedupe.Key("credit", c.OrderID) }),
//		func(ctx context.Context, tx pgx.Tx, msg handler.Message[Credit]) error {
//			_, err := tx.Exec(ctx, "insert into ledger(account, amount) values($1, $2)",
//				msg.Value.Account, msg.Value.Amount)
//			return err
//		})
//
// Every handler says where its deduplication key comes from (a [KeySource]):
// fields of the payload ([FromPayload]), a header the producer set
// ([FromHeader]), or, explicitly and weaker, the record's coordinates
// ([FromCoordinates]), which catch redelivery but not a producer that sends
// the same command twice.
//
// A key may be any non-empty string of bytes: a header carries arbitrary
// bytes, and a payload field may be huge. The guard stores a key verbatim
// when it is valid UTF-8, holds no NUL byte and is at most 256 bytes
// (dedupe.MaxKeyLen); any other key (a 10,000-character header, invalid
// UTF-8, a NUL) is stored as "sha256:" followed by the hex SHA-256 of its
// bytes (dedupe.NormalizeKey). Such keys are neither refused nor truncated:
// two records with the same long key are one operation, two with keys that
// differ anywhere are two. [Message.Key] is always the raw key.
//
// The key is scoped, by default to the handler's name, so that two services
// sharing one database do not deduplicate each other. Handlers whose effect
// is naturally idempotent (set a value, upsert by natural key, delete if
// exists) may opt out of the guard row with [NaturallyIdempotent].
//
// Payloads are decoded with a [Codec], JSON by default. A record that cannot
// be decoded yields a [*DecodeError] and one without a usable key a
// [*KeyError]; the consumer sends both to the dead-letter topic with the
// reason instead of calling the handler. A codec that reads from a service
// (a schema registry: the codecs of package handler/schemaregistry) returns
// an [*UnavailableError] while that service does not answer: an outage, in
// which the record waits, never dead-lettered.
//
// A handler's error is a failed attempt of its record: the record is
// retried with backoff, then dead-lettered. Wrap it with [Permanent] to
// dead-letter the record at once (a rejection no retry can fix). A handler
// that returns nil although its transaction was aborted (it swallowed a
// database error, such as a unique violation) fails its record with an
// [*AbortedTxError]; use a savepoint (tx.Begin) or "on conflict do nothing"
// instead of swallowing.
//
// Handlers that only write have two faster forms with the same name, key
// source and options: [NewPipelined], whose function queues its statements
// (a batch's writes then cost one round trip), and [NewSet], whose function
// gets a batch's non-duplicate messages in one call for set-based SQL. A
// pipelined handler that must know a write's result queues it with
// [Queue.QueueCheck] and a check such as [RowsAffected] (the batch then
// costs one more round trip: COMMIT goes alone, after the checks). A
// failing queued statement, a refused check, or a set call that fails
// (bisected down to the record that fails alone), fails only its record. [WithLockKeys] declares
// the rows a record touches, so that batches that share hot rows wait for
// each other instead of deadlocking.
//
// A handler that calls another system (a payment provider) declares the
// call once with [NewWithCall]: the consumer makes it before the record's
// transaction, outside any transaction and concurrently with other keys'
// calls, with the record's key as the idempotency key and a deadline
// (consumer.Config.CallTimeout); the transaction records the result and
// hands it, typed, to the handler's function. [WithCall] is the lower-level
// form, for results that are not JSON or several calls per record.
//
// Several typed handlers can share one topic through a [Router], which
// picks the handler per record from a header ([ByHeader]) or a JSON field
// ([ByField]); a missing or unknown type yields a [*RouteError], which is
// dead-lettered like a decode error.
//
// Package handlertest runs a handler against a real database the way the
// consumer does, many times and concurrently, so users can assert one effect
// per key in their own tests.
package handler
