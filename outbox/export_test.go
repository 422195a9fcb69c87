package outbox

// SetPauses makes r call f at each of its pause points ("produce",
// "commit", "renew", "hold"): f blocking stands for the process paused there. Call
// it before Run.
func SetPauses(r *Relay, f func(point string)) { r.pauses = f }
