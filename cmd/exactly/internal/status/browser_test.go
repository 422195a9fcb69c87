//go:build browser

package status_test

import (
	"context"
	"fmt"
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

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// TestBrowserScreenshot serves the page with the scenario's real figures
// (lag from the consumer group on kfake, the outbox backlog its handler
// left) and the parts an operator reads on day 2: a live group's state and
// member beside the stopped group, a history of six samples, described
// dead letters, a parked row with its reason and held rows, Jaeger links.
// It checks they are in the served HTML, takes a screenshot in headless Chromium and checks that the PNG
// has the window's size and is not blank. Run it with make test-browser;
// EXACTLY_STATUS_SCREENSHOT=path keeps a copy of the PNG.
func TestBrowserScreenshot(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (apt-get install -y chromium): %v", err)
	}
	s := newScenario(t)
	// The new parts in play: a live group beside the stopped one, a parked
	// row with rows held behind it and a trace, described dead letters, and
	// a history of samples between which the live member commits.
	live := joinLiveGroup(t, s)
	const reason = "MESSAGE_TOO_LARGE: 2000000 bytes over the max.message.bytes of the topic"
	for range 3 {
		addOutboxRow(t, s.pool, outbox.Message{Topic: scenarioOutboxTop, Key: []byte("order-5"), Value: []byte("amended")})
	}
	if _, err := s.pool.Exec(t.Context(), `update exactly_outbox set parked_at = now(), park_reason = $2,
		headers = '[{"key":"traceparent","value":"MDAtNGJmOTJmMzU3N2IzNGRhNmEzY2U5MjlkMGUwZTQ3MzYtMDBmMDY3YWEwYmE5MDJiNy0wMQ=="}]'::jsonb
		where id = (select min(id) from exactly_outbox where key = $1)`, []byte("order-5"), reason); err != nil {
		t.Fatal(err)
	}
	var letters []*kgo.Record
	for i := range 3 {
		letters = append(letters, &kgo.Record{Topic: scenarioTopic + ".dlq", Key: []byte(fmt.Sprintf("order-%d", 60+i)), Value: []byte("{}"),
			Headers: []kgo.RecordHeader{
				{Key: outbox.HeaderError, Value: []byte(fmt.Sprintf("credit limit exceeded for account %d", 7+i))},
				{Key: outbox.HeaderAttempts, Value: []byte("5")},
				{Key: outbox.HeaderHandler, Value: []byte(scenarioHandler)},
				{Key: outbox.HeaderOriginalTopic, Value: []byte(scenarioTopic)},
				{Key: outbox.HeaderOriginalPartition, Value: []byte(fmt.Sprint(i))},
				{Key: outbox.HeaderOriginalOffset, Value: []byte(fmt.Sprint(30 + i))},
				{Key: outbox.HeaderDeadLetteredAt, Value: []byte(time.Now().Add(time.Hour + time.Duration(i)*time.Second).Format(time.RFC3339Nano))},
				{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
			}})
	}
	testenv.Produce(t, s.brokers, letters...)
	// A record a consumer holds after failed attempts, and the partition
	// paused behind it, as the consumer leaves them.
	if _, err := s.pool.Exec(t.Context(), `insert into exactly_guard_held (consumer_group, topic, partition, record_offset, scope, key, handler, attempts, last_error, held_since, retry_at)
values ($1, $2, 1, 44, $3, 'order:order-44', $3, 6, 'payment service unavailable', now() - interval '8 minutes', now() + interval '30 seconds')`,
		liveGroup, scenarioTopic, scenarioHandler); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(t.Context(), `insert into exactly_guard_paused (consumer_group, topic, partition, reason, lowest_unfinished, handler)
values ($1, $2, 1, 'offset_gap', 44, $3)`, liveGroup, scenarioTopic, scenarioHandler); err != nil {
		t.Fatal(err)
	}
	kcl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer kcl.Close()
	cfg := s.cfg
	cfg.Groups = []string{scenarioGroup, liveGroup}
	cfg.Kafka, cfg.JaegerURL = kcl, "http://localhost:16686"
	c, err := status.NewCollector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ends, err := s.admin.ListEndOffsets(t.Context(), scenarioTopic)
	if err != nil {
		t.Fatal(err)
	}
	end, _ := ends.Lookup(scenarioTopic, 0)
	for i := range 6 { // the live member works through partition 0
		live.CommitOffsetsSync(t.Context(), map[string]map[int32]kgo.EpochOffset{scenarioTopic: {0: {Epoch: -1, Offset: end.Offset * int64(i+1) / 6}}}, nil)
		c.Collect(t.Context())
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
		"<b>" + strconv.Itoa(scenarioLag) + "</b><span>lag of stopped groups",
		"<b>" + strconv.Itoa(scenarioUnique+2) + "</b><span>outbox backlog",
		scenarioTopic + ".dlq",
		`<svg class="spark"`, "<polyline", // history
		"Empty (stopped", "<code>" + liveClientID + "</code>", // group state and members
		"Latest dead letters on", "credit limit exceeded for account 9", "<code>orders/2@32</code>", // dead letters
		"<td>parked</td><td>" + reason + "</td><td class=\"n\">3</td>", "<td>held</td>", // parked reason, held
		`href="http://localhost:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736"`,                     // Jaeger links
		"<code>order:order-44</code>", "payment service unavailable", "<h3>Paused partitions</h3>", // held records, paused partitions
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
		"--user-data-dir="+filepath.Join(dir, "profile"), "--screenshot="+shot, "--window-size=1200,1600", url)
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
	if b := img.Bounds(); b.Dx() != 1200 || b.Dy() != 1600 {
		t.Errorf("screenshot is %dx%d, want 1200x1600", b.Dx(), b.Dy())
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
