package status

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

//go:embed page.html
var pageFS embed.FS

// CheckListenAddr accepts addr (host:port) for the status page only when
// its host is a loopback address or "localhost", unless allowRemote: an
// empty host (":8080") listens on every interface and is refused too. The
// error says which flag allows it.
func CheckListenAddr(addr string, allowRemote bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("status: listen address %q: %w", addr, err)
	}
	if allowRemote {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("status: listen address %q is not a loopback address (127.0.0.1, ::1, localhost): the page would be reachable from other machines; pass -allow-remote to allow that", addr)
}

// Page serves the status report as HTML at / (refreshing itself every
// Refresh) and as JSON at /status.json. It answers GET and HEAD only and
// reads through the Collector's read-only transactions. Served by
// [Serve], it collects in the background every Refresh ([Page.Sample]),
// whoever looks, so its history has one point per Refresh however often
// the page is loaded; otherwise it collects when asked, at most once per
// second.
type Page struct {
	collector *Collector
	refresh   time.Duration
	tmpl      *template.Template
	logger    *slog.Logger

	// hosts are the names (host or host:port, lower case) Serve answers
	// besides the served address and loopback; see AllowHosts.
	hosts []string

	mu     sync.Mutex
	last   *Report
	lastAt time.Time
	// sampling is true while Sample runs: requests then read the last
	// sample instead of collecting.
	sampling bool
}

// Sample collects a report at once and then every Refresh until ctx ends,
// for the requests to read: the history and the stall judgement then
// compare samples a fixed interval apart. [Serve] runs it.
func (p *Page) Sample(ctx context.Context) {
	p.mu.Lock()
	p.sampling = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.sampling = false
		p.mu.Unlock()
	}()
	t := time.NewTicker(p.refresh)
	defer t.Stop()
	for {
		p.mu.Lock()
		p.last, p.lastAt = p.collector.Collect(ctx), time.Now()
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// AllowHosts adds names to the Host headers Serve answers, besides the
// served address and localhost, 127.0.0.1 and [::1] with its port: the
// names a browser uses to reach a page served with -allow-remote. A name
// without a port ("status.example.com") matches it on any port, one with a
// port ("status.example.com:8090") on that port only. Call it before
// Serve. It fails on an empty name or one that is not a host or host:port
// (a scheme, a path, spaces).
func (p *Page) AllowHosts(names ...string) error {
	for _, n := range names {
		n = strings.ToLower(strings.TrimSpace(n))
		host, port, err := net.SplitHostPort(n)
		if err != nil {
			host, port = strings.Trim(n, "[]"), ""
		}
		if host == "" || strings.ContainsAny(host, "/ @?#") || (port != "" && !allDigits(port)) {
			return fmt.Errorf("status: allowed host %q is not a host name or host:port", n)
		}
		p.hosts = append(p.hosts, n)
	}
	return nil
}

func allDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

// hostGuard answers only requests whose Host header names the page: a
// browser led to the page by DNS rebinding (a name the attacker controls,
// resolved to the page's address) sends that name, and gets 421.
type hostGuard struct {
	next http.Handler
	// port is the served port; exact are the accepted host:port pairs
	// (lower case, IPv6 in brackets) and names the hosts accepted on any
	// port.
	port  string
	exact map[string]bool
	names map[string]bool
	// anyIP accepts an IP literal with the served port (-allow-remote:
	// a browser that was given an address, not a name, cannot have been
	// rebound).
	anyIP bool
}

// newHostGuard returns the guard of next served on addr (the bound
// address) with the extra names of AllowHosts.
func newHostGuard(next http.Handler, addr net.Addr, allowRemote bool, extra []string) (*hostGuard, error) {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return nil, fmt.Errorf("status: the bound address %s: %w", addr, err)
	}
	g := &hostGuard{next: next, port: port, exact: map[string]bool{}, names: map[string]bool{}, anyIP: allowRemote}
	for _, h := range []string{host, "localhost", "127.0.0.1", "::1"} {
		g.exact[net.JoinHostPort(strings.ToLower(h), port)] = true
	}
	for _, n := range extra {
		if _, _, err := net.SplitHostPort(n); err == nil {
			g.exact[n] = true
		} else {
			g.names[strings.Trim(n, "[]")] = true
		}
	}
	return g, nil
}

// allowed reports whether a request with Host header h is answered.
func (g *hostGuard) allowed(h string) bool {
	h = strings.ToLower(h)
	host, port, err := net.SplitHostPort(h)
	if err != nil { // no port: the scheme's default
		host, port = strings.Trim(h, "[]"), "80"
	}
	if g.names[host] || g.exact[net.JoinHostPort(host, port)] {
		return true
	}
	return g.anyIP && port == g.port && net.ParseIP(host) != nil
}

func (g *hostGuard) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if !g.allowed(req.Host) {
		w.Header().Set("Cache-Control", "no-store")
		http.Error(w, fmt.Sprintf("misdirected request: this status page answers only its own address "+
			"(localhost, 127.0.0.1 or [::1] with port %s, or a name given with -allowed-hosts), not Host %q; "+
			"requests for other names are refused because a browser can be led here by DNS rebinding",
			g.port, req.Host), http.StatusMisdirectedRequest)
		return
	}
	g.next.ServeHTTP(w, req)
}

