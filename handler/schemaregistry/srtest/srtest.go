package srtest

import (
	"net/http"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// Registry is an in-memory schema registry listening on a local port.
// Its methods (those of srfake.Registry: SeedSchema, RegisterSchema, …)
// are safe for concurrent use. Close it when done.
type Registry struct {
	*srfake.Registry
	down     atomic.Bool
	requests atomic.Int64
	refused  atomic.Int64
}

// New starts a registry.
func New(opts ...srfake.Option) *Registry {
	r := &Registry{Registry: srfake.New(opts...)}
	r.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
		r.requests.Add(1)
		if r.down.Load() {
			r.refused.Add(1)
			http.Error(w, `{"error_code":50301,"message":"srtest: registry down"}`, http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	return r
}

// SetDown takes the registry down (every request answered 503 Service
// Unavailable) or brings it back.
func (r *Registry) SetDown(down bool) { r.down.Store(down) }

// Requests returns how many requests the registry received, refused ones
// included.
func (r *Registry) Requests() int64 { return r.requests.Load() }

// Refused returns how many requests the registry answered 503 while down.
func (r *Registry) Refused() int64 { return r.refused.Load() }
