package handler

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/exactly-go/exactly/internal/runtime/workunit"
)

// Discriminator says where a [Router] reads a record's type: a header
// ([ByHeader]) or a field of the JSON payload ([ByField]). The zero value
// is invalid and makes [Router.Validate] fail.
type Discriminator struct {
	desc string
	fn   func(rec *Record) (string, bool, error)
}

// ByHeader reads the type from the header name (the last one when it
// repeats), e.g. ByHeader("type") for a record carrying "type: deposit".
// A record without it is dead-lettered with a [*RouteError].
func ByHeader(name string) Discriminator {
	return Discriminator{desc: "header " + name, fn: func(rec *Record) (string, bool, error) {
		v, ok := rec.Header(name)
		return string(v), ok && len(v) > 0, nil
	}}
}

// ByField reads the type from a top-level string field of the record's
// JSON value, e.g. ByField("type") for {"type":"deposit", …}. The value is
// decoded once for the field and again by the chosen handler's codec. A
// value that is not a JSON object, or whose field is missing, empty or not
// a string, is dead-lettered with a [*RouteError].
func ByField(name string) Discriminator {
	return Discriminator{desc: "JSON field " + name, fn: func(rec *Record) (string, bool, error) {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(rec.Value, &fields); err != nil {
			return "", false, fmt.Errorf("the value is not a JSON object: %w", err)
		}
		raw, ok := fields[name]
		if !ok {
			return "", false, nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", false, fmt.Errorf("field %q is not a string: %s", name, raw)
		}
		return s, s != "", nil
	}}
}

// String describes the discriminator: "header type" or "JSON field type".
func (d Discriminator) String() string { return d.desc }

// RouteError reports a record a [Router] could not hand to any handler: its
// type is missing, unreadable, or names no route. It is permanent: the
// consumer dead-letters the record with this error as the reason, having
// run no handler (attempts=0).
type RouteError struct {
	// Router is the router's name.
	Router string
	// Discriminator describes where the type was read ("header type").
	Discriminator string
	// Type is the type read; "" when missing.
	Type string
	// Known lists the routed types, sorted.
	Known []string
	// Err is why the type could not be read, if that was the problem.
	Err error
}

// Error says what type was found (or not), where, and which are known.
func (e *RouteError) Error() string {
	known := strings.Join(e.Known, ", ")
	switch {
	case e.Err != nil:
		return fmt.Sprintf("router %s: reading the type from %s: %v (known types: %s)", e.Router, e.Discriminator, e.Err, known)
	case e.Type == "":
		return fmt.Sprintf("router %s: no type in %s (known types: %s)", e.Router, e.Discriminator, known)
	default:
		return fmt.Sprintf("router %s: unknown type %q in %s (known types: %s)", e.Router, e.Type, e.Discriminator, known)
	}
}

// Unwrap returns why the type could not be read, or nil.
func (e *RouteError) Unwrap() error { return e.Err }

// A RouteOption adds one route to a [Router]; build it with [Route].
type RouteOption struct {
	typ string
	h   Any
}

// Route sends records whose type is typ to h, a handler of any form
// ([*Handler], [*Pipelined], [*Set]) and payload type. h keeps its own name, key source, codec and scope: two routes are
// two handlers that happen to share a topic.
func Route(typ string, h Any) RouteOption { return RouteOption{typ: typ, h: h} }

// Router is several typed handlers on one topic, chosen per record by a
// [Discriminator]: a wallet's "deposit" and "transfer" commands, each with
// its own payload type, key and scope. Pass it to consumer.Handle like a
// handler. A record whose type is missing or unknown is dead-lettered with
// a [*RouteError] naming the type and the known ones. Build it with
// [NewRouter]; it is immutable and safe for concurrent use.
type Router struct {
	unitHook // the runtime's PrepareUnit (see [Any]); NewRouter sets it
	name     string
	disc     Discriminator
	routes   map[string]Any
	known    []string
	valid    error
}

