package dedupe

// SetAfterLock installs a hook PruneOnce calls while it holds the pruners'
// advisory lock (tests only).
func SetAfterLock(p *Pruner, f func()) { p.afterLock = f }
