package dedupe

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/runtime/deferred"
	"github.com/exactly-go/exactly/internal/runtime/memo"
	"github.com/exactly-go/exactly/internal/runtime/pgarray"
)

// Recording a remembered result later. Inside a consumer's batch, a result
// that Call finds remembered (a handler.WithCall call made it before the
// transaction, or an earlier run of the record) needs no answer from the
// database to go on: Call queues its row with the batch's deferred writes
// (the outbox's rows go the same way) and returns it. The rows of a batch
// and table are written by one statement just before COMMIT, in the
// pipeline that commits. That statement keeps Call's contract, that a
// result recorded first wins: where another result is recorded already, it
// fails (SQLSTATE 22P02, naming the scope and key). The consumer then
// fails the record that queued it, and its next attempt records and reads
// in one statement at once (settle), so its handler gets the recorded
// result.

// laterQueue is the effect rows one transaction queued for an effects
// table.
type laterQueue struct {
	e       *Effects
	scopes  []string
	keys    []string
	results [][]byte
	at      map[string]int // scope and key → index, for a key queued twice
}

// recordLater queues result as done for (scope, nkey) in buf and returns the
// result that the transaction records: result, or the result queued first
// for the same key.
func (e *Effects) recordLater(buf *deferred.Buffer, scope, nkey string, result []byte) []byte {
	if result == nil {
		result = []byte{}
	}
	q := buf.Queue(laterKey{e.quoted}, func() deferred.Flusher { return &laterQueue{e: e, at: map[string]int{}} }).(*laterQueue)
	k := scope + "\x00" + nkey
	if i, ok := q.at[k]; ok {
		return q.results[i]
	}
	q.at[k] = len(q.keys)
	q.scopes, q.keys, q.results = append(q.scopes, scope), append(q.keys, nkey), append(q.results, result)
	return result
}

// laterKey names an effects table's queue in a deferred.Buffer.
type laterKey struct{ table string }

// Flush writes the queued rows in tx with one statement.
func (q *laterQueue) Flush(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, q.e.laterSQL, pgarray.Text(q.scopes), pgarray.Text(q.keys), pgarray.Bytea(q.results)); err != nil {
		return fmt.Errorf("dedupe: recording %d effect results in %s: %w", len(q.keys), q.e.quoted, err)
	}
	return nil
}

// laterSQL returns the statement that records queued results in table t
// (see "Recording a remembered result later"): rows not recorded yet are
// written; a key with another "done" result, or one a transaction
// committed while the statement ran (invisible to its snapshot), fails the
// statement with a cast error that names it.
func laterSQL(t string) string {
	return `with r as (select * from unnest($1::text[], $2::text[], $3::bytea[]) as r(scope, key, result)),
w as (insert into ` + t + ` as e (scope, key, state, result, done_at)
select scope, key, 'done', result, now() from r
on conflict (scope, key) do update set state = 'done', result = excluded.result, done_at = excluded.done_at
where e.state <> 'done'
returning e.scope, e.key)
select ('exactly: effect ' || r.scope || '/' || r.key || ' already has another result recorded')::int from r
where not exists (select from w where w.scope = r.scope and w.key = r.key)
and not exists (select from ` + t + ` d where d.scope = r.scope and d.key = r.key and d.state = 'done' and d.result = r.result)`
}

// laterBuffer returns the buffer of deferred writes that ctx carries for
// tx, when a remembered result may be recorded later: inside a consumer's
// batch whose memo m does not ask for results to be read back at once.
func laterBuffer(ctx context.Context, tx pgx.Tx, m *memo.Memo) *deferred.Buffer {
	if m == nil || m.Strict() {
		return nil
	}
	return deferred.For(ctx, tx)
}
