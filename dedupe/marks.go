package dedupe

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/runtime/pgarray"
)

// RecordClaim is a claim made for one Kafka record: its key in its scope,
// plus the record's coordinates and context, stored in the guard row so an
// operator (exactly inspect) can find the record a row came from.
type RecordClaim struct {
	Scope, Key string
	Topic      string
	Partition  int32
	Offset     int64
	// TraceID is the record's trace (hex); "" stores NULL.
	TraceID string
	// Handler is the name of the handler that processes the record.
	Handler string
}

// DeadLetterKey is the key of the mark left for a dead-lettered record that
// has no usable key of its own (it could not be decoded or keyed): its
// coordinates, "dead-letter:<topic>/<partition>/<offset>". A redelivery of
// the record claims the same key and is a duplicate.
func DeadLetterKey(topic string, partition int32, offset int64) string {
	b := make([]byte, 0, len("dead-letter:")+len(topic)+24)
	b = append(b, "dead-letter:"...)
	b = append(b, topic...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(partition), 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, offset, 10)
	return string(b)
}

// ClaimRecords claims the keys of many records inside tx in one statement,
// each in its own scope, and stores the records' coordinates with the rows.
// The result is aligned with claims. A (scope, key) repeated within claims
// is Applied at most at its first occurrence. Rows are claimed in sorted
// order, so overlapping batches wait for each other instead of
// deadlocking.
//
// A key whose row is marked dead-lettered (see MarkDeadLettered) is a
// Duplicate for the record that was dead-lettered (same topic, partition
// and offset: a redelivery) and Applied, once, for a record at other
// coordinates (a replay from the dead-letter topic, a producer's copy):
// that record takes the row over and its effect runs. A record that was
// itself dead-lettered earlier (its coordinates are marked) is a Duplicate
// and never takes the row over.
//
// Keys are normalized with NormalizeKey. No claims returns nil without a
// round trip. ClaimRecords fails, claiming nothing, wrapping ErrEmptyKey or
// ErrInvalidScope (naming the index), and wraps the database error
// otherwise (tx is then aborted).
func (g *Guard) ClaimRecords(ctx context.Context, tx pgx.Tx, claims []RecordClaim) ([]Outcome, error) {
	if len(claims) == 0 {
		return nil, nil
	}
	sql, args, err := g.claimQuery(claims)
	if err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("dedupe: claim %d records: %w", len(claims), err)
	}
	out := make([]Outcome, len(claims))
	if err := readClaimed(rows, out); err != nil {
		return nil, fmt.Errorf("dedupe: claim %d records: %w", len(claims), err)
	}
	return out, nil
}

// QueueClaimRecords queues on batch the statement ClaimRecords executes,
// so that the claim shares a round trip with the statements around it
// (BEGIN, the lock keys). When the batch's results are read (Close), the
// outcomes, aligned with claims, are stored in out, which must have
// len(claims) elements; the batch then fails with the claim's error. It
// fails at once, queuing nothing, as ClaimRecords does for invalid claims.
// No claims queue nothing.
func (g *Guard) QueueClaimRecords(batch *pgx.Batch, claims []RecordClaim, out []Outcome) error {
	if len(claims) == 0 {
		return nil
	}
	if len(out) != len(claims) {
		return fmt.Errorf("dedupe: claim records: %d outcomes for %d claims", len(out), len(claims))
	}
	sql, args, err := g.claimQuery(claims)
	if err != nil {
		return err
	}
	batch.Queue(sql, args...).Query(func(rows pgx.Rows) error {
		if err := readClaimed(rows, out); err != nil {
			return fmt.Errorf("dedupe: claim %d records: %w", len(claims), err)
		}
		return nil
	})
	return nil
}

// QueueClaimNew queues on batch the insert of c's guard row alone, without
// the takeover of ClaimRecords: the claim of a record whose key is new, as
// most are. When the batch's results are read (Close), *inserted reports
// whether the row was inserted, in which case the record applies, as
// ClaimRecords would have said; the batch fails with the statement's error.
// When it was not inserted, the key's row exists (committed: the insert
// waits for a transaction that holds the key; or in a sealed generation,
// whose rows the insert checks first), and ClaimRecords with the
// same claim, in the same transaction, gives the record's outcome: a
// duplicate, or the takeover of a key dead-lettered at other coordinates.
// For PostgreSQL the insert alone costs about half the single-record
// statement of ClaimRecords, whose takeover clause sets up its subqueries
// on every execution. It fails at once, queuing nothing, for a claim that
// ClaimRecords refuses.
func (g *Guard) QueueClaimNew(batch *pgx.Batch, c RecordClaim, inserted *bool) error {
	if err := checkClaim(0, c); err != nil {
		return err
	}
	*inserted = false
	key, scope := c.Key, c.Scope // not c: the callback would move it to the heap
	batch.Queue(g.claimNewSQL, c.Scope, NormalizeKey(c.Key), c.Topic, c.Partition, c.Offset, c.TraceID, c.Handler).Query(func(rows pgx.Rows) error {
		*inserted = rows.Next()
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("dedupe: claim %q in scope %q: %w", key, scope, err)
		}
		return nil
	})
	return nil
}