// NewPage returns a Page for c that asks browsers to reload every refresh
// (at least one second). A nil logger discards. It fails only when the
// embedded template does not parse.
func NewPage(c *Collector, refresh time.Duration, logger *slog.Logger) (*Page, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	refresh = max(refresh, time.Second)
	tmpl, err := template.New("page.html").Funcs(template.FuncMap{
		"seconds": func(d time.Duration) int64 { return int64(d.Seconds()) },
		"showkey": ShowKey,
		"age":     formatAge,
		"ratio": func(f float64) string {
			if f < 0 {
				return "–"
			}
			return fmt.Sprintf("%.1f%%", 100*f)
		},
		"opt": func(n *int64) string {
			if n == nil {
				return "–"
			}
			return fmt.Sprint(*n)
		},
		"count": func(n int64) string {
			if n < 0 {
				return "–"
			}
			return fmt.Sprint(n)
		},
	}).ParseFS(pageFS, "page.html")
	if err != nil {
		return nil, fmt.Errorf("status: parsing the page template: %w", err)
	}
	return &Page{collector: c, refresh: refresh, tmpl: tmpl, logger: logger}, nil
}

func formatAge(d time.Duration) string {
	switch {
	case d <= 0:
		return "–"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	default:
		return fmt.Sprintf("%.1fd", d.Hours()/24)
	}
}

// report returns the latest report. While Sample runs it is the last
// sample; otherwise a new one is collected when the last is older than a
// second.
func (p *Page) report(ctx context.Context) *Report {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last == nil || (!p.sampling && time.Since(p.lastAt) >= time.Second) {
		p.last, p.lastAt = p.collector.Collect(ctx), time.Now()
	}
	return p.last
}

// ServeHTTP serves the page at / and the JSON report at /status.json, with
// headers that forbid scripts, framing and caching. Methods other than GET
// and HEAD get 405, unknown paths 404, and a rendering failure 500 (logged).
func (p *Page) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, "the status page is read-only: GET and HEAD only", http.StatusMethodNotAllowed)
		return
	}
	switch req.URL.Path {
	case "/", "/index.html":
		var buf bytes.Buffer
		r := p.report(req.Context())
		if err := p.tmpl.Execute(&buf, struct {
			*Report
			Refresh     int64
			HistorySize int
		}{r, int64(p.refresh.Seconds()), HistorySize}); err != nil {
			p.logger.Error("status page: rendering", "error", err)
			http.Error(w, "rendering the status page failed; see the server log", http.StatusInternalServerError)
			return
		}
		h.Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(buf.Bytes())
	case "/status.json":
		b, err := p.report(req.Context()).JSON()
		if err != nil {
			p.logger.Error("status page: encoding JSON", "error", err)
			http.Error(w, "encoding the report failed; see the server log", http.StatusInternalServerError)
			return
		}
		h.Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	default:
		http.NotFound(w, req)
	}
}

// Serve listens on addr (checked with CheckListenAddr) and serves p until
// ctx ends, then shuts down. It answers only requests whose Host header is
// the bound address, localhost, 127.0.0.1 or [::1] with the bound port, a
// name given to p.AllowHosts, or (allowRemote) an IP address with the
// bound port; any other Host gets 421 Misdirected Request, so that a page
// reached through DNS rebinding shows nothing. ready, when non-nil,
// receives the bound address once listening (useful with port 0). It fails
// when the address is refused or cannot be bound, or the server fails.
func Serve(ctx context.Context, addr string, allowRemote bool, p *Page, ready func(net.Addr)) error {
	if err := CheckListenAddr(addr, allowRemote); err != nil {
		return err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("status: listening on %s: %w", addr, err)
	}
	guard, err := newHostGuard(p, l.Addr(), allowRemote, p.hosts)
	if err != nil {
		_ = l.Close()
		return err
	}
	srv := &http.Server{Handler: guard, ReadHeaderTimeout: 10 * time.Second}
	if ready != nil {
		ready(l.Addr())
	}
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		p.Sample(sampleCtx)
	}()
	defer func() {
		stopSampling()
		<-sampled
	}()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	select {
	case err := <-done:
		return fmt.Errorf("status: serving on %s: %w", addr, err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("status: shutting down the page server: %w", err)
		}
		return nil
	}
}

// LagClass is the CSS class of the partition's row on the page: "bad"
// when it stalled (lag, no commit over the interval), "warn" on a read error, "lag" when behind.
func (p Partition) LagClass() string {
	switch {
	case p.Stalled:
		return "bad"
	case p.Error != "":
		return "warn"
	case p.Lag > 0:
		return "lag"
	}
	return ""
}

// HeaderList returns the row's headers as "name: value" lines, sorted.
func (r OutboxRow) HeaderList() []string {
	out := make([]string, 0, len(r.Headers))
	for k, v := range r.Headers {
		out = append(out, k+": "+v)
	}
	slices.Sort(out)
	return out
}
