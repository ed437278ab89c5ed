# kvc-router: the one entry point. `make help` lists the targets.
SHELL      := /bin/bash
GO         ?= go
PYTHON     ?= python3
VENV       ?= .venv
VENV_VERL  ?= .venv-verl
# verl releases the hook claims; the first is installed in $(VENV_VERL), the
# others are --no-deps overlays sharing its torch (scripts/verl_venv.sh).
VERL_VERSIONS ?= 0.9.1 0.9.0 0.8.0
VENV_PEERS ?= .venv-peers
ARENA_ARGS ?=
PY         := $(VENV)/bin/python
BIN        := bin
LIB        := build/libkvcrouter.so
FUZZTIME   ?= 30s
BENCHTIME  ?= 1s
SOAK_PAIRS ?= 1000000
GOFILES     = $(shell git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.venv/*')
GO_SRC     := $(shell find core cabi -name '*.go' -not -name '*_test.go' 2>/dev/null) go.mod go.sum
PYLIB      := python/kvc_router/libkvcrouter.so
# The scripts import the test harness package tests/kvc_harness.
PYH        := PYTHONPATH=$(CURDIR)/tests $(PY)
# The test build of the library (adds kvr_debug_panic); never shipped.
TESTLIB    := build/test/libkvcrouter.so

.PHONY: docs help build lib testlib wheel test test-go test-py test-verl bench kvbench kvbench-heldout demo overhead gpu-validate fuzz chaos soak actor-bench lint venv clean arena arena-short peers-venv

help:
	@echo "build  - Go binaries into $(BIN)/ (vllm-sim, kvbench, kvctl)"
	@echo "lib    - $(LIB) (cgo c-shared) and its header"
	@echo "testlib - $(TESTLIB): the library built with -tags kvrdebug (tests only)"
	@echo "wheel  - the kvc-router platform wheel into dist/"
	@echo "test   - gofmt check, go vet, go test -race, pytest"
	@echo "test-verl    - tests/verl against each published verl in VERL_VERSIONS ($(VERL_VERSIONS); CPU)"
	@echo "bench  - Go benchmarks (BENCHTIME=$(BENCHTIME))"
	@echo "kvbench - replay mooncake/grpo/agent/agent_long over 8 simulated engines, one policy per system (docs/kvbench.md)"
	@echo "kvbench-heldout - tune each policy's main knob on seeds 101,102, report seeds 1-5 (mean, SD)"
	@echo "demo   - simulated vLLM fleet + local Ray: default vs kvc_aware"
	@echo "arena  - real sglang-router/vllm-router vs kvc-router on vllm-sim fleets, 5 workloads x 3 seeds (~15 min)"
	@echo "arena-short  - the same at a small size, one seed (ARENA_ARGS=... passes options to scripts/arena.py)"
	@echo "overhead     - decision, C ABI, Ray round-trip and event-ingest costs in one table"
	@echo "gpu-validate - the demo against real vLLM servers (GPU_VALIDATE_ARGS='--backend sim' without a GPU)"
	@echo "fuzz   - every Go fuzz target for FUZZTIME=$(FUZZTIME)"
	@echo "chaos  - long fault/hostile runs: 20 kill/restart cycles, 1M hostile ABI calls, 10M-block flood"
	@echo "soak   - SOAK_PAIRS=$(SOAK_PAIRS) acquire/release pairs through the Ray actor under live events/metrics"
	@echo "actor-bench  - acquire/release pairs/s through the Ray actor, ours vs verl 0.9.1's, 8/32/128 async callers -> build/overhead/actor.json"
	@echo "lint   - gofmt, go vet, ruff"
	@echo "docs   - regenerate docs/configuration.md from the Go configuration model (a test fails when it is stale)"

build:
	@mkdir -p $(BIN)
	@for d in cmd/*/; do \
	  n=$$(basename $$d); \
	  if ls $$d*.go >/dev/null 2>&1; then $(GO) build -o $(BIN)/$$n ./$$d || exit 1; fi; \
	done

# cabi/build.sh is the one c-shared build command (setup.py runs it too).
lib:
	GO=$(GO) bash cabi/build.sh $(LIB)
	@cp cabi/kvcrouter.h build/kvcrouter.h
	@echo "built $(LIB) and build/kvcrouter.h"

# The library inside the Python package, rebuilt whenever Go sources change.
$(PYLIB): $(GO_SRC) cabi/build.sh cabi/kvcrouter.map
	GO=$(GO) bash cabi/build.sh $@

testlib: $(TESTLIB)

$(TESTLIB): $(GO_SRC) cabi/build.sh cabi/kvcrouter.map
	GO=$(GO) bash cabi/build.sh $@ kvrdebug

wheel:
	$(PYTHON) -m pip wheel --no-deps -w dist .

test: test-go test-py

# docs/configuration.md is generated from core/kvcrouter.Config and the
# strategy and collector registries; core/kvcrouter/refdoc's test fails
# when the checked-in file is stale.
docs:
	$(GO) run ./cmd/kvctl config-doc > docs/configuration.md

test-go:
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

test-py: venv $(PYLIB) $(TESTLIB) build peers-venv
	$(PY) -m pytest -q tests

# Each verl release from PyPI against one shared torch venv (PyPI's CUDA build;
# no GPU is used): the first in VERL_VERSIONS is installed, the others are
# overlays put first on PYTHONPATH. KVC_VERL_EXPECT makes a run fail if the
# overlay did not take.
test-verl: $(PYLIB) build
	VENV_VERL=$(VENV_VERL) PYTHON=$(PYTHON) VERL_VERSIONS="$(VERL_VERSIONS)" bash scripts/verl_venv.sh
	@set -e; base=$(firstword $(VERL_VERSIONS)); for v in $(VERL_VERSIONS); do \
	  pp=; [ "$$v" = "$$base" ] || pp=$(abspath $(VENV_VERL))/verl-overlays/$$v; \
	  echo "== verl $$v"; \
	  KVC_VERL_EXPECT=$$v PYTHONPATH=$$pp $(VENV_VERL)/bin/python -m pytest -q tests/verl; \
	done

venv: $(VENV)/.stamp

$(VENV)/.stamp: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

bench:
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) ./core/...

