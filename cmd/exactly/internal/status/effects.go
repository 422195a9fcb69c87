package status

import (
	"context"
	"encoding/hex"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// EffectRow is a key's row of the guard's effects table (dedupe.Effects):
// the recorded result of an external call made for it.
type EffectRow struct {
	Scope string `json:"scope"`
	Key   string `json:"key"`
	// State is "done" (Result is the recorded result) or "started" (a
	// CallReconciled call began and its outcome is not known).
	State string `json:"state"`
	// Result is the recorded result as text when it is UTF-8 (JSON, as
	// dedupe.CallJSON and handler.NewWithCall record it), else "0x" and
	// its bytes in hex; empty when none is recorded.
	Result    string     `json:"result,omitempty"`
	Attempts  int        `json:"attempts"`
	StartedAt *time.Time `json:"started_at,omitempty"`
	DoneAt    *time.Time `json:"done_at,omitempty"`
}

// maxEffectRows bounds the effect rows Inspect reads for one key.
const maxEffectRows = 100

// readEffects reads into rep the effects rows whose key is rep's key or
// one of its guard rows' keys (in opts.Scope when set). A missing effects
// table leaves rep.EffectsKnown false.
func readEffects(ctx context.Context, tx pgx.Tx, cfg Config, scope string, rep *KeyReport) error {
	et := cfg.Guard.EffectsTable()
	rep.Effects = []EffectRow{}
	if err := tx.QueryRow(ctx, tableExistsSQL, et.Sanitize()).Scan(&rep.EffectsKnown); err != nil {
		return fmt.Errorf("looking up %s: %w", et.Sanitize(), err)
	}
	if !rep.EffectsKnown {
		return nil
	}
	keys := []string{rep.Key}
	for _, g := range rep.Guard {
		keys = append(keys, g.Key)
	}
	sql := `select scope, key, state, result, attempts, started_at, done_at from ` + et.Sanitize() +
		` where key = any($1) and ($2 = '' or scope = $2) order by scope, key limit $3`
	rows, err := tx.Query(ctx, sql, keys, scope, maxEffectRows)
	if err != nil {
		return fmt.Errorf("reading the effects of %q from %s: %w", rep.Key, et.Sanitize(), err)
	}
	defer rows.Close()
	for rows.Next() {
		var e EffectRow
		var result []byte
		if err := rows.Scan(&e.Scope, &e.Key, &e.State, &result, &e.Attempts, &e.StartedAt, &e.DoneAt); err != nil {
			return fmt.Errorf("reading the effects of %q from %s: %w", rep.Key, et.Sanitize(), err)
		}
		switch {
		case result == nil:
		case utf8.Valid(result):
			e.Result = string(result)
		default:
			e.Result = "0x" + hex.EncodeToString(result)
		}
		rep.Effects = append(rep.Effects, e)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading the effects of %q from %s: %w", rep.Key, et.Sanitize(), err)
	}
	return nil
}
