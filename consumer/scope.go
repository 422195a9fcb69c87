package consumer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/handler"
)

// ScopeChangeError reports that a handler brings another scope than the one
// its consumer group recorded for the same topic (and route): a handler
// renamed without [handler.WithScope], say credit-v1 to credit-v2 in a
// rolling deploy. Keys claimed in the new scope are not deduplicated
// against the old one, so while members of both run, every key is applied
// twice, once by each. [Consumer.Run] returns it (joined with the others
// when several handlers changed) before it joins the group; test for it
// with errors.As.
//
// The way out: keep the old scope (handler.WithScope(OldScope) on the
// renamed handler), or, for a deliberate change of scope, stop every member
// that runs the old one and start one member with Config.AllowScopeChange
// (EXACTLY_ALLOW_SCOPE_CHANGE=true): it records the new scope, and later
// members need no flag.
type ScopeChangeError struct {
	// Group and Topic are the consumer group and the topic.
	Group, Topic string
	// Route is the Router's routed type ("deposit", "outer/inner" through
	// nested routers), or "" for a handler that is not routed.
	Route string
	// OldScope and OldHandler are what the group recorded; LastSeen is
	// when a member last started with them.
	OldScope, OldHandler string
	LastSeen             time.Time
	// NewScope and NewHandler are what this member brings.
	NewScope, NewHandler string
}

// Error names the group, topic, both scopes and the way out.
func (e *ScopeChangeError) Error() string {
	where := fmt.Sprintf("topic %q", e.Topic)
	if e.Route != "" {
		where += fmt.Sprintf(" (route %q)", e.Route)
	}
	return fmt.Sprintf("consumer group %q, %s: handler %q claims keys in scope %q, but the group's handler %q used scope %q (a member last started with it at %s); "+
		"keys in one scope are not deduplicated against the other, so members running both would apply every key twice. "+
		"To rename a handler, keep its scope: handler.WithScope(%q). To change the scope deliberately, stop every member that runs scope %q, "+
		"then start one with Config.AllowScopeChange (EXACTLY_ALLOW_SCOPE_CHANGE=true)",
		e.Group, where, e.NewHandler, e.NewScope, e.OldHandler, e.OldScope, e.LastSeen.UTC().Format(time.RFC3339),
		e.OldScope, e.OldScope)
}

// scopeUse is one (topic, route) a member consumes, with the scope and
// name of the handler that claims its keys.
type scopeUse struct {
	topic, route, scope, handler string
}

// scopeUses lists the scopes the consumer's handlers claim keys in, per
// topic and route: one per topic for a handler, one per routed type for a
// Router (its own name, the scope of records no route takes, is not
// recorded: such records are dead-lettered, never claimed by a handler).
// Sorted, so that concurrent members lock the rows in one order.
func (c *Consumer) scopeUses() []scopeUse {
	var uses []scopeUse
	for _, topic := range c.topics {
		var walk func(route string, h handler.Any)
		walk = func(route string, h handler.Any) {
			r, ok := h.(*handler.Router)
			if !ok {
				uses = append(uses, scopeUse{topic: topic, route: route, scope: h.Scope(), handler: h.Name()})
				return
			}
			for _, typ := range r.Types() {
				sub, _ := r.Handler(typ)
				if route != "" {
					typ = route + "/" + typ
				}
				walk(typ, sub)
			}
		}
		walk("", c.routes[topic])
	}
	slices.SortFunc(uses, func(a, b scopeUse) int {
		return strings.Compare(a.topic+"\x00"+a.route, b.topic+"\x00"+b.route)
	})
	return uses
}