# KVBENCH_TRACE: the Mooncake trace (default: the full public trace beside
# the repository; cmd/kvbench/testdata/conversation_trace_1000.jsonl ships in it).
KVBENCH_TRACE ?= ../shared/data/mooncake/conversation_trace.jsonl
KVBENCH_HELDOUT ?= --tune-seeds 101,102 --report-seeds 1,2,3,4,5

kvbench:
	@mkdir -p build
	$(GO) run ./cmd/kvbench --workload mooncake --trace $(KVBENCH_TRACE) --json build/kvbench-mooncake.json --csv build/kvbench-mooncake.csv --plot build/kvbench-mooncake.png
	$(GO) run ./cmd/kvbench --workload grpo --json build/kvbench-grpo.json --plot build/kvbench-grpo.png
	$(GO) run ./cmd/kvbench --workload agent --json build/kvbench-agent.json --plot build/kvbench-agent.png
	$(GO) run ./cmd/kvbench --workload agent_long --json build/kvbench-agent_long.json --plot build/kvbench-agent_long.png

# The held-out evaluation behind docs/kvbench.md (tune on some seeds, report others).
kvbench-heldout:
	@mkdir -p build
	$(GO) run ./cmd/kvbench --heldout --workload grpo $(KVBENCH_HELDOUT) --policies verl_default,round_robin,sglang_cache_aware,llmd_weighted,llmd_precise,llmd_precise+spec,dynamo_cost,kvc_aware --json build/heldout-grpo.json
	$(GO) run ./cmd/kvbench --heldout --workload grpo --arrival-spread 0.3 $(KVBENCH_HELDOUT) --policies verl_default,sglang_cache_aware,llmd_precise,dynamo_cost,kvc_aware --json build/heldout-grpo-spread.json
	$(GO) run ./cmd/kvbench --heldout --workload agent --steps 2 $(KVBENCH_HELDOUT) --policies verl_default,sglang_cache_aware,llmd_precise,llmd_precise+session,dynamo_cost,dynamo_cost+session,kvc_aware --json build/heldout-agent.json
	$(GO) run ./cmd/kvbench --heldout --workload agent_long $(KVBENCH_HELDOUT) --policies verl_default,sglang_cache_aware,llmd_precise,llmd_precise+session,dynamo_cost,dynamo_cost+session,kvc_aware --json build/heldout-agent_long.json
	$(GO) run ./cmd/kvbench --heldout --workload mooncake --trace cmd/kvbench/testdata/conversation_trace_1000.jsonl $(KVBENCH_HELDOUT) --policies verl_default,round_robin,sglang_cache_aware,llmd_weighted,llmd_precise,dynamo_cost,kvc_aware --json build/heldout-mooncake.json
	$(GO) run ./cmd/kvbench --sweep-spread 0,0.1,0.25,0.5 --sweep-seeds 1,2,3 --workload grpo --policies verl_default,sglang_cache_aware,llmd_precise,dynamo_cost,kvc_aware
	$(GO) run ./cmd/kvbench --sweep-spread 0,0.5 --sweep-seeds 1,2,3 --event-delay 0.05 --workload grpo --policies llmd_precise,dynamo_cost,kvc_aware

demo: venv build $(PYLIB)
	$(PYH) scripts/demo.py $(DEMO_ARGS)

# The real peer routers (pinned PyPI wheels) in their own venv.
peers-venv: $(VENV_PEERS)/.stamp

$(VENV_PEERS)/.stamp: scripts/peers_venv.sh
	VENV_PEERS=$(VENV_PEERS) PYTHON=$(PYTHON) bash scripts/peers_venv.sh

arena: venv build $(PYLIB) peers-venv
	KVR_PEERS_PYTHON=$(CURDIR)/$(VENV_PEERS)/bin/python $(PYH) scripts/arena.py $(ARENA_ARGS)

arena-short: venv build $(PYLIB) peers-venv
	KVR_PEERS_PYTHON=$(CURDIR)/$(VENV_PEERS)/bin/python $(PYH) scripts/arena.py --short --seeds 1 --out build/arena-short $(ARENA_ARGS)

overhead: venv build $(PYLIB)
	$(PYH) scripts/overhead.py

gpu-validate: venv build $(PYLIB)
	bash scripts/gpu-validate.sh $(GPU_VALIDATE_ARGS)

fuzz:
	FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh

chaos: venv $(PYLIB) build
	$(PYH) scripts/chaos.py

# Balancer actor throughput against verl's own actor, same run (verl's venv has ray).
actor-bench: $(PYLIB)
	@[ -x $(VENV_VERL)/bin/python ] || VENV_VERL=$(VENV_VERL) PYTHON=$(PYTHON) bash scripts/verl_venv.sh
	PYTHONPATH=$(CURDIR)/python:$(CURDIR)/tests $(VENV_VERL)/bin/python scripts/actor_bench.py $(ACTOR_BENCH_ARGS)

soak: venv $(PYLIB) build
	$(PYH) scripts/soak.py --pairs $(SOAK_PAIRS)

lint:
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@if [ -d python ]; then $(MAKE) venv && $(PY) -m ruff check python tests scripts; fi

clean:
	rm -rf $(BIN) build dist *.egg-info python/*.egg-info python/kvc_router/*.so python/kvc_router/libkvcrouter.h
