package dedupe

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/runtime/migrate"
)

// SetAfterLock installs a hook PruneOnce calls while it holds the pruners'
// advisory lock (tests only).
func SetAfterLock(p *Pruner, f func()) { p.afterLock = f }

// MigrateTo applies g's migrations up to version only (tests of a later
// migration's data step).
func MigrateTo(ctx context.Context, g *Guard, pool *pgxpool.Pool, version int) error {
	migs, err := g.migrations()
	if err != nil {
		return err
	}
	var upTo []migrate.Migration
	for _, m := range migs {
		if m.Version <= version {
			upTo = append(upTo, m)
		}
	}
	_, err = migrate.Apply(ctx, pool, g.component(), upTo)
	return err
}

// ClaimedSQL returns the statement of Guard.Claimed (tests of its plan).
func ClaimedSQL(g *Guard) string { return g.claimedSQL }

// SetLockTimeout sets the lock timeout of a Pruner's rotations, counts and
// drops (tests that hold a generation's lock on purpose).
func SetLockTimeout(p *Pruner, timeout string) { p.lockTimeout = timeout }