// registerScopes records, in the guard's scopes table (see
// dedupe.Guard.ScopesTable), the scope of every (topic, route) this member
// consumes for its group, in one transaction. A (topic, route) recorded
// with another scope fails with a [*ScopeChangeError] (all of them joined)
// and records nothing, unless Config.AllowScopeChange is set: then the new
// scope replaces the old and an error-level line says so. Rows with the
// same scope get last_seen (and the handler's current name) updated.
// Database failures are returned wrapped.
func (c *Consumer) registerScopes(ctx context.Context) error {
	table := c.guard.ScopesTable().Sanitize()
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("recording the handlers' scopes in %s: %w", table, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	var changes []error
	var changed []*ScopeChangeError
	for _, u := range c.scopeUses() {
		// The insert makes a concurrent first registration of the same
		// row wait for this one, and the lock makes later ones wait until
		// this transaction ends.
		if _, err := tx.Exec(ctx, `insert into `+table+` (consumer_group, topic, route, scope, handler) values ($1, $2, $3, $4, $5)
on conflict (consumer_group, topic, route) do nothing`, c.cfg.Group, u.topic, u.route, u.scope, u.handler); err != nil {
			return fmt.Errorf("recording scope %q of handler %q on topic %q in %s: %w", u.scope, u.handler, u.topic, table, err)
		}
		var old ScopeChangeError
		if err := tx.QueryRow(ctx, `select scope, handler, last_seen from `+table+` where consumer_group = $1 and topic = $2 and route = $3 for update`,
			c.cfg.Group, u.topic, u.route).Scan(&old.OldScope, &old.OldHandler, &old.LastSeen); err != nil {
			return fmt.Errorf("reading the recorded scope of topic %q in %s: %w", u.topic, table, err)
		}
		update := `update ` + table + ` set handler = $4, last_seen = now() where consumer_group = $1 and topic = $2 and route = $3 and scope = $5`
		if old.OldScope != u.scope {
			e := &ScopeChangeError{Group: c.cfg.Group, Topic: u.topic, Route: u.route, OldScope: old.OldScope, OldHandler: old.OldHandler,
				LastSeen: old.LastSeen, NewScope: u.scope, NewHandler: u.handler}
			if !c.cfg.AllowScopeChange {
				changes = append(changes, e)
				continue
			}
			changed = append(changed, e)
			update = `update ` + table + ` set scope = $5, handler = $4, first_seen = now(), last_seen = now() where consumer_group = $1 and topic = $2 and route = $3`
		}
		if _, err := tx.Exec(ctx, update, c.cfg.Group, u.topic, u.route, u.handler, u.scope); err != nil {
			return fmt.Errorf("recording scope %q of handler %q on topic %q in %s: %w", u.scope, u.handler, u.topic, table, err)
		}
	}
	if len(changes) > 0 {
		return errors.Join(changes...)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("recording the handlers' scopes in %s: commit: %w", table, err)
	}
	for _, e := range changed {
		c.log.Error("SCOPE CHANGED (Config.AllowScopeChange): keys are now claimed in a new scope and are not deduplicated against the old one; a member still running the old scope applies every key a second time",
			"group", e.Group, "topic", e.Topic, "route", e.Route, "old_scope", e.OldScope, "old_handler", e.OldHandler,
			"new_scope", e.NewScope, "new_handler", e.NewHandler, "old_scope_last_started", e.LastSeen)
	}
	return nil
}

// checkScopes runs registerScopes for Run. When the database cannot be
// reached (no connection, a timeout) it logs a warning and returns nil, as
// the schema check does, since the batches will be retried until it is
// back; any other failure (a [*ScopeChangeError], a statement the database
// refused such as a missing grant) stops the consumer.
func (c *Consumer) checkScopes(ctx context.Context) error {
	err := c.registerScopes(ctx)
	var connErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case err == nil:
		return nil
	case !errors.As(err, &connErr) && !errors.As(err, &netErr) && !pgconn.Timeout(err):
		return fmt.Errorf("consumer: %w", err)
	}
	c.log.Warn("could not record the handlers' scopes before joining the group; consuming anyway, without the check against a handler renamed in a rolling deploy",
		"scopes_table", c.guard.ScopesTable().Sanitize(), "error", err)
	return nil
}
