package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/exactly-go/exactly/internal/runtime/redact"
)

// readyTimeout bounds the database checks of one readiness probe, below
// the probe timeouts docs/observability.md recommends (3s).
const readyTimeout = 2 * time.Second

// Readiness is the answer of [Service.Ready] and the JSON body of /readyz:
// whether the service is ready and, check by check, why (not).
type Readiness struct {
	// Ready is true when every check passed.
	Ready bool `json:"ready"`
	// Checks are "group" (the consumer joined its group), "database" (a
	// pooled connection answers) and "schema" (the guard and outbox
	// tables are migrated), in that order.
	Checks []ReadyCheck `json:"checks"`
}

// ReadyCheck is one readiness check.
type ReadyCheck struct {
	// Name is "group", "database" or "schema".
	Name string `json:"name"`
	// OK says whether the check passed.
	OK bool `json:"ok"`
	// Detail says why it failed (the error, secrets scrubbed), or what
	// passed.
	Detail string `json:"detail,omitempty"`
}

// Ready checks, within ctx and at most 2s of database time, whether the
// service is ready: its consumer has joined the group (a member with no
// partitions assigned counts: the group chose not to give it any), the
// database answers on the service's pool, and the guard and outbox tables
// are at the schema this build needs ([Service.CheckSchema]). The schema is
// checked only when the database answers. It never fails: a failed check
// is reported in the result with its reason, database errors scrubbed of
// the configuration's secrets. /readyz on Config.MetricsAddr serves it.
func (s *Service) Ready(ctx context.Context) Readiness {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	r := Readiness{Ready: true}
	add := func(name string, err error, ok string) {
		c := ReadyCheck{Name: name, OK: err == nil, Detail: ok}
		if err != nil {
			c.Detail = redact.Scrub(err.Error(), s.cfg.Secrets()...)
			r.Ready = false
		}
		r.Checks = append(r.Checks, c)
	}
	var group error
	if !s.consumer.joined.Load() {
		group = errors.New("not a member of group " + s.cfg.Group + " (joining, rebalancing, or stopped)")
	}
	add("group", group, "member of group "+s.cfg.Group)
	if err := s.pool.Ping(ctx); err != nil {
		add("database", err, "")
		add("schema", errors.New("not checked: the database does not answer"), "")
		return r
	}
	add("database", nil, "answers")
	add("schema", s.CheckSchema(ctx), "guard "+s.guard.Table().Sanitize()+" and outbox "+s.outbox.Table().Sanitize()+" are current")
	return r
}

// healthHandlers adds /healthz and /readyz to mux. /healthz answers 200
// while the process serves HTTP: a liveness probe, which depends on
// nothing outside the process (an outage of the database or the brokers is
// retried, never a reason to restart). /readyz answers 200 when
// [Service.Ready] says ready and 503 otherwise, with the Readiness as JSON
// either way.
func (s *Service) healthHandlers(mux *http.ServeMux) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, req *http.Request) {
		r := s.Ready(req.Context())
		body, err := json.Marshal(r)
		if err != nil { // a struct of strings and bools always marshals
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !r.Ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write(append(body, '\n'))
	})
}
