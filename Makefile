# kvc-router: the one entry point. `make help` lists the targets.
SHELL      := /bin/bash
GO         ?= go
PYTHON     ?= python3
VENV       ?= .venv
VENV_VERL  ?= .venv-verl
# verl releases the hook claims; the first is installed in $(VENV_VERL), the
# others are --no-deps overlays sharing its torch (scripts/verl_venv.sh).
VERL_VERSIONS ?= 0.9.1 0.9.0 0.8.0
PY         := $(VENV)/bin/python
BIN        := bin
LIB        := build/libkvcrouter.so
FUZZTIME   ?= 30s
BENCHTIME  ?= 1s
SOAK_PAIRS ?= 1000000
GOFILES     = $(shell git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.venv/*')
GO_SRC     := $(shell find core cabi -name '*.go' -not -name '*_test.go' 2>/dev/null) go.mod go.sum
PYLIB      := python/kvc_router/libkvcrouter.so
# Export only the kvr_* API: without the version script ~45 _cgo_* symbols leak.
LIB_LDFLAGS = -s -w -extldflags=-Wl,--version-script=$(CURDIR)/cabi/kvcrouter.map

.PHONY: help build lib wheel test test-go test-py test-verl bench kvbench demo overhead gpu-validate fuzz chaos soak lint venv clean

help:
	@echo "build  - Go binaries into $(BIN)/ (vllm-sim, kvbench, kvctl)"
	@echo "lib    - $(LIB) (cgo c-shared) and its header"
	@echo "wheel  - the kvc-router platform wheel into dist/"
	@echo "test   - gofmt check, go vet, go test -race, pytest"
	@echo "test-verl    - tests/verl against each published verl in VERL_VERSIONS ($(VERL_VERSIONS); CPU)"
	@echo "bench  - Go benchmarks (BENCHTIME=$(BENCHTIME))"
	@echo "kvbench - replay mooncake/grpo/agent over 8 simulated engines, every routing policy (~5 min)"
	@echo "demo   - simulated vLLM fleet + local Ray: default vs kvc_aware"
	@echo "overhead     - decision, C ABI, Ray round-trip and event-ingest costs in one table"
	@echo "gpu-validate - the demo against real vLLM servers (GPU_VALIDATE_ARGS='--backend sim' without a GPU)"
	@echo "fuzz   - every Go fuzz target for FUZZTIME=$(FUZZTIME)"
	@echo "chaos  - long fault/hostile runs: 20 kill/restart cycles, 1M hostile ABI calls, 10M-block flood"
	@echo "soak   - SOAK_PAIRS=$(SOAK_PAIRS) acquire/release pairs through the Ray actor under live events/metrics"
	@echo "lint   - gofmt, go vet, ruff"

build:
	@mkdir -p $(BIN)
	@for d in cmd/*/; do \
	  n=$$(basename $$d); \
	  if ls $$d*.go >/dev/null 2>&1; then $(GO) build -o $(BIN)/$$n ./$$d || exit 1; fi; \
	done

lib:
	@mkdir -p build
	CGO_ENABLED=1 $(GO) build -buildmode=c-shared -trimpath -ldflags "$(LIB_LDFLAGS)" -o $(LIB) ./cabi
	@rm -f build/libkvcrouter.h && cp cabi/kvcrouter.h build/kvcrouter.h
	@echo "built $(LIB) and build/kvcrouter.h"

# The library inside the Python package, rebuilt whenever Go sources change.
$(PYLIB): $(GO_SRC)
	CGO_ENABLED=1 $(GO) build -buildmode=c-shared -trimpath -ldflags "$(LIB_LDFLAGS)" -o $@ ./cabi
	@rm -f python/kvc_router/libkvcrouter.h

wheel:
	$(PYTHON) -m pip wheel --no-deps -w dist .

test: test-go test-py

test-go:
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

test-py: venv $(PYLIB) build
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

kvbench:
	@mkdir -p build
	$(GO) run ./cmd/kvbench --workload mooncake --json build/kvbench-mooncake.json --csv build/kvbench-mooncake.csv --plot build/kvbench-mooncake.png
	$(GO) run ./cmd/kvbench --workload grpo --json build/kvbench-grpo.json --plot build/kvbench-grpo.png
	$(GO) run ./cmd/kvbench --workload agent --json build/kvbench-agent.json --plot build/kvbench-agent.png

demo: venv build $(PYLIB)
	$(PY) scripts/demo.py $(DEMO_ARGS)

overhead: venv build $(PYLIB)
	$(PY) scripts/overhead.py

gpu-validate: venv build $(PYLIB)
	bash scripts/gpu-validate.sh $(GPU_VALIDATE_ARGS)

fuzz:
	FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh

chaos: venv $(PYLIB) build
	$(PY) scripts/chaos.py

soak: venv $(PYLIB) build
	$(PY) scripts/soak.py --pairs $(SOAK_PAIRS)

lint:
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@if [ -d python ]; then $(MAKE) venv && $(PY) -m ruff check python tests scripts; fi

clean:
	rm -rf $(BIN) build dist *.egg-info python/*.egg-info python/kvc_router/*.so python/kvc_router/libkvcrouter.h
