GO ?= go
export GOFLAGS ?= -mod=mod

.PHONY: demo test test-pg17 test-browser vet bench chaos fmt

# DB_PKGS: the packages whose tests use PostgreSQL (their tests import internal/testenv… or pgx).
DB_PKGS = $(shell $(GO) list -f '{{.ImportPath}}{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}' ./... | awk '{for (i = 2; i <= NF; i++) if ($$i ~ /internal\/testenv|jackc\/pgx/) {print $$1; break}}')

## demo: the experiment of Making Background Jobs Idempotent, with real parts (embedded broker and PostgreSQL)
demo:
	$(GO) run ./cmd/exactly demo

## test: go vet, staticcheck, gofmt and the race-enabled test suite against a private PostgreSQL and kfake
test: vet
	$(GO) test -race -count=1 -timeout 9m ./...

## test-pg17: the database-facing tests again on PostgreSQL 17.10 (binaries installed outside the repository by install-postgres17.sh)
test-pg17:
	@bin="$$(./internal/testenv/pgserver/install-postgres17.sh | tail -n1)" && \
	"$$bin/postgres" --version && \
	env -u DATABASE_URL EXACTLY_PG_BIN="$$bin" $(GO) test -count=1 -timeout 15m $(DB_PKGS)

## test-browser: the status page in headless Chromium (apt-get install chromium); screenshot checked non-blank
test-browser:
	@command -v chromium >/dev/null 2>&1 || (echo "test-browser: chromium not found; apt-get install -y chromium" && exit 1)
	$(GO) test -tags browser -count=1 -timeout 5m -run Browser -v ./cmd/exactly/internal/status

## vet: go vet, staticcheck (a tool in go.mod) and gofmt
vet:
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || (echo "gofmt: files above need formatting" && exit 1)

fmt:
	gofmt -w .

## bench: exactly side by side with its limits (docs/performance.md); BENCHFLAGS=-records=10000 for a quick run
bench:
	$(GO) run ./cmd/exactly bench $(BENCHFLAGS)

.PHONY: up down
## up: the Docker stack: Kafka (KRaft), PostgreSQL 17, Jaeger, Prometheus, Grafana, examples/credit and examples/notify
up:
	docker compose up --build -d
	@echo "Jaeger: http://localhost:16686  credit metrics: http://localhost:9464/metrics  notify metrics: http://localhost:9465/metrics"
	@echo "Prometheus: http://localhost:9090  Grafana: http://localhost:3000 (dashboard exactly)"

## down: stop the Docker stack and remove its volumes
down:
	docker compose down -v

## chaos: the services as processes under seeded faults (kill -9, SIGSTOP, PostgreSQL crash, broker faults and restart), then the ledger checker; SEED=… reproduces a run
chaos:
	$(GO) run ./cmd/exactly chaos $(if $(SEED),-seed $(SEED)) $(CHAOSFLAGS)
