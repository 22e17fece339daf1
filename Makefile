# throttler — see README.md. Every target works on a fresh clone; the tests
# need redis-server, redis-sentinel and promtool on PATH (apt-get install
# redis-server redis-sentinel prometheus), and bash, curl and openssl for the
# docs' commands; NATS runs in-process, and as nats-server processes built
# from go.mod for the cluster tests and deploy/local/fleet.sh.
GO      ?= go
BIN     := bin/throttler
PKGS    := ./...
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
# The revision goes in by hand: the go tool records none with
# GOFLAGS=-buildvcs=false, nor in a tree without .git (throttler version).
REVISION ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)
MODIFIED ?= $(shell test -n "$$(git status --porcelain --untracked-files=no 2>/dev/null)" && echo true)
LDFLAGS := -X main.version=$(VERSION) -X main.revision=$(REVISION) -X main.modified=$(MODIFIED)
# Image tag: the version, never latest (deploy/kubernetes/kustomization.yaml).
IMAGE   ?= throttler:$(VERSION)

.PHONY: all build image rules run test test-fleet race check fmt vet staticcheck fuzz-smoke bench bench-smoke clean \
	mutate mutate-settle mutate-admission mutate-leaky mutate-keyed mutate-bucket mutate-redisbucket

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/throttler

# The container image, tagged with the version (needs docker).
image:
	docker build -f deploy/Dockerfile --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) \
	  --build-arg MODIFIED=$(MODIFIED) -t $(IMAGE) .

# The alerting rules: syntax, and their unit tests (deploy/prometheus/
# alerts_test.yml). promtool is in Debian's prometheus package; `make test`
# runs the same through deploy/deploy_test.go.
rules:
	promtool check rules deploy/prometheus/alerts.yml
	promtool test rules deploy/prometheus/alerts_test.yml

# The embedded default: in-process NATS JetStream in ./data, in-memory pacer,
# the demo lane from configs/throttler.yaml delivering to a local sink that
# logs each arrival. Ctrl-C stops both.
run: build
	@$(BIN) sink --listen 127.0.0.1:9000 & sink=$$!; \
	trap 'kill $$sink 2>/dev/null; wait $$sink 2>/dev/null' EXIT INT TERM; \
	$(BIN) serve --config configs/throttler.yaml

# Two rounds, so that the timing-heavy packages never share the cores
# with each other (the fleet's tests are `make test-fleet`): first every
# other package (-p 4: most of them wait on
# servers and the real clock, not on the CPU, so two at a time left the
# cores idle); then the real-clock pacing tests of leaky, service and
# cmd/throttler one package at a time. While the first round runs, the test
# binaries of the second are built (go test -c) into a temporary directory,
# and the second round runs those binaries, each in its package's
# directory as go test would: go test relinks a test binary on every run,
# and with -p 1 the next package's link waited for the previous package's
# tests (13 s for internal/service's on a loaded machine). Inside a
# package, the real-clock tests run first, one at a time; the tests that
# only check outcomes call t.Parallel and run after them, 8 at a time in
# every round, 16 in internal/service (-parallel: they wait on servers,
# not on the CPU; the default would be the 2 cores; internal/service's
# 182 tests used 29 s of CPU in 124 s, and 16 took 11 s off). The throttler binary that the process
# tests start is built once for all (testenv.ThrottlerBinary). Round 1
# lists its longest packages first (FIRST, longest first): go test builds
# and runs in the order of its list, so they start early, and the round
# does not end on one of them started last.
# docs/TESTING.md has the figures.
TIMING  := ./internal/leaky ./internal/service ./cmd/throttler
FLEET   := ./internal/fleet
FIRST   := ./cmd/throttler-bench ./worker ./internal/bench ./internal/queue ./internal/testenv . ./deploy ./internal/ingest ./client
MODULE  := github.com/throttler/throttler
importpath = $(patsubst %/.,%,$(MODULE)/$(1:./%=%))
test:
	@bins=$$(mktemp -d); trap 'rm -rf "$$bins"' EXIT; \
	$(GO) test -c -o "$$bins/" $(TIMING) >"$$bins/build.log" 2>&1 & pre=$$!; \
	echo "$(GO) test -count=1 -timeout 10m -p 4 -parallel 8 <every package but $(TIMING) $(FLEET)>"; \
	pkgs=$$($(GO) list $(PKGS) | grep -vxF $(foreach p,$(TIMING) $(FLEET),-e '$(call importpath,$(p))')); \
	first=$$(for p in $(foreach p,$(FIRST),$(call importpath,$(p))); do echo "$$pkgs" | grep -xF "$$p"; done); \
	$(GO) test -count=1 -timeout 10m -p 4 -parallel 8 $$first $$(echo "$$pkgs" | grep -vxF $(foreach p,$(FIRST),-e '$(call importpath,$(p))')); \
	status=$$?; \
	if ! wait $$pre; then echo "the test binaries of $(TIMING) did not build:"; cat "$$bins/build.log"; exit 1; fi; \
	if [ $$status != 0 ]; then exit $$status; fi; \
	echo "<the test binaries of $(TIMING)> -test.timeout=10m -test.parallel=8 (16 for ./internal/service), one package at a time"; \
	for p in $(TIMING); do \
	  begin=$$(date +%s%N); par=8; \
	  if [ $$p = ./internal/service ]; then par=16; fi; \
	  if (cd $$p && "$$bins/$${p##*/}.test" -test.paniconexit0 -test.timeout=10m -test.parallel=$$par); then \
	    result='ok  '; \
	  else \
	    result=FAIL; status=1; \
	  fi; \
	  ms=$$(( ($$(date +%s%N) - begin) / 1000000 )); \
	  printf '%s\t%s\t%d.%03ds\n' "$$result" "$(MODULE)/$${p#./}" $$((ms / 1000)) $$((ms % 1000)); \
	done; \
	exit $$status

