package deploy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/twmb/franz-go/pkg/kgo"
	"gopkg.in/yaml.v3"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/consumer/otelexport"
	"github.com/exactly-go/exactly/handler"
	"github.com/exactly-go/exactly/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// promtool returns the path of promtool. Missing, it fails the test in CI
// (CI=true: .ci/run installs Debian's prometheus package) and skips it
// elsewhere, saying how to install it.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("promtool not found in CI: .ci/run installs it (apt-get install prometheus): %v", err)
	}
	t.Skip("promtool not found: apt-get install prometheus (Debian) to check the alert rules; CI always runs this test")
	return ""
}

// The alert rules and the Prometheus configuration are valid, and every
// alert passes its unit tests in alerts_test.yml (each fires on the
// situation it names, with its labels and annotations, and stays quiet on
// its look-alike).
func TestAlertRulesWithPromtool(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
		{"check", "config", "prometheus.yml"},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = "prometheus"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// composeFile is the part of docker-compose.yml this test reads.
type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Ports       []string          `yaml:"ports"`
		Volumes     []string          `yaml:"volumes"`
	} `yaml:"services"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// mounts returns a service's bind mounts: container path -> host path
// (relative to the repository root).
func mounts(t *testing.T, volumes []string) map[string]string {
	out := map[string]string{}
	for _, v := range volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || !strings.HasPrefix(parts[0], "./") {
			continue // a named volume
		}
		out[parts[1]] = filepath.Join("..", parts[0])
	}
	return out
}

// docker-compose.yml (there is no Docker engine here, so it is read, not
// run) starts Prometheus with this directory's configuration and alert
// rules and Grafana with its datasource and the dashboard; every mounted
// file exists; Prometheus scrapes the example services' metrics ports and
// Grafana's datasource is that Prometheus; PostgreSQL runs with
// wal_level=logical.
func TestComposeProvisionsPrometheusAndGrafana(t *testing.T) {
	var f composeFile
	readYAML(t, "../docker-compose.yml", &f)
	svc := f.Services

	prom, ok := svc["prometheus"]
	if !ok || !strings.HasPrefix(prom.Image, "prom/prometheus:") {
		t.Fatalf("no prometheus service with image prom/prometheus (got %q)", prom.Image)
	}
	pm := mounts(t, prom.Volumes)
	if pm["/etc/prometheus/prometheus.yml"] != filepath.Join("..", "deploy/prometheus/prometheus.yml") ||
		pm["/etc/prometheus/alerts.yml"] != filepath.Join("..", "deploy/prometheus/alerts.yml") {
		t.Errorf("prometheus mounts %v, want deploy/prometheus/{prometheus,alerts}.yml in /etc/prometheus", pm)
	}
	graf, ok := svc["grafana"]
	if !ok || !strings.HasPrefix(graf.Image, "grafana/grafana:") {
		t.Fatalf("no grafana service with image grafana/grafana (got %q)", graf.Image)
	}
	gm := mounts(t, graf.Volumes)
	if gm["/etc/grafana/provisioning"] != filepath.Join("..", "deploy/grafana/provisioning") {
		t.Errorf("grafana mounts %v, want deploy/grafana/provisioning at /etc/grafana/provisioning", gm)
	}
	for name, m := range map[string]map[string]string{"prometheus": pm, "grafana": gm} {
		if len(m) == 0 {
			t.Errorf("%s mounts nothing from the repository", name)
		}
		for target, src := range m {
			if _, err := os.Stat(src); err != nil {
				t.Errorf("%s mounts %s at %s: %v", name, src, target, err)
			}
		}
	}

	// The dashboards provider reads the directory the dashboards are
	// mounted at, and the dashboard is in it.
	var providers struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, "grafana/provisioning/dashboards/exactly.yml", &providers)
	if len(providers.Providers) != 1 {
		t.Fatalf("dashboard providers: %+v, want one", providers.Providers)
	}
	dir, ok := gm[providers.Providers[0].Options.Path]
	if !ok {
		t.Fatalf("the dashboard provider reads %s, which grafana does not mount (mounts %v)", providers.Providers[0].Options.Path, gm)
	}
	if _, err := os.Stat(filepath.Join(dir, "exactly.json")); err != nil {
		t.Errorf("dashboard not in the provisioned directory: %v", err)
	}
	if home := graf.Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]; home != "" && home != providers.Providers[0].Options.Path+"/exactly.json" {
		t.Errorf("home dashboard %s is not the provisioned exactly.json", home)
	}

	// The datasource is the compose Prometheus, with the uid the
	// dashboard's datasource variable defaults to.
	var sources struct {
		Datasources []struct {
			UID, Type, URL string
		} `yaml:"datasources"`
	}
	readYAML(t, "grafana/provisioning/datasources/prometheus.yml", &sources)
	if len(sources.Datasources) != 1 || sources.Datasources[0].Type != "prometheus" ||
		sources.Datasources[0].URL != "http://prometheus:9090" || sources.Datasources[0].UID != "prometheus" {
		t.Errorf("datasources %+v, want one prometheus at http://prometheus:9090 with uid prometheus", sources.Datasources)
	}

	// Prometheus scrapes each example service on its metrics port and
	// loads the mounted rules.
	var cfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "prometheus/prometheus.yml", &cfg)
	if !slices.Equal(cfg.RuleFiles, []string{"alerts.yml"}) {
		t.Errorf("rule_files %v, want [alerts.yml] (mounted beside prometheus.yml)", cfg.RuleFiles)
	}
	scraped := map[string]bool{}
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				scraped[target] = true
			}
		}
	}
	for _, name := range []string{"credit", "notify"} {
		_, port, _ := strings.Cut(svc[name].Environment["EXACTLY_METRICS_ADDR"], ":")
		if port == "" || !scraped[name+":"+port] {
			t.Errorf("prometheus does not scrape %s on its EXACTLY_METRICS_ADDR port %q (targets %v)", name, port, scraped)
		}
	}

	if cmd := strings.Join(svc["postgres"].Command, " "); !strings.Contains(cmd, "wal_level=logical") {
		t.Errorf("postgres command %q lacks -c wal_level=logical (the WAL relay needs logical decoding)", cmd)
	}
}

// queries returns the PromQL of the alert rules, of the dashboard's
// panels and variables, and the series names of the rules' unit tests,
// each with where it comes from; and the legend formats of the panels.
func queries(t *testing.T) (exprs map[string]string, legends []string) {
	t.Helper()
	exprs = map[string]string{}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Expr string
				Annotations map[string]string
			}
		}
	}
	readYAML(t, "prometheus/alerts.yml", &rules)
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs["alert "+r.Alert] = r.Expr
			for _, v := range r.Annotations {
				legends = append(legends, v)
			}
		}
	}
	var tests struct {
		Tests []struct {
			InputSeries []struct {
				Series string
			} `yaml:"input_series"`
		}
	}
	readYAML(t, "prometheus/alerts_test.yml", &tests)
	for i, tc := range tests.Tests {
		for j, s := range tc.InputSeries {
			if strings.HasPrefix(s.Series, "up{") {
				continue // Prometheus's own series of a target, not an exported one
			}
			exprs[fmt.Sprintf("alerts_test.yml test %d series %d", i, j)] = s.Series
		}
	}

	raw, err := os.ReadFile("grafana/dashboards/exactly.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct {
				Expr, LegendFormat string
			}
		}
		Templating struct {
			List []struct {
				Name, Type string
				Query      json.RawMessage
			}
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("grafana/dashboards/exactly.json: %v", err)
	}
	for _, p := range dash.Panels {
		for i, tg := range p.Targets {
			exprs[fmt.Sprintf("panel %q target %d", p.Title, i)] = tg.Expr
			legends = append(legends, tg.LegendFormat)
		}
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: %v", v.Name, err)
		}
		exprs["variable "+v.Name] = q.Query
	}
	if len(dash.Panels) < 10 {
		t.Fatalf("dashboard has %d panels; is it the right file?", len(dash.Panels))
	}
	return exprs, legends
}

var (
	// Label lists of aggregations and vector matching.
	labelLists = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	// Label matchers.
	matchers = regexp.MustCompile(`\{([^}]*)\}`)
	matcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	// Label references of templates: {{ $labels.x }} and {{x}}.
	templateLabels = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)|\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	// label_values(metric, label)
	labelValues = regexp.MustCompile(`label_values\(\s*[a-zA-Z_:][a-zA-Z0-9_:]*\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)`)
	metricName  = regexp.MustCompile(`\bexactly_[a-zA-Z0-9_]+`)
)

// namesIn splits a PromQL expression into the metric names it selects
// (exactly_*) and the label names it uses.
func namesIn(expr string) (metrics, labels []string) {
	for _, m := range labelLists.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[2], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
	}
	for _, m := range labelValues.FindAllStringSubmatch(expr, -1) {
		labels = append(labels, m[1])
	}
	for _, m := range matchers.FindAllStringSubmatch(expr, -1) {
		for _, mm := range matcher.FindAllStringSubmatch(m[1], -1) {
			labels = append(labels, mm[1])
		}
	}
	rest := labelLists.ReplaceAllString(expr, " ")
	rest = matchers.ReplaceAllString(rest, " ")
	rest = labelValues.ReplaceAllStringFunc(rest, func(s string) string { return s[:strings.LastIndex(s, ",")] })
	return metricName.FindAllString(rest, -1), labels
}

// scrapeService runs a consumer.Service (consumer, relay, pruner, metrics
// endpoint) with the Prometheus exporter over a private PostgreSQL and an
// in-process broker, feeds it records that apply, duplicate and
// dead-letter (the dead letter goes out through the outbox, so the relay
// publishes), and returns the metric families of its /metrics once every
// kind of measurement is in.
func scrapeService(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	ctx := context.Background()
	pool := testenv.DB(t)
	if _, err := pool.Exec(ctx, `create table credits(order_id text primary key)`); err != nil {
		t.Fatal(err)
	}
	kc := testenv.Kafka(t, 2, "credits")
	brokers := testenv.Brokers(kc)
	type credit struct {
		OrderID string `json:"order_id"`
	}
	h := handler.New("credit", handler.FromPayload(func(c credit) string { return "credit:" + c.OrderID }),
		func(ctx context.Context, tx pgx.Tx, msg handler.Message[credit]) error {
			_, err := tx.Exec(ctx, `insert into credits values ($1)`, msg.Value.OrderID)
			return err
		})
	var recs []*kgo.Record
	for i := range 4 {
		v := fmt.Appendf(nil, `{"order_id":"o-%d"}`, i)
		recs = append(recs, &kgo.Record{Topic: "credits", Key: v, Value: v}, &kgo.Record{Topic: "credits", Key: v, Value: v})
	}
	recs = append(recs, &kgo.Record{Topic: "credits", Key: []byte("bad"), Value: []byte("not json")})
	testenv.Produce(t, brokers, recs...)

	tel, err := otelexport.Setup(ctx, otelexport.Config{Prometheus: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := consumer.DefaultConfig()
	cfg.Brokers, cfg.Group, cfg.Topics, cfg.MetricsAddr = brokers, "credit", []string{"credits"}, addr
	cfg.CommitInterval = 100 * time.Millisecond
	cfg.GroupLagInterval = 100 * time.Millisecond
	svc, err := consumer.NewService(cfg, pool, consumer.Handle(h),
		consumer.WithMeterProvider(tel.MeterProvider), consumer.WithMetricsHandler(tel.MetricsHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Service.Run: %v", err)
		}
	})

	// Every family the code can export, observed or recorded: wait until
	// the records are counted and the relay published the dead letter.
	want := func(fams map[string]*dto.MetricFamily) error {
		var n float64
		for _, m := range fams["exactly_records_total"].GetMetric() {
			n += m.GetCounter().GetValue()
		}
		if n < float64(len(recs)) {
			return fmt.Errorf("%v of %d records counted", n, len(recs))
		}
		if len(fams["exactly_relay_commit_to_ack_seconds"].GetMetric()) == 0 {
			return errors.New("nothing published by the relay yet")
		}
		if len(fams["exactly_consumer_committed_offset"].GetMetric()) == 0 {
			return errors.New("no offset committed yet")
		}
		if len(fams["exactly_consumer_group_committed_offset"].GetMetric()) == 0 {
			return errors.New("the group's committed offsets not read from the broker yet")
		}
		return nil
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		fams, err := scrape("http://" + addr + "/metrics")
		if err == nil {
			if err = want(fams); err == nil {
				return fams
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the service's metrics never showed every measurement: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // polling the endpoint, as Prometheus does
	}
}

func scrape(u string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(u)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// Every metric the alert rules, their unit tests and the dashboard query,
// and every label they group, match or print by, is one a running
// consumer.Service exports: the list comes from a scrape of a real
// service (records applied, duplicated and dead-lettered, the relay
// publishing), not from a list kept by hand. And the dashboard shows every
// exactly_* metric the service exports.
func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	fams := scrapeService(t)
	exported := map[string]bool{}
	labels := map[string]bool{"job": true, "instance": true, "le": true} // Prometheus's own, and histograms'
	for name, f := range fams {
		if !strings.HasPrefix(name, "exactly_") {
			continue
		}
		exported[name] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exported[name+s] = true
			}
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
	}
	if len(exported) < 15 {
		t.Fatalf("the scrape exported only %v", exported)
	}
	exprs, legends := queries(t)
	used := map[string]bool{}
	for where, e := range exprs {
		ms, ls := namesIn(e)
		if len(ms) == 0 {
			t.Errorf("%s: %q uses no exactly_ metric", where, e)
		}
		for _, m := range ms {
			used[m] = true
			if !exported[m] {
				t.Errorf("%s uses %s, which the service does not export", where, m)
			}
		}
		for _, l := range ls {
			if !labels[l] {
				t.Errorf("%s uses label %s, which no exported metric has", where, l)
			}
		}
	}
	for _, text := range legends {
		for _, m := range templateLabels.FindAllStringSubmatch(text, -1) {
			if l := m[1] + m[2]; l != "value" && !labels[l] {
				t.Errorf("template %q prints label %s, which no exported metric has", text, l)
			}
		}
	}
	var missing []string
	for name := range fams {
		if !strings.HasPrefix(name, "exactly_") {
			continue
		}
		found := false
		for u := range used {
			if u == name || strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(u, "_bucket"), "_sum"), "_count") == name {
				found = true
			}
		}
		if !found {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("exported but used by no alert or panel: %v", missing)
	}
}

// namesIn tells metric names from label names.
func TestNamesIn(t *testing.T) {
	ms, ls := namesIn(`sum by (exactly_handler) (rate(exactly_records_total{exactly_outcome="duplicate",job=~"$job"}[5m])) and on (exactly_handler) exactly_duplicate_ratio > 0`)
	if !slices.Equal(ms, []string{"exactly_records_total", "exactly_duplicate_ratio"}) {
		t.Errorf("metrics %v", ms)
	}
	sort.Strings(ls)
	if !slices.Equal(ls, []string{"exactly_handler", "exactly_handler", "exactly_outcome", "job"}) {
		t.Errorf("labels %v", ls)
	}
	if ms, ls := namesIn(`label_values(exactly_build_info, job)`); !slices.Equal(ms, []string{"exactly_build_info"}) || !slices.Equal(ls, []string{"job"}) {
		t.Errorf("label_values: metrics %v labels %v", ms, ls)
	}
}

// wantUnit is the Grafana unit a query's values are in: seconds for
// quantiles, means and ages of *_seconds metrics, percentunit for a ratio,
// a plain count for increase() and gauges of things, ops for a rate.
func wantUnit(expr string) string {
	switch {
	case strings.Contains(expr, "histogram_quantile"), strings.Contains(expr, "_seconds_sum"):
		return "s"
	case strings.Contains(expr, "_ratio"):
		return "percentunit"
	case strings.Contains(expr, "increase("):
		return "short"
	case strings.Contains(expr, "rate("), strings.Contains(expr, "deriv("):
		return "ops"
	case strings.Contains(expr, "_seconds"):
		return "s"
	}
	return "short"
}

// Every dashboard query is drawn in the unit of its values: a panel's
// unit, or its override for that query (byFrameRefID). A count drawn as a
// percentage (the duplicate spikes beside the duplicate ratio) or a rate in
// seconds (rows published beside commit-to-ack) fails.
func TestDashboardUnitsFitTheirQueries(t *testing.T) {
	raw, err := os.ReadFile("grafana/dashboards/exactly.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			ID          int
			Title, Type string
			FieldConfig struct {
				Defaults struct {
					Unit string
				}
				Overrides []struct {
					Matcher struct {
						ID      string
						Options string
					}
					Properties []struct {
						ID    string
						Value any
					}
				}
			}
			Targets []struct {
				RefID string
				Expr  string
			}
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			unit := p.FieldConfig.Defaults.Unit
			for _, o := range p.FieldConfig.Overrides {
				if o.Matcher.ID != "byFrameRefID" || o.Matcher.Options != tg.RefID {
					continue
				}
				for _, prop := range o.Properties {
					if prop.ID == "unit" {
						unit, _ = prop.Value.(string)
					}
				}
			}
			if want := wantUnit(tg.Expr); unit != want {
				t.Errorf("panel %d %q query %s %q is drawn in %q, want %q", p.ID, p.Title, tg.RefID, tg.Expr, unit, want)
			}
			checked++
		}
	}
	if checked < 20 {
		t.Fatalf("checked only %d queries", checked)
	}
}
