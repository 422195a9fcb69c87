// Package dedupe is the guard of the exactly framework: a table of
// (scope, key) rows, one per business operation whose effect has committed,
// claimed inside the same PostgreSQL transaction as that effect. A row is
// "applied", or "dead_lettered" when its record was sent to the dead-letter
// topic instead ([Guard.MarkDeadLettered]; a record without a usable key is
// marked under [DeadLetterKey] of its coordinates), so that a redelivery of
// that record is a duplicate and writes no second dead letter.
//
// Kafka, like every practical queue, delivers at least once. The effect of a
// record happens once when the handler's writes and a guard row keyed by the
// business operation commit or roll back together:
//
//	tx := begin()
//	outcome, err := guard.Claim(ctx, tx, "billing", dedupe.Key("credit", orderID))
//	if outcome == dedupe.Duplicate { rollback or commit; skip the handler }
//	... the handler's writes, in tx ...
//	commit
//
// # Concurrency
//
// Claim is an insert … on conflict do nothing. Under READ COMMITTED (the
// PostgreSQL default), a second concurrent Claim of the same key blocks until
// the first transaction ends: if it committed the second reports Duplicate, if
// it rolled back the second reports Applied and does the work. Under
// REPEATABLE READ or SERIALIZABLE the second transaction instead fails with a
// serialization error (SQLSTATE 40001), which callers must retry.
// ClaimBatch inserts its keys in sorted order so two batches with overlapping
// keys wait for each other rather than deadlock.
//
// # Keys
//
// A key names the business operation, never the delivery: [Key]("credit",
// "order-8812") is "credit:order-8812" however often the order is delivered.
// Keys are normalized by [NormalizeKey]: a key that is valid UTF-8, holds no
// NUL byte and is at most [MaxKeyLen] bytes is stored verbatim; any other key
// is stored as "sha256:" followed by the hex SHA-256 of its raw bytes. Every
// method applies the rule, so callers pass raw keys. The empty key is refused
// with [ErrEmptyKey].
//
// # Retention
//
// The guard grows by one row per operation. It is kept in generations
// (see [Generation]): the guard table is the current one, into which
// claims insert after checking the sealed ones (the view
// [Guard.SealedView]). A [Pruner] seals the current generation every
// GenerationSpan, drops a sealed generation whole once its rows are all
// older than the retention, and deletes expired rows of the current
// generation in index-ordered batches, one instance at a time across a
// fleet. [Guard.Prune] does the row-by-row part once. Retention must exceed
// the redelivery horizon (retries plus any dead-letter replay window): a key
// pruned and then replayed runs again. [Guard.NewPruner] refuses a shorter
// retention with a [*RetentionError] unless explicitly overridden.
//
// # Schema
//
// [Migrate] (or [Guard.Migrate]) creates the table; it is idempotent and safe
// to run concurrently from several instances, and it creates the table again
// if it was dropped after it was migrated, with its companion tables (see
// [Guard.Migrate]). The SQL is tested on
// PostgreSQL 15 and 17.
package dedupe
