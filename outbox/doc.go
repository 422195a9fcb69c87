// Package outbox is the transactional outbox of the exactly framework: a
// handler adds the messages it emits to a PostgreSQL table inside its own
// transaction, and a relay publishes them to Kafka after the transaction
// commits. A message is published if and only if its transaction committed
// (at least once: a relay that crashes between the broker's ack and the
// row's deletion publishes it again), and every published record carries a
// stable message-id header so a downstream exactly consumer applies it once.
//
//	tx := begin()
//	... the handler's writes ...
//	err := outbox.Add(ctx, tx, outbox.Message{Topic: "payments", Key: orderID, Value: b})
//	commit
//
// # Order
//
// Records with one Kafka key are published in the order their transactions
// committed, wherever one transaction depended on the other (read what the
// other wrote, or waited for a row lock it held). Inside an exactly
// consumer, Add only queues the row; the consumer inserts the batch's rows
// just before COMMIT, after every read and write of its handlers, so a
// batch that depended on another draws larger ids, without any lock. A
// direct Add (outside a consumer) draws its id at once, so it first takes a
// transaction-scoped advisory lock on (table, topic, key), in the same
// statement, before the row's BIGSERIAL id is drawn; a second transaction
// adding the same key waits until the first has ended. Either way, within a
// key, id order is commit order for dependent rows, and such a row is never
// visible while an earlier one of its key is still uncommitted. The relay
// reads committed rows in id order and deletes what it published; it never
// remembers an "id > last seen" position, which would skip rows whose
// transaction drew a smaller id but committed later (the BIGSERIAL trap).
// The argument is in docs/design.md ("The relay's ordering argument").
//
// The relay deliberately does not filter rows by the snapshot's xmin
// (txid < pg_snapshot_xmin(pg_current_snapshot())). Transaction ids are
// assigned at a transaction's first write, not when it adds to the outbox,
// so such a filter holds back a key's earlier row (written by a transaction
// with a newer xid) while publishing its later row (written by a transaction
// with an older xid that waited for the key's lock), whenever any third
// transaction keeps xmin between them; it would also stall the relay behind
// every long write transaction in the cluster. TestXminFilterWouldReorderAKey
// shows the case. The txid column is kept for diagnosis.
//
// Messages with a nil key take no lock and have no order guarantee, as in
// Kafka. All writers of a table must name it the same way (WithTable), since
// the lock key is derived from the name.
//
// # The relay
//
// Any number of [Relay]s may run against one table; one is active: the
// holder of the table's lease, a row of [LeaseTable] (owner, epoch, expiry)
// that it renews every quarter of LeaseDuration and that a standby takes,
// every TakeoverInterval, once it expired ([Outbox.Lease] reads it). The
// relay keeps no session state: every statement runs in a short transaction
// of the pool (which may go through a transaction-mode pooler), and every
// delete and park runs in one that first finds the lease still held with
// its epoch. Each batch is one Kafka transaction under the table's
// transactional id, which a new holder initialises before reading a row: a
// relay paused past its lease is fenced at the brokers and what it sent is
// aborted. No writing transaction notifies, neither a
// consumer's, nor Add's, nor the operator's Retry and Drop (a NOTIFY
// serialises the commits of every notifying transaction): after a consumer
// commits rows, Outbox.Wake wakes the relays built from the same Outbox
// value at once and notifies the table's channel from a transaction of its
// own for relays elsewhere, which the active relay hears when it can LISTEN
// (RelayConfig.ListenConnString, or a pool of direct connections). The
// relay also polls, 5ms after a read that found rows and backing off to
// PollInterval while the table is empty. It produces with acks=all, waits
// for the commit of a batch, then deletes it, also when the relay is
// stopped meanwhile. Rows that failed with a retriable error are read and
// published again in id order. Rows published twice (after a crash between
// the commit and the delete) carry the same message-id.
//
// # Parked rows
//
// One bad row holds only its own (topic, key), visibly. [Outbox.Add] refuses
// what Kafka would refuse ([ValidateTopic], [RecordSize] over the limit) with a
// [*MessageError]. A row that still cannot be published (written by hand, too
// large for its topic's max.message.bytes, a forbidden, unknown or
// policy-violating topic; see [PermanentProduceError]) is parked: marked in
// the table with its reason, logged once, counted by exactly.outbox.parked,
// and skipped with every later row of its (topic, key), while all other rows
// flow. [Outbox.Parked] lists parked rows, [Outbox.Retry] releases them after
// a fix and [Outbox.Drop] deletes them ("exactly outbox parked|retry|drop").
//
// # Dead letters and replay
//
// [DeadLetters] provides the consumer's dead-letter function: the original
// record goes, through the outbox and in the transaction that lets its
// offset advance, to <topic>.dlq with headers naming the error, the handler,
// the attempts and the original coordinates. A dead letter too large to
// publish whole is truncated visibly (HeaderTruncated, HeaderOriginalSize,
// HeaderOriginalSHA256). [Replay] (the "exactly replay" command)
// re-publishes selected dead letters to their original topics without those
// headers, and refuses truncated ones.
//
// # Schema
//
// [Migrate] (or [Outbox.Migrate]) creates the table; it is idempotent,
// safe to run concurrently, and creates the table again if it was dropped
// after it was migrated. The SQL is tested on PostgreSQL 15 and 17.
package outbox
