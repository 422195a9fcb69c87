package redact

import (
	"context"
	"log/slog"
)

// Handler returns a slog.Handler that passes records to h with every
// occurrence of each non-empty secret replaced by [Redacted] in the message
// and in string, error and fmt.Stringer attribute values (groups
// included): a last line of defence for errors that quote a connection
// string or a credential. Each such value, and the message, is then
// bounded with [Bound] (after the scrubbing, so that a cut never leaves
// part of a secret): a record's key or a handler's error text cannot make
// a log line megabytes long.
func Handler(h slog.Handler, secrets ...string) slog.Handler {
	var s []string
	for _, sec := range secrets {
		if sec != "" {
			s = append(s, sec)
		}
	}
	if sh, ok := h.(*scrubHandler); ok {
		return &scrubHandler{h: sh.h, secrets: append(append([]string{}, sh.secrets...), s...)}
	}
	return &scrubHandler{h: h, secrets: s}
}

type scrubHandler struct {
	h       slog.Handler
	secrets []string
}

func (s *scrubHandler) Enabled(ctx context.Context, l slog.Level) bool { return s.h.Enabled(ctx, l) }

func (s *scrubHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, s.text(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(s.attr(a))
		return true
	})
	return s.h.Handle(ctx, out)
}

func (s *scrubHandler) WithAttrs(as []slog.Attr) slog.Handler {
	scrubbed := make([]slog.Attr, len(as))
	for i, a := range as {
		scrubbed[i] = s.attr(a)
	}
	return &scrubHandler{h: s.h.WithAttrs(scrubbed), secrets: s.secrets}
}

func (s *scrubHandler) WithGroup(name string) slog.Handler {
	return &scrubHandler{h: s.h.WithGroup(name), secrets: s.secrets}
}

// text returns v scrubbed of the secrets, then bounded.
func (s *scrubHandler) text(v string) string { return Bound(Scrub(v, s.secrets...)) }

func (s *scrubHandler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, s.text(v.String()))
	case slog.KindGroup:
		g := v.Group()
		out := make([]slog.Attr, len(g))
		for i, ga := range g {
			out[i] = s.attr(ga)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(out...)}
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, s.text(x.Error()))
		case interface{ String() string }:
			return slog.String(a.Key, s.text(x.String()))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
