package consumer_test

import (
	"fmt"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/exactly-go/exactly/consumer"
)

// composeFile is the part of docker-compose.yml the test reads.
type composeFile struct {
	Services map[string]struct {
		Image string `yaml:"image"`
		Build *struct {
			Context    string            `yaml:"context"`
			Dockerfile string            `yaml:"dockerfile"`
			Args       map[string]string `yaml:"args"`
		} `yaml:"build"`
		Environment map[string]string `yaml:"environment"`
		Ports       []string          `yaml:"ports"`
		DependsOn   map[string]any    `yaml:"depends_on"`
	} `yaml:"services"`
}

// otelVariables are the OTEL_* variables consumer/otelexport.Setup and the
// OpenTelemetry SDK read (the SDK's environment specification).
var otelVariables = map[string]bool{
	"OTEL_SERVICE_NAME": true, "OTEL_RESOURCE_ATTRIBUTES": true,
	"OTEL_EXPORTER_OTLP_ENDPOINT": true, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": true, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": true,
	"OTEL_EXPORTER_OTLP_PROTOCOL": true, "OTEL_EXPORTER_OTLP_HEADERS": true, "OTEL_EXPORTER_OTLP_TIMEOUT": true,
	"OTEL_EXPORTER_OTLP_INSECURE": true, "OTEL_EXPORTER_OTLP_CERTIFICATE": true, "OTEL_EXPORTER_OTLP_COMPRESSION": true,
	"OTEL_TRACES_EXPORTER": true, "OTEL_METRICS_EXPORTER": true, "OTEL_TRACES_SAMPLER": true, "OTEL_TRACES_SAMPLER_ARG": true,
	"OTEL_METRIC_EXPORT_INTERVAL": true, "OTEL_METRIC_EXPORT_TIMEOUT": true,
	"OTEL_BSP_SCHEDULE_DELAY": true, "OTEL_BSP_EXPORT_TIMEOUT": true, "OTEL_BSP_MAX_QUEUE_SIZE": true, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": true,
}

// configVariables returns the env variables consumer.Config reads, by
// reflection over its env tags.
func configVariables() map[string]bool {
	vars := map[string]bool{}
	t := reflect.TypeOf(consumer.Config{})
	for i := 0; i < t.NumField(); i++ {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("env"), ","); name != "" {
			vars[name] = true
		}
	}
	return vars
}

func hostPorts(ports []string) map[string]string {
	out := map[string]string{} // container port -> host port
	for _, p := range ports {
		parts := strings.Split(p, ":")
		out[parts[len(parts)-1]] = parts[len(parts)-2]
	}
	return out
}

