# throttler — see README.md. Every target works on a fresh clone; the tests
# need redis-server and redis-sentinel on PATH (apt-get install redis-server
# redis-sentinel); NATS runs in-process, and as nats-server processes built
# from go.mod for the cluster tests.
GO      ?= go
BIN     := bin/throttler
PKGS    := ./...
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS := -X main.version=$(VERSION)

.PHONY: all build run test race check fmt vet staticcheck bench bench-smoke clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/throttler

# The embedded default: in-process NATS JetStream in ./data, in-memory pacer,
# the demo lane from configs/throttler.yaml delivering to a local sink that
# logs each arrival. Ctrl-C stops both.
run: build
	@$(BIN) sink --listen 127.0.0.1:9000 & sink=$$!; \
	trap 'kill $$sink 2>/dev/null; wait $$sink 2>/dev/null' EXIT INT TERM; \
	$(BIN) serve --config configs/throttler.yaml

test:
	$(GO) test -count=1 -timeout 10m $(PKGS)

race:
	$(GO) test -race -count=1 -timeout 15m $(PKGS)

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

staticcheck:
	$(GO) tool staticcheck $(PKGS)

check: fmt vet staticcheck race

# The Go benchmarks, then the end-to-end load tool (a binary of its own, so
# that the service links none of the peer libraries it is compared with): one
# table pairing each of our figures with a reference measured in the same run
# (docs/BENCHMARKS.md). Its rss rows start the binary built by `build`.
bench: build
	$(GO) test -run '^$$' -bench . -benchmem -timeout 30m $(PKGS)
	$(GO) run -ldflags "$(LDFLAGS)" ./cmd/throttler-bench --throttler $(BIN)

# What CI runs so that the benchmarks never rot: every Go benchmark 100 times
# and every scenario of the load tool with tiny counts (no goal enforced).
bench-smoke: build
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 100x -timeout 10m $(PKGS)
	$(GO) run -ldflags "$(LDFLAGS)" ./cmd/throttler-bench --smoke --throttler $(BIN)

clean:
	rm -rf bin data
