//go:build browser

package status_test

import (
	"context"
	"image"
	"image/png"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
)

// TestBrowserScreenshot serves the page with the scenario's real figures
// (lag from the consumer group on kfake, the outbox backlog its handler
// left), takes a screenshot in headless Chromium and checks that the PNG
// has the window's size and is not blank. Run it with make test-browser;
// EXACTLY_STATUS_SCREENSHOT=path keeps a copy of the PNG.
func TestBrowserScreenshot(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (apt-get install -y chromium): %v", err)
	}
	s := newScenario(t)
	c, err := status.NewCollector(s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	page, err := status.NewPage(c, 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addrs := make(chan net.Addr, 1)
	served := make(chan error, 1)
	go func() { served <- status.Serve(ctx, "127.0.0.1:0", false, page, func(a net.Addr) { addrs <- a }) }()
	var url string
	select {
	case a := <-addrs:
		url = "http://" + a.String() + "/"
	case err := <-served:
		t.Fatalf("serving: %v", err)
	}

	// The figures the screenshot must show are in the page.
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{
		"<b>" + strconv.Itoa(scenarioLag) + "</b><span>consumer lag",
		"<b>" + strconv.Itoa(scenarioUnique) + "</b><span>outbox backlog",
		scenarioTopic + ".dlq",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("page lacks %q", want)
		}
	}

	dir := t.TempDir()
	shot := filepath.Join(dir, "status.png")
	cctx, ccancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer ccancel()
	cmd := exec.CommandContext(cctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+filepath.Join(dir, "profile"), "--screenshot="+shot, "--window-size=1200,900", url)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, out)
	}
	f, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("decoding the screenshot: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1200 || b.Dy() != 900 {
		t.Errorf("screenshot is %dx%d, want 1200x900", b.Dx(), b.Dy())
	}
	inked, colors := ink(img)
	t.Logf("screenshot: %.1f%% of pixels differ from the background, %d colours", 100*inked, colors)
	if inked < 0.02 || colors < 16 {
		t.Errorf("screenshot looks blank: %.2f%% inked, %d colours", 100*inked, colors)
	}
	if keep := os.Getenv("EXACTLY_STATUS_SCREENSHOT"); keep != "" {
		data, err := os.ReadFile(shot)
		if err == nil {
			err = os.WriteFile(keep, data, 0o644)
		}
		if err != nil {
			t.Errorf("keeping the screenshot: %v", err)
		}
	}
	cancel()
	if err := <-served; err != nil {
		t.Errorf("serving: %v", err)
	}
}

// ink returns the share of pixels that differ from the top-left pixel (the
// page background) and the number of distinct colours.
func ink(img image.Image) (float64, int) {
	b := img.Bounds()
	bg := img.At(b.Min.X, b.Min.Y)
	br, bgg, bb, _ := bg.RGBA()
	var differ, total int
	colors := map[[3]uint32]bool{}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			total++
			if r != br || g != bgg || bl != bb {
				differ++
			}
			if len(colors) < 1000 {
				colors[[3]uint32{r >> 8, g >> 8, bl >> 8}] = true
			}
		}
	}
	return float64(differ) / float64(total), len(colors)
}