// There is no Docker engine here: the stack users start with `make up` is
// checked by reading docker-compose.yml and the Dockerfile.
func TestDockerCompose(t *testing.T) {
	raw, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f composeFile
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	svc := f.Services

	images := map[string]string{"kafka": "apache/kafka:", "postgres": "postgres:17", "jaeger": "jaegertracing/all-in-one:"}
	for name, prefix := range images {
		s, ok := svc[name]
		if !ok {
			t.Errorf("no %s service", name)
			continue
		}
		if !strings.HasPrefix(s.Image, prefix) {
			t.Errorf("%s image %q, want %s...", name, s.Image, prefix)
		}
	}
	for name, s := range svc {
		if strings.Contains(s.Image, "zookeeper") {
			t.Errorf("service %s runs ZooKeeper; Kafka must run in KRaft mode", name)
		}
	}
	kafka := svc["kafka"]
	if roles := kafka.Environment["KAFKA_PROCESS_ROLES"]; !strings.Contains(roles, "broker") || !strings.Contains(roles, "controller") {
		t.Errorf("kafka KAFKA_PROCESS_ROLES=%q: not a single KRaft node", roles)
	}
	if got := hostPorts(svc["jaeger"].Ports); got["16686"] == "" || got["4317"] == "" {
		t.Errorf("jaeger must publish its UI (16686) and OTLP/gRPC (4317): %v", svc["jaeger"].Ports)
	}
	if svc["jaeger"].Environment["COLLECTOR_OTLP_ENABLED"] != "true" {
		t.Error("jaeger: COLLECTOR_OTLP_ENABLED is not true")
	}
	if hostPorts(svc["postgres"].Ports)["5432"] == "" {
		t.Errorf("postgres port 5432 not published: %v", svc["postgres"].Ports)
	}
	pg := svc["postgres"].Environment

	dockerfile, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(regexp.MustCompile(`(?m)^FROM `).FindAll(dockerfile, -1)); n < 2 {
		t.Errorf("Dockerfile has %d stages, want a multi-stage build", n)
	}
	if !strings.Contains(string(dockerfile), "./examples/${SERVICE}") {
		t.Error("Dockerfile does not build ./examples/${SERVICE}")
	}

	known := configVariables()
	hostSeen := map[string]string{}
	for _, name := range []string{"credit", "notify"} {
		s, ok := svc[name]
		if !ok {
			t.Errorf("no %s service", name)
			continue
		}
		if s.Build == nil || s.Build.Dockerfile != "Dockerfile" || s.Build.Args["SERVICE"] != name {
			t.Errorf("%s is not built from the Dockerfile with SERVICE=%s", name, name)
		} else if _, err := os.Stat(fmt.Sprintf("../examples/%s/main.go", name)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		for v := range s.Environment {
			switch {
			case strings.HasPrefix(v, "OTEL_"):
				if !otelVariables[v] {
					t.Errorf("%s: %s is not an OpenTelemetry variable the SDK reads", name, v)
				}
			case known[v]:
			default:
				t.Errorf("%s: %s is not a field of consumer.Config (nothing reads it)", name, v)
			}
		}
		env := s.Environment
		if _, err := consumer.ConfigFromLookuper(t.Context(), mapLookuper(env)); err != nil {
			t.Errorf("%s: its environment is not a valid configuration: %v", name, err)
		}
		if env["EXACTLY_KAFKA_BROKERS"] != "kafka:9092" || !strings.Contains(kafka.Environment["KAFKA_ADVERTISED_LISTENERS"], "//kafka:9092") {
			t.Errorf("%s: EXACTLY_KAFKA_BROKERS=%q is not the broker's advertised in-network listener", name, env["EXACTLY_KAFKA_BROKERS"])
		}
		u, err := url.Parse(env["DATABASE_URL"])
		if err != nil || u.Hostname() != "postgres" || u.User.Username() != pg["POSTGRES_USER"] || u.Path != "/"+pg["POSTGRES_DB"] {
			t.Errorf("%s: DATABASE_URL %q does not reach the postgres service", name, env["DATABASE_URL"])
		} else if p, _ := u.User.Password(); p != pg["POSTGRES_PASSWORD"] {
			t.Errorf("%s: DATABASE_URL password differs from POSTGRES_PASSWORD", name)
		}
		if env["OTEL_EXPORTER_OTLP_ENDPOINT"] != "http://jaeger:4317" {
			t.Errorf("%s: OTEL_EXPORTER_OTLP_ENDPOINT=%q, want Jaeger's OTLP/gRPC http://jaeger:4317", name, env["OTEL_EXPORTER_OTLP_ENDPOINT"])
		}
		if env["OTEL_SERVICE_NAME"] != name {
			t.Errorf("%s: OTEL_SERVICE_NAME=%q", name, env["OTEL_SERVICE_NAME"])
		}
		addr := env["EXACTLY_METRICS_ADDR"]
		_, port, _ := strings.Cut(addr, ":")
		host := hostPorts(s.Ports)[port]
		if addr == "" || host == "" {
			t.Errorf("%s: metrics endpoint %q not published: %v", name, addr, s.Ports)
		} else if other, dup := hostSeen[host]; dup {
			t.Errorf("%s and %s both publish host port %s", name, other, host)
		}
		hostSeen[host] = name
		for _, dep := range []string{"kafka", "postgres", "jaeger"} {
			if _, ok := s.DependsOn[dep]; !ok {
				t.Errorf("%s does not depend on %s", name, dep)
			}
		}
	}
}

type mapLookuper map[string]string

func (m mapLookuper) Lookup(key string) (string, bool) {
	v, ok := m[key]
	return v, ok
}
