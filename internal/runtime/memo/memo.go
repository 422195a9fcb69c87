// Package memo remembers the results of external calls made by the handlers
// of one executor run across its transactions. When a later record
// of the batch fails, the batch is replayed in a fresh transaction and the
// earlier records' handlers run again; dedupe.Effects finds the result of
// the call they made in the rolled-back transaction here and records it
// again instead of calling the external system a second time.
package memo

import (
	"context"
	"sync"
)

// Memo holds the call results of one executor run (one batch, across its
// replays), by effects table, scope and key. It is safe for concurrent use
// (a handler may call from several goroutines).
type Memo struct {
	mu      sync.Mutex
	results map[string][]byte
	strict  bool
}

type ctxKey struct{}

// With returns ctx carrying m.
func With(ctx context.Context, m *Memo) context.Context {
	return context.WithValue(ctx, ctxKey{}, m)
}

// From returns the memo ctx carries, or nil.
func From(ctx context.Context) *Memo {
	m, _ := ctx.Value(ctxKey{}).(*Memo)
	return m
}

// Get returns the result remembered under key. A nil Memo remembers
// nothing.
func (m *Memo) Get(key string) ([]byte, bool) {
	if m == nil {
		return nil, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.results[key]
	return r, ok
}

// Put remembers result under key. Put on a nil Memo does nothing.
func (m *Memo) Put(key string, result []byte) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.results == nil {
		m.results = map[string][]byte{}
	}
	m.results[key] = result
}

// SetStrict asks that remembered results be recorded at once, reading
// back the result that stands, instead of with the batch's deferred writes
// (see dedupe's "Recording a remembered result later"): the record's
// deferred writes failed. On a nil Memo it does nothing.
func (m *Memo) SetStrict() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.strict = true
}

// Strict reports whether SetStrict was called on m, or on a memo copied
// into it.
func (m *Memo) Strict() bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.strict
}

// CopyFrom remembers every result of o in m (a nil m or o does nothing):
// the results of a record's pre-transaction call, in its batch's memo. A
// strict o makes m strict.
func (m *Memo) CopyFrom(o *Memo) {
	if m == nil || o == nil || m == o {
		return
	}
	o.mu.Lock()
	if len(o.results) == 0 && !o.strict {
		o.mu.Unlock()
		return
	}
	strict := o.strict
	results := make(map[string][]byte, len(o.results))
	for k, v := range o.results {
		results[k] = v
	}
	o.mu.Unlock()
	for k, v := range results {
		m.Put(k, v)
	}
	if strict {
		m.SetStrict()
	}
}