// claimQuery checks claims and returns the statement that claims them and
// its arguments: claimOneSQL for a single claim, claimRecordsSQL otherwise.
func (g *Guard) claimQuery(claims []RecordClaim) (string, []any, error) {
	if len(claims) != 1 {
		args, err := claimArgs(claims)
		return g.claimRecordsSQL, args, err
	}
	c := claims[0]
	if err := checkClaim(0, c); err != nil {
		return "", nil, err
	}
	return g.claimOneSQL, []any{c.Scope, NormalizeKey(c.Key), c.Topic, c.Partition, c.Offset, c.TraceID, c.Handler}, nil
}

// checkClaim checks the claim at index i of a ClaimRecords call.
func checkClaim(i int, c RecordClaim) error {
	if c.Key == "" {
		return fmt.Errorf("dedupe: claim records: key at index %d: %w", i, ErrEmptyKey)
	}
	if err := checkScope(c.Scope); err != nil {
		return fmt.Errorf("dedupe: claim records: index %d: %w", i, err)
	}
	if strings.IndexByte(c.TraceID, ',') >= 0 {
		return fmt.Errorf("dedupe: claim records: index %d: trace id %q is not hex", i, c.TraceID)
	}
	return nil
}

// claimArgs checks claims and returns the arguments of claimRecordsSQL.
func claimArgs(claims []RecordClaim) ([]any, error) {
	n := len(claims)
	var scopes, topics, handlers dict
	keys := make([]string, n)
	scopeIdx, topicIdx, handlerIdx, partitions := make([]int32, n), make([]int32, n), make([]int32, n), make([]int32, n)
	offsets := make([]int64, n)
	var traces strings.Builder
	traces.Grow(n * 33) // a trace id is 32 hex digits
	for i, c := range claims {
		if err := checkClaim(i, c); err != nil {
			return nil, err
		}
		keys[i] = NormalizeKey(c.Key)
		scopeIdx[i], topicIdx[i], handlerIdx[i] = scopes.index(c.Scope), topics.index(c.Topic), handlers.index(c.Handler)
		partitions[i], offsets[i] = c.Partition, c.Offset
		if i > 0 {
			traces.WriteByte(',')
		}
		traces.WriteString(c.TraceID)
	}
	return []any{scopes.values, scopes.indexes(scopeIdx), pgarray.Text(keys), topics.values, topics.indexes(topicIdx),
		pgarray.Once(partitions), offsets, traces.String(), handlers.values, handlers.indexes(handlerIdx)}, nil
}

// indexes returns idx, the dictionary's index of each claim, or none when
// the dictionary holds one value (claimRecordsSQL reads a missing index
// as 1).
func (d *dict) indexes(idx []int32) []int32 {
	if len(d.values) == 1 {
		return idx[:0]
	}
	return idx
}

// MarkDeadLettered marks the guard row of c's key dead-lettered inside tx,
// the transaction that writes the dead letter, inserting the row when the
// key was not claimed (a record without a usable key, marked under
// DeadLetterKey; a naturally idempotent handler's record). The row keeps
// c's coordinates, so that a redelivery of the same record is a duplicate
// and no second dead letter is written, while another record of the key
// takes it over once (see ClaimRecords). A keyed record also leaves a row
// under DeadLetterKey of its coordinates, so that its redelivery stays a
// duplicate after another record took the key's row over (a producer's
// copy, dead-lettered in turn). A row applied by another handler (one
// given the same scope) is left applied. Pruning deletes
// marks like any guard row. MarkDeadLettered fails wrapping ErrEmptyKey, ErrInvalidScope
// or the database error (tx is then aborted).
func (g *Guard) MarkDeadLettered(ctx context.Context, tx pgx.Tx, c RecordClaim) error {
	if c.Key == "" {
		return fmt.Errorf("dedupe: mark dead-lettered in scope %q: %w", c.Scope, ErrEmptyKey)
	}
	if err := checkScope(c.Scope); err != nil {
		return fmt.Errorf("dedupe: mark dead-lettered: %w", err)
	}
	coords := NormalizeKey(DeadLetterKey(c.Topic, c.Partition, c.Offset))
	if _, err := tx.Exec(ctx, g.markDeadSQL, c.Scope, NormalizeKey(c.Key), c.Topic, c.Partition, c.Offset, c.TraceID, c.Handler, coords); err != nil {
		return fmt.Errorf("dedupe: mark %q dead-lettered in scope %q: %w", c.Key, c.Scope, err)
	}
	return nil
}

// dict numbers distinct strings from 1 (PostgreSQL arrays are 1-based), in
// the order they are first seen. Batches hold one or a few distinct
// values, so a linear search beats a map.
type dict struct{ values []string }

func (d *dict) index(s string) int32 {
	for i, v := range d.values {
		if v == s {
			return int32(i + 1)
		}
	}
	d.values = append(d.values, s)
	return int32(len(d.values))
}
