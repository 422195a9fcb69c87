package status_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/cmd/exactly/internal/status"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// TestLatestDeadLettersAndJaegerLinks puts three described dead letters
// (one with a hostile error and key) after the scenario's seven bare ones
// and parks an outbox row that carries a traceparent. With Config.Kafka
// and a Jaeger URL, the report lists each dead-letter topic's five newest
// letters (the reader `exactly deadletters` uses), the described ones with
// their error, key, original coordinates, attempts and a Jaeger link; the
// parked row links to its trace. The page escapes the hostile values and
// the link; the JSON has null for the bare letters' missing numbers.
func TestLatestDeadLettersAndJaegerLinks(t *testing.T) {
	s := newScenario(t)
	const (
		dlq     = scenarioTopic + ".dlq"
		trace   = "4bf92f3577b34da6a3ce929d0e0e4736"
		jaeger  = "http://jaeger.local:16686/j&x"
		hostile = `<script>alert("dlq")</script>`
	)
	var recs []*kgo.Record
	at := time.Now().Add(time.Hour)
	for i := range 3 {
		errText := fmt.Sprintf("handler failed %d", i)
		key := fmt.Sprintf("order-%d", 90+i)
		if i == 2 {
			errText, key = hostile, `"><img src=x>`
		}
		recs = append(recs, &kgo.Record{Topic: dlq, Partition: 0, Key: []byte(key), Value: []byte("v"), Headers: []kgo.RecordHeader{
			{Key: outbox.HeaderError, Value: []byte(errText)},
			{Key: outbox.HeaderAttempts, Value: []byte("3")},
			{Key: outbox.HeaderHandler, Value: []byte(scenarioHandler)},
			{Key: outbox.HeaderOriginalTopic, Value: []byte(scenarioTopic)},
			{Key: outbox.HeaderOriginalPartition, Value: []byte("1")},
			{Key: outbox.HeaderOriginalOffset, Value: []byte(fmt.Sprint(40 + i))},
			{Key: outbox.HeaderDeadLetteredAt, Value: []byte(at.Add(time.Duration(i) * time.Second).Format(time.RFC3339Nano))},
			{Key: "traceparent", Value: []byte("00-" + trace + "-00f067aa0ba902b7-01")},
		}})
	}
	testenv.Produce(t, s.brokers, recs...)
	addOutboxRow(t, s.pool, outbox.Message{Topic: scenarioOutboxTop, Key: []byte("traced"), Value: []byte("v"),
		Headers: []handler.Header{{Key: "traceparent", Value: []byte("00-" + trace + "-00f067aa0ba902b7-01")}}})
	if _, err := s.pool.Exec(t.Context(), `update exactly_outbox set parked_at = now(), park_reason = 'policy' where key = 'traced'`); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cfg := s.cfg
	cfg.Kafka, cfg.JaegerURL = cl, jaeger
	r, err := status.Collect(t.Context(), cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Errors) > 0 {
		t.Fatalf("errors: %q", r.Errors)
	}
	if len(r.DeadLetters) != 1 || r.DeadLetters[0].Records != scenarioDLQ+3 || len(r.DeadLetters[0].Latest) != status.DefaultDeadLetters {
		t.Fatalf("dead letters %+v; want %s with %d records and the %d latest", r.DeadLetters, dlq, scenarioDLQ+3, status.DefaultDeadLetters)
	}
	latest := r.DeadLetters[0].Latest
	wantURL := "http://jaeger.local:16686/j&x/trace/" + trace
	for i, l := range latest[2:] {
		if l.Error == "" || l.Attempts == nil || *l.Attempts != 3 || l.OriginalTopic != scenarioTopic ||
			l.OriginalOffset == nil || *l.OriginalOffset != int64(40+i) || l.TraceID != trace || l.TraceURL != wantURL {
			t.Errorf("described letter %d: %+v; want error, 3 attempts, %s offset %d, trace link %s", i, l, scenarioTopic, 40+i, wantURL)
		}
	}
	if latest[4].Error != hostile {
		t.Errorf("newest letter's error %q, want %q", latest[4].Error, hostile)
	}
	if p := r.Outbox.Rows[0]; !p.Parked || p.TraceURL != wantURL {
		t.Errorf("parked row %+v; want trace link %s", p, wantURL)
	}

	_, html := get(t, newPage(t, cfg), http.MethodGet, "/")
	for _, raw := range []string{"<script", "<img"} {
		if strings.Contains(html, raw) {
			t.Errorf("page contains raw %q", raw)
		}
	}
	for _, want := range []string{"Latest dead letters on <code>" + dlq + "</code>", "&lt;script&gt;alert(&#34;dlq&#34;)&lt;/script&gt;",
		"handler failed 0", "<code>orders/1@40</code>", `<a href="http://jaeger.local:16686/j&amp;x/trace/` + trace + `" rel="noreferrer">Jaeger</a>`} {
		if !strings.Contains(html, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if n := strings.Count(html, `/trace/`+trace); n != 4 {
		t.Errorf("%d Jaeger links on the page, want 4 (three dead letters, one parked row)", n)
	}

	b, err := r.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var js struct {
		DeadLetters []struct {
			Latest []struct {
				Error    string `json:"error"`
				Attempts *int64 `json:"attempts"`
				TraceURL string `json:"trace_url"`
			} `json:"latest"`
		} `json:"dead_letters"`
	}
	if err := json.Unmarshal(b, &js); err != nil {
		t.Fatal(err)
	}
	if l := js.DeadLetters[0].Latest; l[0].Attempts != nil || l[4].TraceURL != wantURL || l[4].Error != hostile {
		t.Errorf("JSON latest dead letters %+v; want null attempts for a bare letter, the link and error on the newest", l)
	}
}

// TestCollectorRefusesABadJaegerURL: a Jaeger URL that is not absolute
// http(s) is refused, not turned into links.
func TestCollectorRefusesABadJaegerURL(t *testing.T) {
	for _, u := range []string{"javascript:alert(1)", "jaeger:16686", "/trace"} {
		if _, err := status.NewCollector(status.Config{Pool: testenv.DB(t), JaegerURL: u}); err == nil {
			t.Errorf("NewCollector accepted Jaeger URL %q", u)
		}
	}
}
