package status_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
)

// serveAt runs status.Serve for p on addr until the test ends and returns
// the bound port.
func serveAt(t *testing.T, p *status.Page, addr string, allowRemote bool) string {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- status.Serve(ctx, addr, allowRemote, p, func(a net.Addr) { addrs <- a }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	var a net.Addr
	select {
	case a = <-addrs:
	case err := <-done:
		t.Fatalf("Serve on %s: %v", addr, err)
	}
	_, port, err := net.SplitHostPort(a.String())
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// getWithHost fetches path from 127.0.0.1:port with the Host header host.
func getWithHost(t *testing.T, port, host, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://127.0.0.1:"+port+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// A browser led to the page by DNS rebinding sends the attacker's name as
// Host: the page refuses it with 421 and says why, on every path, and
// answers its own address and localhost, 127.0.0.1 and [::1] with its port.
func TestServeRefusesForeignHostHeader(t *testing.T) {
	s := newScenario(t)
	port := serveAt(t, newPage(t, s.cfg), "127.0.0.1:0", false)
	for _, host := range []string{"evil.example.com", "evil.example.com:" + port, "localhost", "localhost:1", "127.0.0.1", "192.0.2.1:" + port} {
		for _, path := range []string{"/", "/status.json", "/nothing"} {
			code, body := getWithHost(t, port, host, path)
			if code != http.StatusMisdirectedRequest {
				t.Errorf("Host %q %s: %d; want 421 Misdirected Request", host, path, code)
				continue
			}
			if !strings.Contains(body, "misdirected request") || !strings.Contains(body, "DNS rebinding") || !strings.Contains(body, "-allowed-hosts") {
				t.Errorf("Host %q %s: 421 body does not say why: %q", host, path, body)
			}
			if strings.Contains(body, "outbox") {
				t.Errorf("Host %q %s: the refusal carries the report: %q", host, path, body)
			}
		}
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "LOCALHOST:" + port, "[::1]:" + port} {
		code, body := getWithHost(t, port, host, "/status.json")
		if code != http.StatusOK || !strings.Contains(body, `"problems"`) {
			t.Errorf("Host %q: %d %.200q; want 200 and the report", host, code, body)
		}
	}
}

// With -allow-remote the page answers the names given (a name on any port,
// a host:port on that port) and an IP address with its port, and still
// refuses every other name.
func TestServeAllowRemoteAnswersOnlyGivenNames(t *testing.T) {
	s := newScenario(t)
	p := newPage(t, s.cfg)
	for _, bad := range []string{"", "http://status.example.com", "status.example.com/x", "a b", "status.example.com:http"} {
		if err := p.AllowHosts(bad); err == nil {
			t.Errorf("AllowHosts(%q) accepted", bad)
		}
	}
	if err := p.AllowHosts("Status.Example.com", "ops.example.com:9999"); err != nil {
		t.Fatal(err)
	}
	port := serveAt(t, p, "127.0.0.1:0", true)
	for host, want := range map[string]int{
		"status.example.com:" + port: http.StatusOK,
		"status.example.com":         http.StatusOK,
		"STATUS.example.com:" + port: http.StatusOK,
		"ops.example.com:9999":       http.StatusOK,
		"192.0.2.7:" + port:          http.StatusOK,
		"[2001:db8::1]:" + port:      http.StatusOK,
		"localhost:" + port:          http.StatusOK,
		"ops.example.com:" + port:    http.StatusMisdirectedRequest,
		"evil.example.com:" + port:   http.StatusMisdirectedRequest,
		"status.example.com.evil.io": http.StatusMisdirectedRequest,
		"192.0.2.7:1":                http.StatusMisdirectedRequest,
	} {
		if code, body := getWithHost(t, port, host, "/status.json"); code != want {
			t.Errorf("Host %q: %d %.200q; want %d", host, code, body, want)
		}
	}
}