// NewRouter builds a router called name (it names the router in logs and
// errors; each record is claimed in its chosen handler's scope). It never
// fails; an invalid router (empty name, unset discriminator, no routes, an
// empty or repeated type, a nil or invalid handler, two routes whose
// handlers share a name) reports the problem from [Router.Validate], which
// the consumer calls at start-up.
func NewRouter(name string, d Discriminator, routes ...RouteOption) *Router {
	r := &Router{name: name, disc: d, routes: map[string]Any{}}
	r.unitHook = workunit.NewHook(r.prepareUnit, r.hasCall)
	var problems []error
	if name == "" {
		problems = append(problems, errors.New("router has an empty name"))
	}
	if d.fn == nil {
		problems = append(problems, fmt.Errorf("router %q has no discriminator: use handler.ByHeader or handler.ByField", name))
	}
	if len(routes) == 0 {
		problems = append(problems, fmt.Errorf("router %q has no routes", name))
	}
	names := map[string]string{}
	for _, rt := range routes {
		switch {
		case rt.typ == "":
			problems = append(problems, fmt.Errorf("router %q: a route has an empty type", name))
			continue
		case rt.h == nil:
			problems = append(problems, fmt.Errorf("router %q: route %q has a nil handler", name, rt.typ))
			continue
		}
		if _, dup := r.routes[rt.typ]; dup {
			problems = append(problems, fmt.Errorf("router %q: type %q is routed twice", name, rt.typ))
			continue
		}
		if err := rt.h.Validate(); err != nil {
			problems = append(problems, fmt.Errorf("router %q: route %q: %w", name, rt.typ, err))
		}
		if prev, dup := names[rt.h.Name()]; dup {
			problems = append(problems, fmt.Errorf("router %q: types %q and %q route to two handlers named %q", name, prev, rt.typ, rt.h.Name()))
		}
		names[rt.h.Name()] = rt.typ
		r.routes[rt.typ] = rt.h
		r.known = append(r.known, rt.typ)
	}
	slices.Sort(r.known)
	r.valid = errors.Join(problems...)
	return r
}

// Name returns the router's name.
func (r *Router) Name() string { return r.name }

// Scope returns the router's name. Records are claimed in the scope of the
// handler chosen for them (see [Router.Key]); this is the router's own
// namespace, used where no handler could be chosen.
func (r *Router) Scope() string { return r.name }

// hasCall reports whether any routed handler has a pre-transaction call.
func (r *Router) hasCall() bool {
	for _, h := range r.routes {
		if h.UnitCalls() {
			return true
		}
	}
	return false
}

// Guarded reports whether any routed handler claims a guard row.
func (r *Router) Guarded() bool {
	for _, h := range r.routes {
		if h.Guarded() {
			return true
		}
	}
	return false
}

// KeySource describes the routes' key sources, "deposit=payload,
// transfer=header:id", in type order.
func (r *Router) KeySource() string {
	parts := make([]string, 0, len(r.known))
	for _, t := range r.known {
		parts = append(parts, t+"="+r.routes[t].KeySource())
	}
	return strings.Join(parts, ", ")
}

func (r *Router) sealed() {}

// Validate reports why the router cannot run (every problem, joined), or
// nil.
func (r *Router) Validate() error { return r.valid }

// Types returns the routed types, sorted.
func (r *Router) Types() []string { return slices.Clone(r.known) }

// Handler returns the handler routed for typ, and whether there is one.
func (r *Router) Handler(typ string) (Any, bool) {
	h, ok := r.routes[typ]
	return h, ok
}

// Key reads rec's type, and decodes and keys rec with the handler routed
// for it, as the consumer does (the record is then claimed in that
// handler's scope and run by it). It fails with a [*RouteError] when the
// type is missing, unreadable or unknown, and otherwise as the chosen
// handler's Key does.
func (r *Router) Key(rec Record) (string, error) {
	h, err := r.route(&rec)
	if err != nil {
		return "", err
	}
	return h.Key(rec)
}

// prepareUnit prepares rec with the handler routed for it (see [Any]);
// the result carries that handler's key, scope and name. It fails as
// [Router.Key] does.
func (r *Router) prepareUnit(rec Record) (workunit.Prepared, error) {
	h, err := r.route(&rec)
	if err != nil {
		return workunit.Prepared{}, err
	}
	return h.PrepareUnit(rec)
}

// route returns the handler routed for rec's type, or the router's
// problem, or a [*RouteError] when the type is missing, unreadable or
// unknown.
func (r *Router) route(rec *Record) (Any, error) {
	if r.valid != nil {
		return nil, r.valid
	}
	typ, ok, err := r.disc.fn(rec)
	if err != nil || !ok {
		return nil, &RouteError{Router: r.name, Discriminator: r.disc.desc, Known: r.Types(), Err: err}
	}
	h, found := r.routes[typ]
	if !found {
		return nil, &RouteError{Router: r.name, Discriminator: r.disc.desc, Type: typ, Known: r.Types()}
	}
	return h, nil
}