# The fleet tests (internal/fleet: NATS and Redis clusters, node loss,
# failover, and deploy/local/cluster.sh run by TestLocalCluster), apart
# from `make test` so that it stays under four minutes warm;
# .ci/run runs both. Their servers would load the cores the pacing tests
# measure on, so they never run beside them.
test-fleet:
	$(GO) test -count=1 -timeout 5m -parallel 8 $(FLEET)

race:
	$(GO) test -race -count=1 -timeout 15m $(PKGS)

# Every fuzz target (func Fuzz… in a *_test.go file) for FUZZTIME each, one
# target per go test run (-fuzz takes one at a time). Their seed corpora in
# testdata/fuzz/ already run in every `make test`. A failing input is written
# to testdata/fuzz/<target>/ and fails the run. Go 1.26's fuzzing engine may
# end a clean run with "context deadline exceeded" when -fuzztime runs out
# (go.dev/issue/75804, fixed in Go 1.27): without a new failing input that is
# reported and not counted as a failure.
FUZZTIME ?= 4s
fuzz-smoke:
	@set -e; \
	for file in $$(grep -rl --include='*_test.go' '^func Fuzz' .); do \
	  dir=$$(dirname $$file); \
	  for name in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$file); do \
	    before=$$(ls $$dir/testdata/fuzz/$$name 2>/dev/null | wc -l); \
	    echo "fuzz-smoke: $$name ($$dir) for $(FUZZTIME)"; \
	    if out=$$($(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$dir 2>&1); then \
	      echo "$$out" | tail -1; \
	    elif [ "$$(ls $$dir/testdata/fuzz/$$name 2>/dev/null | wc -l)" = "$$before" ] && \
	         echo "$$out" | grep -qx '    context deadline exceeded'; then \
	      echo "$$out" | tail -4; \
	      echo "fuzz-smoke: $$name: deadline race of the fuzzing engine at the end of -fuzztime, no failing input (go.dev/issue/75804)"; \
	    else \
	      echo "$$out"; exit 1; \
	    fi; \
	  done; \
	done

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
# (docs/BENCHMARKS.md). Its rss, lanes and keyed rows start the binary built by
# `build`; keyed drains 1,000, 10,000 and 100,000 keys (100 in bench-smoke).
bench: build
	$(GO) test -run '^$$' -bench . -benchmem -timeout 30m $(PKGS)
	$(GO) run -ldflags "$(LDFLAGS)" ./cmd/throttler-bench --throttler $(BIN)

# What CI runs so that the benchmarks never rot: every Go benchmark 100 times
# and every scenario of the load tool with tiny counts (no goal enforced).
# -short: a benchmark whose largest size only repeats a smaller one's code
# path at more cost (BenchmarkSchedMemory's 100,000 keys) runs its smaller
# sizes only.
bench-smoke: build
	$(GO) test -short -run '^$$' -bench . -benchmem -benchtime 100x -timeout 10m $(PKGS)
	$(GO) run -ldflags "$(LDFLAGS)" ./cmd/throttler-bench --smoke --throttler $(BIN)

# Mutation testing by hand (not in CI): github.com/go-gremlins/gremlins,
# pinned, changes one operator at a time in the pacing and admission code and
# runs the package's tests against each change; a change no test notices
# "lives". Each package is its own target (make mutate-leaky); `make mutate`
# runs them all, one package at a time, and fails under 95 % efficacy
# (killed / (killed + lived)). Slow: tens of minutes on two cores. The
# mutation build tag skips the real-clock tests (a tolerance missed through
# load would kill a mutant by chance). GOFLAGS=-vet=off: go test vets the
# package before each mutant's run, which judges no mutant and costs a vet
# of the package and its tests per mutant. Figures, and every mutant that lives
# with the reason, in docs/MUTATION.md.
GREMLINS     ?= GOFLAGS=-vet=off $(GO) run github.com/go-gremlins/gremlins/cmd/gremlins@v0.6.0
MUTATE_FLAGS ?= --tags mutation --timeout-coefficient 10 --workers 1 --threshold-efficacy 95
mutate: mutate-settle mutate-admission mutate-leaky mutate-keyed mutate-bucket mutate-redisbucket

# The settle policy alone: the rest of internal/lane is wiring, tested end to
# end in internal/service.
mutate-settle:
	$(GREMLINS) unleash $(MUTATE_FLAGS) --exclude-files '(lane|control|counting|deps|history|hold|metrics|keyed|overrides|pull|queuestats|trace)\.go$$' ./internal/lane
mutate-admission:
	$(GREMLINS) unleash $(MUTATE_FLAGS) ./internal/admission
mutate-leaky:
	$(GREMLINS) unleash $(MUTATE_FLAGS) ./internal/leaky
# The keyed pacer and its scheduler; its Redis adapter (redisclaims) is
# tested by its own conformance tests.
mutate-keyed:
	$(GREMLINS) unleash $(MUTATE_FLAGS) --exclude-files 'redisclaims' ./internal/keyed
# The GCRA math, rates and quotas, and the memory store; the conformance
# suite (buckettest) is test code, and redisbucket has its own target.
mutate-bucket:
	$(GREMLINS) unleash $(MUTATE_FLAGS) --exclude-files 'buckettest|redisbucket' ./internal/bucket
mutate-redisbucket:
	$(GREMLINS) unleash $(MUTATE_FLAGS) ./internal/bucket/redisbucket

clean:
	rm -rf bin data
