"""The arena: real routers in front of real ``vllm-sim`` fleets.

One cold fleet per (workload, policy, seed); the same seeded workload is
replayed against it by concurrent clients. Policies:

* ``round_robin``   - the client cycles over the servers;
* ``verl_default``  - verl 0.9.1's GlobalRequestLoadBalancer rule (least in-flight,
  seeded random tie-break), :class:`kvc_harness.verl_default.VerlDefault`, checked
  against verl's own class by tests/verl/test_verl_default_diff.py;
* ``kvc_aware``     - the balancer in kvc_aware mode (metrics poller + ZMQ KV
  events). The client acquires a server, sends the request to it, releases it,
  as verl's client does. The balancer object is used directly in this process
  (no Ray actor): the arena measures routing, not Ray's RPC hop;
* ``sglang_router_cache_aware``, ``vllm_router_cache_aware``,
  ``vllm_router_kv_aware``, ``vllm_router_sticky_least_loaded`` (the client calls
  its ``POST /finish_session`` when a trajectory ends), ``smg_*`` (SMG 1.13.0's
  policies at launcher defaults) - the real routers from ``.venv-peers``; clients
  send to the router's URL, which proxies to the fleet;
* ``dynamo_kv_router[+ttl|+agentic|+queue]`` - NVIDIA Dynamo's KvRouter in-process,
  told each request's real first token (its requests are always streamed), at its
  defaults or with one of its own burst/queue features on.

Prompts are text. ``vllm-sim`` tokenises text with one word tokenizer, and the
kvc_aware client gets ``prompt_ids`` from the servers' ``/tokenize``, so text
prefixes and token prefixes agree for every router.

Time: the fleet runs at ``speed`` simulated seconds per wall second. Latencies
and makespans are reported in simulated seconds (wall x speed); router overhead
is reported in wall milliseconds, since a proxy hop is real time.
"""

from __future__ import annotations

import abc
import asyncio
import bisect
import itertools
import json
import math
import os
import random
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from statistics import NormalDist
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from kvc_harness import HOST, REPO
from kvc_harness.balancer import router_config
from kvc_harness.client import COUNTERS, cached_tokens, http_request, reset_prefix_caches, scrape_all, stream_events
from kvc_harness.fleet import Server, start_sim_fleet
from kvc_harness.procs import Cleanup, die_with_parent
from kvc_harness.report import percentile
from kvc_harness.stats import MeanCI, mean_ci, verdict
from kvc_harness.workloads import (
    Dataset,
    Shape,
    correlated,
    lognormal_quantile,
    pareto_quantile,
    rank_quantiles,
    turns_quantile,
    verl_order,
)

MODEL = "sim/arena-8b"

POLICIES = (
    "round_robin",
    "verl_default",
    "kvc_aware",
    "dynamo_kv_router",
    "sglang_router_cache_aware",
    "vllm_router_cache_aware",
    "vllm_router_kv_aware",
    "vllm_router_kv_aware_session",
    "vllm_router_sticky_least_loaded",
    "smg_cache_aware",
    "smg_prefix_hash",
    "smg_consistent_hashing",
    "smg_least_load",
    "dynamo_kv_router+ttl",
    "dynamo_kv_router+agentic",
    "dynamo_kv_router+queue",
    # kvc_aware with its router-side admission (AdmitBalancer); +lengths adds
    # the length learner, so admission starts the longest predicted first.
    "kvc_aware+admit",
    "kvc_aware+admit+lengths",
)
# Dynamo variants: Dynamo 1.6.1 KvRouterConfig features for bursts and
# saturation, each its own row (and its own tuning grid below):
#   +ttl     router_predicted_ttl_secs 5: a side index fed by routing
#            decisions (sibling bursts before any KV event);
#   +agentic the agentic preset: overlap credit 2, prefill_load_scale 4,
#            decode_active_request_weight 64;
#   +queue   router_queue_threshold 1.0 with the wspt queue policy: requests
#            wait in the router while every worker is past the threshold.
DYNAMO_VARIANTS: Dict[str, Dict[str, Any]] = {
    "dynamo_kv_router": {},
    "dynamo_kv_router+ttl": {"router_predicted_ttl_secs": 5.0},
    "dynamo_kv_router+agentic": {"overlap_score_credit": 2.0, "prefill_load_scale": 4.0,
                                 "decode_active_request_weight": 64.0},
    "dynamo_kv_router+queue": {"router_queue_threshold": 1.0, "router_queue_policy": "wspt"},
}
# Real peer routers run as processes: (router, --policy, extra launcher flags).
# Every peer runs at its launcher defaults; `_session` rows add the router's
# own session-affinity option (the client always sends the trajectory id as
# x-session-id, vllm-router's session key, and x-smg-routing-key,
# sglang-router's; sglang-router 0.3.2's cache_aware reads neither).
SESSION_TTL_S = 600
# Routers that hold requests themselves until the engines make progress
# (Dynamo's router queue waits for prefills to complete; kvc_aware's
# admission for a request to finish and free a slot). Held engines make
# none, so under the burst hold such a router and the hold wait for each
# other until the hold's deadline (HOLD_TIMEOUT_S): their rows are run
# without the hold only (arena.py refuses otherwise).
ROUTER_QUEUES = ("dynamo_kv_router+queue", "kvc_aware+admit", "kvc_aware+admit+lengths")
# Tuned peer rows (`make arena-tuned`): each tunable peer's main knobs, four
# points, the first its launcher default; the same points kvbench tunes its
# re-implementations over (cmd/kvbench/heldout.go). A variant "NAME@tuned"
# runs NAME with ArenaConfig.peer_params["NAME@tuned"][workload].
TUNE_GRID: Dict[str, List[Dict[str, Any]]] = {
    "sglang_router_cache_aware": [
        {"balance_abs_threshold": 64, "balance_rel_threshold": 1.5},
        {"balance_abs_threshold": 32, "balance_rel_threshold": 1.1},
        {"balance_abs_threshold": 8, "balance_rel_threshold": 1.1},
        {"balance_abs_threshold": 2, "balance_rel_threshold": 1.05}],
    "vllm_router_cache_aware": [
        {"balance_abs_threshold": 64, "balance_rel_threshold": 1.5},
        {"balance_abs_threshold": 32, "balance_rel_threshold": 1.1},
        {"balance_abs_threshold": 8, "balance_rel_threshold": 1.1},
        {"balance_abs_threshold": 2, "balance_rel_threshold": 1.05}],
    # Dynamo's KvRouterConfig: overlap_score_credit, the prefill-cost credit
    # per cached block; plus a fifth point, use_kv_events=False, Dynamo's
    # approximate mode (the router predicts cached blocks from its own
    # decisions, with a TTL): a burst sent faster than an engine step reaches
    # the router before any KV event does (see docs/arena.md, Noise).
    "dynamo_kv_router": [{"overlap_score_credit": 1.0}, {"overlap_score_credit": 0.5},
                         {"overlap_score_credit": 2.0}, {"overlap_score_credit": 4.0},
                         {"use_kv_events": False}],
    # Each Dynamo feature row tuned on its own grid (its preset is the first point).
    "dynamo_kv_router+ttl": [{"router_predicted_ttl_secs": 5.0}, {"router_predicted_ttl_secs": 2.0},
                             {"router_predicted_ttl_secs": 20.0},
                             {"router_predicted_ttl_secs": 5.0, "overlap_score_credit": 4.0}],
    "dynamo_kv_router+agentic": [{"overlap_score_credit": 2.0}, {"overlap_score_credit": 1.0},
                                 {"overlap_score_credit": 4.0}, {"prefill_load_scale": 1.0}],
    "dynamo_kv_router+queue": [{"router_queue_threshold": 1.0}, {"router_queue_threshold": 0.5},
                               {"router_queue_threshold": 2.0}, {"router_queue_policy": "fcfs"}],
    "smg_cache_aware": [
        {"balance_abs_threshold": 64, "balance_rel_threshold": 1.5},
        {"balance_abs_threshold": 32, "balance_rel_threshold": 1.1},
        {"balance_abs_threshold": 8, "balance_rel_threshold": 1.1},
        {"balance_abs_threshold": 2, "balance_rel_threshold": 1.05}],
}
PEERS = {
    "sglang_router_cache_aware": ("sglang", "cache_aware", ()),
    "vllm_router_cache_aware": ("vllm", "cache_aware", ()),
    "vllm_router_kv_aware": ("vllm", "kv_aware", ()),
    "vllm_router_kv_aware_session": ("vllm", "kv_aware",
                                     ("--kv-aware-session-affinity-ttl-secs", str(SESSION_TTL_S))),
    # The default of SkyRL and prime-rl: sessions keyed by x-session-id (the
    # trajectory id), released by the client's POST /finish_session.
    "vllm_router_sticky_least_loaded": ("vllm", "sticky_least_loaded", ()),
    # SMG (smg 1.13.0, sglang-router's successor) at launcher defaults; its
    # consistent_hashing keys on x-smg-routing-key (the trajectory id).
    "smg_cache_aware": ("smg", "cache_aware", ()),
    "smg_prefix_hash": ("smg", "prefix_hash", ()),
    "smg_consistent_hashing": ("smg", "consistent_hashing", ()),
    "smg_least_load": ("smg", "least_load", ()),
}
# `make arena`: every real peer (launcher defaults, plus vllm-router's session
# variant) against verl's balancer and kvc_aware; round_robin only in arena-full.
DEFAULT_POLICIES = tuple(p for p in POLICIES if p != "round_robin")
# The RL-scale workloads (issue 18); `--workloads all` adds mooncake, grpo, agent
# and agent_open (make arena-full). Measured: ~165 s per seed for these three.
DEFAULT_WORKLOADS = ("grpo_sat", "agent_scale", "long_agent")
# Reported seeds: never run before kvc_aware's configuration was frozen, nor
# before the harness that reports them (306-310 were retired with its change).
DEFAULT_SEEDS = "321,322,323,324,325"
BOUND = "prefill_free_bound"  # not a policy: verl_default on a fleet with free prefill
# Not a policy either: ArenaConfig.repeat_policy run a second time on every
# seed, the run-to-run noise floor (issue 19).
REPEAT_SUFFIX = "#repeat"
# A policy's row without the burst hold (ArenaConfig.both_holds).
NOHOLD_SUFFIX = "+nohold"


def is_policy(name: str) -> bool:
    """False for the bound and the noise-floor repeats, which take no part in
    verdicts, arena.json or the plot."""
    return name != BOUND and not name.endswith(REPEAT_SUFFIX)
RESULT_KEYS = (
    "workload", "policy", "seed", "hit_rate", "ttft_p50_s", "ttft_p99_s", "makespan_s", "imbalance", "errors",
)


# ---------------------------------------------------------------------------
# Workloads: seeded text. One word is one token for vllm-sim's tokenizer.


@dataclass
class Turn:
    max_tokens: int
    tool_words: int  # tool output appended after this turn's response
    tool_latency_s: float = 0.0  # simulated seconds the tool takes before the next turn


@dataclass
class Job:
    """A single request (``turns`` of length 1) or a multi-turn trajectory.
    ``text`` is the first prompt; later prompts append the response and a
    seeded tool output."""

    rid: str
    text: str
    turns: List[Turn]
    arrival_s: float = 0.0  # open loop: simulated seconds after the start
    seed: int = 0


@dataclass
class Step:
    """Jobs run together; a weight update (prefix-cache reset) follows."""

    name: str
    jobs: List[Job]
    reset_after: bool = False


@dataclass
class WorkloadSpec:
    name: str
    kind: str  # grpo | agent | mooncake
    mode: str = "closed"  # closed (``concurrency`` clients) | open (arrival times; rate 0 = all at once)
    concurrency: int = 16
    rate: float = 0.0  # open loop without a trace: jobs per simulated second (Poisson)
    # grpo
    steps: int = 2
    prompts: int = 8
    samples: int = 8
    prompt_words: Tuple[int, int] = (1024, 3072)
    # agent
    tasks: int = 4
    agent_samples: int = 4
    turns: Tuple[int, int] = (4, 8)
    system_words: int = 1024
    tool_words: Tuple[int, int] = (64, 512)
    tool_latency_s: Tuple[float, float] = (0.0, 0.0)  # uniform, simulated seconds
    # responses: log-normal, capped
    response_median: int = 96
    response_sigma: float = 0.8
    response_max: int = 512
    # mooncake
    # The public trace sits beside the repository (shared/data), as make kvbench expects it.
    trace: str = os.path.normpath(os.path.join(REPO, "..", "shared", "data", "mooncake", "conversation_trace.jsonl"))
    trace_conversations: int = 48
    trace_scan: int = 8000  # trace lines read
    trace_seed_stride: int = 700  # each seed's slice starts this many lines later...
    trace_seed_wrap: int = 4000  # ...modulo this (the trace has ~12k lines)
    trace_span_s: float = 60.0  # the slice's arrivals, compressed to this many simulated seconds
    trace_output_max: int = 256
    # Fleet overrides for this workload (0 = ArenaConfig's): the RL-scale
    # workloads run fewer slots and a smaller KV cache per server, so these
    # 2 cores can oversubscribe the fleet.
    max_num_seqs: int = 0
    num_gpu_blocks: int = 0
    # Stratified draws (issue 19's noise target): every seed gets the same
    # multiset of lengths, turn counts and tool latencies (the distribution's
    # quantiles at (i + 0.5) / n), shuffled by the seed. A step's time is set
    # by its longest responses and trajectories, and with i.i.d. draws the
    # seeds' maxima alone moved a policy's step time by +-10-14%, which buried
    # the routers' differences in the seeds' luck. The seed still decides the
    # text, which prompt or trajectory gets which length, and the arrival order.
    stratified: bool = True
    # RL length structure (issue 26; kvc_harness.workloads, the model kvbench
    # uses): length_corr is rho, the within-group correlation of log response
    # length (None, grpo only: the independent draws of the published grpo
    # rows); truncate the share of responses at response_max; dataset_prompts
    # a dataset iterated in shuffled epochs (0 = fresh prompts); epoch_corr a
    # prompt's difficulty correlation between epochs. Agent workloads always
    # take a task difficulty (rho = length_corr or 0) that correlates their
    # trajectories' turn counts and turn lengths; nothing equalises them.
    length_corr: Optional[float] = None
    truncate: float = 0.0
    dataset_prompts: int = 0
    epoch_corr: float = 0.8
    # Submission order of a burst: "shuffled" (the published rows) or "verl"
    # (a prompt's samples consecutive, chunked per agent-loop worker,
    # interleaved). The arena's client cannot reach verl's ~1k acquires/s of
    # simulated time (that is 20k/s wall at speed 20), so a verl-ordered
    # burst is held and released at once (the fleet hold), as kvbench's
    # --arrivals burst; kvbench's --arrivals verl adds the rate.
    arrivals: str = "shuffled"
    client_workers: int = 8
    # Tool latency as a bounded Pareto (min_s, max_s, alpha), simulated
    # seconds; None = tool_latency_s's uniform range.
    tool_pareto: Optional[Tuple[float, float, float]] = None
    # Steps whose makespans the row reports (1: epoch >= 2 when
    # dataset_prompts == prompts); every step still runs.
    report_from_step: int = 0


def workload_specs(short: bool = False) -> Dict[str, WorkloadSpec]:
    """The arena's workloads. ``short`` keeps every shape at a fraction of the size."""
    specs = {
        "grpo": WorkloadSpec("grpo", "grpo", concurrency=32, steps=2, prompts=8, samples=8),
        "agent": WorkloadSpec("agent", "agent", concurrency=16, tasks=4, agent_samples=4, turns=(4, 8),
                              response_median=64, response_max=256),
        "agent_open": WorkloadSpec("agent_open", "agent", mode="open", rate=2.0, tasks=4, agent_samples=4,
                                   turns=(4, 8), response_median=64, response_max=256),
        "long_agent": WorkloadSpec("long_agent", "agent", concurrency=8, tasks=2, agent_samples=4, turns=(20, 40),
                                   system_words=2048, tool_words=(1024, 4096), response_median=64,
                                   response_sigma=0.7, response_max=512),
        "mooncake": WorkloadSpec("mooncake", "mooncake", mode="open", trace_conversations=48),
        # Issue 18: a GRPO step that oversubscribes the fleet 16x in sequences
        # (1,024 samples on 4 servers x 16 slots), every sample submitted at
        # once (verl's agent loop), with a long response tail as in reasoning RL.
        "grpo_sat": WorkloadSpec("grpo_sat", "grpo", mode="open", rate=0.0, steps=1, prompts=128, samples=8,
                                 prompt_words=(512, 1536), response_median=192, response_sigma=0.9,
                                 response_max=2048, max_num_seqs=16, num_gpu_blocks=3072),
        # Agentic RL at scale: 192 multi-turn trajectories (3x the 64 slots)
        # started at once, tool calls taking 0.5-3 simulated seconds.
        "agent_scale": WorkloadSpec("agent_scale", "agent", mode="open", rate=0.0, tasks=24, agent_samples=8,
                                    turns=(3, 6), system_words=1024, tool_words=(64, 512),
                                    tool_latency_s=(0.5, 3.0), response_median=96, response_max=512,
                                    max_num_seqs=16, num_gpu_blocks=4096),
        # Issue 26: grpo_sat with RL's length structure, submitted in verl's
        # order: within-group correlation rho 0.5 and 0.8 (first epoch, no
        # history), and a recurring-prompt pair of steps (a 128-prompt
        # dataset, so step 2 is epoch 2; rho 0.6, epoch correlation 0.8;
        # the row reports step 2 only).
        "grpo_rho05": WorkloadSpec("grpo_rho05", "grpo", mode="open", rate=0.0, steps=1, prompts=128, samples=8,
                                   prompt_words=(512, 1536), response_median=192, response_sigma=0.9,
                                   response_max=2048, max_num_seqs=16, num_gpu_blocks=3072, length_corr=0.5,
                                   arrivals="verl"),
        "grpo_recur": WorkloadSpec("grpo_recur", "grpo", mode="open", rate=0.0, steps=2, prompts=128, samples=8,
                                   prompt_words=(512, 1536), response_median=192, response_sigma=0.9,
                                   response_max=2048, max_num_seqs=16, num_gpu_blocks=3072, length_corr=0.6,
                                   dataset_prompts=128, epoch_corr=0.8, arrivals="verl", report_from_step=1),
        # agent_scale with task difficulty (rho 0.6 over turn counts and turn
        # lengths) and sandbox-like tool latency (bounded Pareto 1-60 s).
        "agent_task": WorkloadSpec("agent_task", "agent", mode="open", rate=0.0, tasks=24, agent_samples=8,
                                   turns=(3, 6), system_words=1024, tool_words=(64, 512), response_median=96,
                                   response_max=512, max_num_seqs=16, num_gpu_blocks=4096, length_corr=0.6,
                                   tool_pareto=(1.0, 60.0, 0.8), arrivals="verl"),
    }
    specs["grpo_rho08"] = replace(specs["grpo_rho05"], name="grpo_rho08", length_corr=0.8)
    # The same step with independent lengths (rho 0), in verl's order: the
    # reference the correlated settings are read against.
    specs["grpo_rho0"] = replace(specs["grpo_rho05"], name="grpo_rho0", length_corr=0.0)
    if short:
        specs["grpo"] = replace(specs["grpo"], steps=1, prompts=4, samples=4, prompt_words=(256, 768),
                                concurrency=8, response_max=64)
        specs["agent"] = replace(specs["agent"], tasks=2, agent_samples=3, turns=(2, 3), system_words=256,
                                 tool_words=(32, 128), concurrency=6, response_max=48)
        specs["agent_open"] = replace(specs["agent_open"], tasks=2, agent_samples=3, turns=(2, 3),
                                      system_words=256, tool_words=(32, 128), response_max=48)
        specs["long_agent"] = replace(specs["long_agent"], tasks=1, agent_samples=3, turns=(6, 8),
                                      system_words=512, tool_words=(256, 1024), response_max=96, concurrency=3)
        specs["mooncake"] = replace(specs["mooncake"], trace_conversations=10, trace_span_s=10.0,
                                    trace_output_max=48)
        specs["grpo_sat"] = replace(specs["grpo_sat"], prompts=8, samples=8, prompt_words=(256, 512),
                                    response_median=48, response_max=192, max_num_seqs=4, num_gpu_blocks=1024)
        for name in ("grpo_rho0", "grpo_rho05", "grpo_rho08", "grpo_recur"):
            specs[name] = replace(specs[name], prompts=8, samples=8, prompt_words=(256, 512), response_median=48,
                                  response_max=192, max_num_seqs=4, num_gpu_blocks=1024,
                                  dataset_prompts=8 if specs[name].dataset_prompts else 0)
        specs["agent_task"] = replace(specs["agent_task"], tasks=3, agent_samples=6, turns=(2, 3), system_words=256,
                                      tool_words=(32, 128), response_max=48, max_num_seqs=4, num_gpu_blocks=1024,
                                      tool_pareto=(0.2, 6.0, 0.8))
        specs["agent_scale"] = replace(specs["agent_scale"], tasks=3, agent_samples=6, turns=(2, 3),
                                       system_words=256, tool_words=(32, 128), response_max=48,
                                       max_num_seqs=4, num_gpu_blocks=1024)
    return specs


def _words(rng: random.Random, n: int, tag: str) -> List[str]:
    # Seeded words drawn from a large space, so unrelated texts share no prefix.
    return [f"{tag}{rng.getrandbits(40):x}" for _ in range(n)]


def _response_len(rng: random.Random, spec: WorkloadSpec) -> int:
    v = int(round(spec.response_median * math.exp(rng.gauss(0.0, spec.response_sigma))))
    return max(1, min(spec.response_max, v))


_NORMAL = NormalDist()


class _Draws:
    """The workload's random quantities. ``stratified``: each quantity's n
    values are its distribution's quantiles at (i + 0.5) / n, shuffled by the
    seed, so seeds differ in who gets which value, never in the values; else
    i.i.d. draws from ``rng``."""

    def __init__(self, spec: WorkloadSpec, rng: random.Random) -> None:
        self.spec = spec
        self.rng = rng

    def _quantiles(self, n: int, inv: Callable[[float], float]) -> List[float]:
        vs = [inv((i + 0.5) / n) for i in range(n)]
        self.rng.shuffle(vs)
        return vs

    def ints(self, n: int, lo_hi: Tuple[int, int]) -> List[int]:
        lo, hi = lo_hi
        if not self.spec.stratified:
            return [self.rng.randint(lo, hi) for _ in range(n)]
        return [int(v) for v in self._quantiles(n, lambda q: min(hi, lo + math.floor(q * (hi - lo + 1))))]

    def uniforms(self, n: int, lo_hi: Tuple[float, float]) -> List[float]:
        lo, hi = lo_hi
        if hi <= 0:
            return [0.0] * n
        if not self.spec.stratified:
            return [self.rng.uniform(lo, hi) for _ in range(n)]
        return self._quantiles(n, lambda q: lo + q * (hi - lo))

    def responses(self, n: int) -> List[int]:
        sp = self.spec
        if not sp.stratified:
            return [_response_len(self.rng, sp) for _ in range(n)]

        def inv(q: float) -> float:
            v = int(round(sp.response_median * math.exp(sp.response_sigma * _NORMAL.inv_cdf(q))))
            return max(1, min(sp.response_max, v))

        return [int(v) for v in self._quantiles(n, inv)]


def build_steps(spec: WorkloadSpec, seed: int) -> List[Step]:
    rng = random.Random(f"{spec.name}:{seed}")
    draws = _Draws(spec, rng)
    if spec.kind == "grpo" and spec.length_corr is not None:
        return _arrivals(spec, rng, _shaped_grpo(spec, seed, rng, draws))
    if spec.kind == "grpo":
        prompt_lens = draws.ints(spec.steps * spec.prompts, spec.prompt_words)
        responses = draws.responses(spec.steps * spec.prompts * spec.samples)
        steps = []
        for s in range(spec.steps):
            jobs = []
            for p in range(spec.prompts):
                text = " ".join(_words(rng, prompt_lens.pop(), "g"))
                for k in range(spec.samples):
                    turn = Turn(responses.pop(), 0)
                    jobs.append(Job(f"g{s}-{p}-{k}", text, [turn], seed=rng.getrandbits(31)))
            rng.shuffle(jobs)  # samples of one prompt do not arrive back to back
            steps.append(Step(f"grpo-{s + 1}", jobs, reset_after=True))
        return _arrivals(spec, rng, steps)
    if spec.kind == "agent":
        return _arrivals(spec, rng, [_shaped_agent(spec, seed, rng, draws)])
    if spec.kind == "mooncake":
        return [Step(spec.name, mooncake_jobs(spec, seed))]
    raise ValueError(f"unknown workload kind {spec.kind!r}")


def _assign(spec: WorkloadSpec, latent: List[float], quantile: Callable[[float], Any]) -> List[Any]:
    """Stratified: rank_quantiles (the same multiset every seed); else each
    latent's own quantile (i.i.d. draws with the same correlation)."""
    if spec.stratified:
        return rank_quantiles(latent, quantile)
    return [quantile(min(1 - 1e-12, max(1e-12, _NORMAL.cdf(x)))) for x in latent]


def _shape(spec: WorkloadSpec) -> Shape:
    return Shape(length_corr=spec.length_corr or 0.0, truncate=spec.truncate, dataset_prompts=spec.dataset_prompts,
                 epoch_corr=spec.epoch_corr)


def _order(spec: WorkloadSpec, rng: random.Random, groups: List[List[Job]]) -> List[Job]:
    if spec.arrivals == "verl":
        return verl_order(groups, spec.client_workers)
    if spec.arrivals != "shuffled":
        raise ValueError(f"{spec.name}: arrivals {spec.arrivals!r}: want shuffled or verl")
    jobs = [j for g in groups for j in g]
    rng.shuffle(jobs)
    return jobs


def _shaped_grpo(spec: WorkloadSpec, seed: int, rng: random.Random, draws: _Draws) -> List[Step]:
    """GRPO steps with RL's length structure (kvbench's shaped grpo): prompts
    from the dataset, each prompt's samples' lengths by rank of correlated
    latents (the same multiset every seed and rho)."""
    shape = _shape(spec)
    ds = Dataset(f"{spec.name}:{seed}", shape, spec.prompts)
    steps = []
    for s in range(spec.steps):
        ids, epoch = ds.step(s)
        lat = [correlated(rng, ds.difficulty(k, epoch), shape.length_corr) for k in ids for _ in range(spec.samples)]
        lens = _assign(spec, lat, lambda q: lognormal_quantile(q, spec.response_median, spec.response_sigma, 1,
                                                                spec.response_max, shape.truncate))
        groups = []
        for b, k in enumerate(ids):
            prng = random.Random(f"{spec.name}:{seed}:prompt{k}")  # a prompt's text is the same every epoch
            text = " ".join(_words(prng, prng.randint(*spec.prompt_words), "g"))
            groups.append([Job(f"g{s}-{b}-{j}", text, [Turn(lens[b * spec.samples + j], 0)], seed=rng.getrandbits(31))
                           for j in range(spec.samples)])
        steps.append(Step(f"grpo-{s + 1}", _order(spec, rng, groups), reset_after=True))
    return steps


def _shaped_agent(spec: WorkloadSpec, seed: int, rng: random.Random, draws: _Draws) -> Step:
    """One agent step: a task's difficulty enters its trajectories' turn-count
    latents and every turn's length latent, so hard tasks run more and longer
    turns. Turn counts, lengths, tool outputs and tool latencies are each a
    stratified draw (the same multiset every seed); trajectories' total work
    differs (no equalising deal)."""
    shape = _shape(spec)
    ds = Dataset(f"{spec.name}:{seed}", shape, spec.tasks)
    ids, epoch = ds.step(0)
    g = spec.agent_samples
    diff = [ds.difficulty(ids[i // g], epoch) for i in range(len(ids) * g)]
    counts = _assign(spec, [correlated(rng, d, shape.length_corr) for d in diff],
                            lambda q: turns_quantile(q, spec.turns[0], spec.turns[1]))
    rlat = [correlated(rng, d, shape.length_corr) for d, c in zip(diff, counts) for _ in range(c)]
    resp = _assign(spec, rlat, lambda q: lognormal_quantile(q, spec.response_median, spec.response_sigma, 1,
                                                             spec.response_max, shape.truncate))
    n_turns = len(rlat)
    tools = draws.ints(n_turns, spec.tool_words)
    if spec.tool_pareto is not None:
        lo, hi, alpha = spec.tool_pareto
        lats = (draws._quantiles(n_turns, lambda q: pareto_quantile(q, lo, hi, alpha)) if spec.stratified
                else [pareto_quantile(rng.random(), lo, hi, alpha) for _ in range(n_turns)])
    else:
        lats = draws.uniforms(n_turns, spec.tool_latency_s)
    groups = []
    j = 0
    for t, _k in enumerate(ids):
        system = " ".join(_words(rng, spec.system_words, "s"))
        task = " ".join(_words(rng, 64, "q"))
        group = []
        for k in range(g):
            c = counts[t * g + k]
            turns = [Turn(resp[j + i], tools[j + i], lats[j + i]) for i in range(c)]
            j += c
            group.append(Job(f"a{t}-{k}", system + " " + task, turns, seed=rng.getrandbits(31)))
        groups.append(group)
    return Step(spec.name, _order(spec, rng, groups))


def _arrivals(spec: WorkloadSpec, rng: random.Random, steps: List[Step]) -> List[Step]:
    if spec.mode == "open":
        if spec.rate < 0:
            raise ValueError(f"{spec.name}: open loop needs rate >= 0 (0: every job at once)")
        if spec.rate == 0:
            return steps  # every job of a step submitted at once, as verl's agent loop does
        for st in steps:
            t = 0.0
            for j in st.jobs:
                j.arrival_s = t
                t += rng.expovariate(spec.rate)
    return steps


def mooncake_jobs(spec: WorkloadSpec, seed: int = 0) -> List[Job]:
    """A conversation slice of the Mooncake trace: every request (within the
    ``trace_scan`` lines from line ``seed * trace_seed_stride``) of the first
    ``trace_conversations`` conversations starting there, a conversation being keyed by its first block after the
    shared block 0. The trace's first lines barely reuse anything (their
    follow-up turns come minutes later), so a time window would test nothing;
    following conversations keeps the trace's real reuse. Arrival times keep
    the trace's order and gaps, compressed to ``trace_span_s`` simulated
    seconds. Each 512-token block hash id becomes 512 words derived from the id
    alone, so requests sharing hash ids share text and tokens."""
    convs: Dict[int, int] = {}
    picked: List[dict] = []
    with open(spec.trace, encoding="utf-8") as f:
        start = (seed * spec.trace_seed_stride) % spec.trace_seed_wrap
        for line in itertools.islice(f, start, start + spec.trace_scan):
            d = json.loads(line)
            h = d["hash_ids"]
            if len(h) < 2:
                continue
            if h[1] not in convs:
                if len(convs) >= spec.trace_conversations:
                    continue
                convs[h[1]] = len(convs)
            picked.append(d)
    if not picked:
        raise ValueError(f"{spec.trace}: no conversations found")
    t0 = float(picked[0]["timestamp"])
    span = max(1.0, float(picked[-1]["timestamp"]) - t0)
    jobs = []
    for i, d in enumerate(picked):
        n_in = int(d["input_length"])
        words: List[str] = []
        for hid in d["hash_ids"]:
            words.extend(f"m{hid}w{j}" for j in range(512))
        if len(words) >= n_in:
            words = words[:n_in]
        else:
            words += [f"m{i}tail{j}" for j in range(n_in - len(words))]
        out = max(1, min(spec.trace_output_max, int(d["output_length"])))
        arrival = (float(d["timestamp"]) - t0) / span * spec.trace_span_s
        jobs.append(Job(f"mc{i}", " ".join(words), [Turn(out, 0)], arrival_s=arrival, seed=i))
    return jobs


# ---------------------------------------------------------------------------
# HTTP client


def stream_text_completion(base_url: str, prompt: Union[str, Sequence[int]], max_tokens: int, seed: int,
                           timeout: float = 600.0,
                           headers: Optional[Dict[str, str]] = None,
                           on_first_token: Optional[Callable[[], None]] = None, stream: bool = True,
                           model: str = MODEL, on_sent: Optional[Callable[[], None]] = None,
                           extra_body: Optional[Dict[str, Any]] = None) -> dict:
    """Completion of a text prompt, streamed (TTFT = first chunk with a
    choice) or not (TTFT = e2e; the engines' clock still has the real TTFT);
    returns TTFT, e2e, the generated text and usage (wall seconds).
    ``on_first_token`` runs once when the first token is back (streamed) or
    with the response (non-streamed). ``prompt`` may also be token ids
    (vLLM accepts either); ``model`` is the served model's name;
    ``extra_body`` adds fields to the request (the Dynamo proxy's
    ``prompt_token_ids``, which it removes before forwarding)."""
    body: Dict[str, Any] = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "min_tokens": max_tokens, "ignore_eos": True,
        "seed": seed, "stream": stream, **(extra_body or {}),
    }
    t0 = time.perf_counter()
    ttft: Optional[float] = None
    parts: List[str] = []
    usage: dict = {}
    resp_id = ""
    if not stream:
        status, raw = http_request(base_url + "/v1/completions", "POST", body, timeout=timeout, headers=headers,
                                   on_sent=on_sent)
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {raw[:200]!r}")
        msg = json.loads(raw)
        e2e = time.perf_counter() - t0
        if on_first_token is not None:
            on_first_token()
        usage = msg.get("usage") or {}
        text = "".join(ch.get("text") or "" for ch in msg.get("choices") or ())
        return {"ttft": e2e, "e2e": e2e, "text": text, "cached": cached_tokens(usage),
                "prompt_tokens": usage.get("prompt_tokens", 0),
                "completion_tokens": usage.get("completion_tokens", 0), "id": msg.get("id") or ""}
    body["stream_options"] = {"include_usage": True}
    for t, msg in stream_events(base_url, body, timeout, headers=headers, on_sent=on_sent):
        resp_id = resp_id or msg.get("id") or ""
        for ch in msg.get("choices") or ():
            if ttft is None:
                ttft = t
                if on_first_token is not None:
                    on_first_token()
            parts.append(ch.get("text") or "")
        if msg.get("usage"):
            usage = msg["usage"]
    e2e = time.perf_counter() - t0
    return {"ttft": ttft if ttft is not None else e2e, "e2e": e2e, "text": "".join(parts),
            "cached": cached_tokens(usage), "prompt_tokens": usage.get("prompt_tokens", 0),
            "completion_tokens": usage.get("completion_tokens", 0), "id": resp_id}


def tokenize(url: str, text: str) -> List[int]:
    """The servers' /tokenize: vllm-sim's one tokenizer."""
    status, body = http_request(url + "/tokenize", "POST", {"model": MODEL, "prompt": text}, timeout=60.0)
    if status != 200:
        raise RuntimeError(f"POST {url}/tokenize: HTTP {status} {body[:200]!r}")
    return list(json.loads(body)["tokens"])


# ---------------------------------------------------------------------------
# Routes: how a client reaches a server under each policy


class Route(abc.ABC):
    """acquire() -> (base URL, server id or "", ticket); first_token(ticket);
    release(ticket)."""

    needs_ids = False
    overhead_ms: float = float("nan")
    # True when acquire() may wait in the router (admission): the step's next
    # request is then submitted once this one is, not once it was sent.
    holds_in_router = False

    @abc.abstractmethod
    def acquire(self, rid: str, prompt_ids: Optional[List[int]]) -> Tuple[str, str, Any]:
        """The server for request ``rid`` (every route chooses its own way)."""

    def first_token(self, ticket: Any) -> None:  # noqa: B027 (an optional hook: nothing by default)
        pass

    def release(self, ticket: Any, rid: Optional[str] = None,  # noqa: B027 (an optional hook: nothing by default)
                output_tokens: Optional[int] = None) -> None:
        """The request behind ``ticket`` finished; ``rid`` and its output token count are what
        kvc_router's verl hook sends with the release (``output_tokens`` None when it failed)."""

    def finish(self, rid: str) -> None:  # noqa: B027 (an optional hook: nothing by default)
        """The trajectory ``rid`` has ended (its last turn, or a failure)."""

    def reset(self) -> None:  # noqa: B027 (an optional hook: nothing by default)
        pass

    def close(self) -> None:  # noqa: B027 (an optional hook: nothing by default)
        pass


class RoundRobin(Route):
    def __init__(self, servers: List[Server]) -> None:
        self._it = itertools.cycle(servers)
        self._lock = threading.Lock()

    def acquire(self, rid, prompt_ids):
        with self._lock:
            s = next(self._it)
        return s.url, s.sid, None


# The router's ``turns`` as verl's hook sets it for a workload of this kind
# (kvc_router.verl.actor.rollout_turns): agent loops run with
# rollout.multi_turn.enable, GRPO without it; a chat trace is no verl
# rollout (the library's auto).
VERL_TURNS = {"agent": "multi", "grpo": "single"}


def user_router_config(servers: List[Server], max_num_seqs: int, knobs: Dict[str, Any],
                       turns: Optional[str] = None, response_tokens: int = 0,
                       router: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """What ``router.type: kvc_aware`` gives a verl user, plus only what the
    servers cannot tell it: the KV-event endpoints (vLLM's
    ``--kv-events-config``, which the user sets on the servers too) and
    ``load.max_num_seqs`` (vLLM's ``--max-num-seqs``: /metrics has no
    scheduler config, docs/arena.md "kvc_aware as a user gets it"), and
    ``turns`` and ``response_tokens`` (the longest response), which verl's
    hook sets from the rollout config. KV capacity
    comes from the servers' ``vllm:cache_config_info``; the poll interval is
    the library's. ``knobs`` is the frozen strategy configuration
    (docs/frozen-kvc-aware.json) plus any --kvc-knob; ``router`` the router
    settings outside the strategy that the freeze records (frozen_router)."""
    cfg = router_config("kvc_aware", servers, max_num_seqs=max_num_seqs)
    assert cfg is not None
    del cfg["config"]["collector"]["interval_ms"]  # the library's default
    del cfg["config"]["collector"]["timeout_ms"]
    cfg["config"]["strategies"][0].update(knobs)
    if turns:
        cfg["config"]["turns"] = turns
    if response_tokens > 0:
        cfg["config"]["response_tokens"] = response_tokens
    cfg["config"].update(router or {})
    return cfg


class VerlDefaultRoute(Route):
    """verl 0.9.1's default balancer in-process (kvc_harness.verl_default),
    ties drawn from a generator seeded with the run's seed."""

    def __init__(self, servers: List[Server], seed: int) -> None:
        from kvc_harness.verl_default import VerlDefault

        self.urls = {s.sid: s.url for s in servers}
        self.lb = VerlDefault([s.sid for s in servers], seed=seed)
        self._lock = threading.Lock()
        self.acquire_s: List[float] = []

    def acquire(self, rid, prompt_ids):
        t0 = time.perf_counter()
        with self._lock:  # verl's actor serialises its calls
            sid, _ = self.lb.acquire_server(rid)
        self.acquire_s.append(time.perf_counter() - t0)
        return self.urls[sid], sid, sid

    def release(self, ticket, rid=None, output_tokens=None):
        with self._lock:  # verl's own balancer takes the server id alone
            self.lb.release_server(ticket)


class Balancer(Route):
    """KVCAwareBalancer used in-process: acquire, send, release (verl's order)."""

    def __init__(self, servers: List[Server], mode: str, max_num_seqs: int,
                 knobs: Optional[Dict[str, Any]] = None, turns: Optional[str] = None,
                 response_tokens: int = 0, router: Optional[Dict[str, Any]] = None) -> None:
        from kvc_router import KVCAwareBalancer

        cfg = None
        if mode == "kvc_aware":
            cfg = user_router_config(servers, max_num_seqs, dict(knobs or {}), turns, response_tokens, router)
        self.config = cfg
        self.needs_ids = mode == "kvc_aware"
        self.urls = {s.sid: s.url for s in servers}
        self.lb = KVCAwareBalancer(servers={s.sid: None for s in servers}, max_cache_size=100000, router_config=cfg)
        self.acquire_s: List[float] = []
        if mode == "kvc_aware":
            self._wait_collectors()

    def _wait_collectors(self, timeout: float = 15.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            st = self.lb.get_status()["router"]
            if all(s["load"]["has_metrics"] for s in st["servers"]):
                return
            time.sleep(0.05)
        raise RuntimeError("kvc_aware collectors did not report metrics for every server")

    def acquire(self, rid, prompt_ids):
        t0 = time.perf_counter()
        sid, _ = self.lb.acquire_server(request_id=rid, prompt_ids=prompt_ids)
        self.acquire_s.append(time.perf_counter() - t0)
        return self.urls[sid], sid, sid

    def release(self, ticket, rid=None, output_tokens=None):
        # As verl's hook releases: with the request's id and output count, from
        # which the router learns lengths (group_spread_min_corr and
        # task_spread_min_corr read them).
        self.lb.release_server(server_id=ticket, request_id=rid, output_tokens=output_tokens)

    def reset(self) -> None:
        self.lb.reset_prefix_index()

    def status(self) -> dict:
        return self.lb.get_status()

    def close(self) -> None:
        self.lb.close()


class AdmitBalancer(Balancer):
    """kvc_aware with its router-side admission on (``admission: {enabled:
    true}``, the shipped admission defaults: a server's cap is its
    max_num_seqs), as kvc_router's verl integration runs it: the async
    KVCAwareAdmissionBalancer, here on an event loop of its own. A request
    is submitted to the router in the step's order (``route_batch``, which
    never waits); a held one then waits in the router until a release admits
    it (``await_admission``), as verl's async client awaits a held acquire.
    Held requests wait before reaching an engine, so like Dynamo's router
    queue its rows run without the burst hold only (ROUTER_QUEUES)."""

    holds_in_router = True

    def __init__(self, servers: List[Server], max_num_seqs: int, knobs: Optional[Dict[str, Any]] = None,
                 turns: Optional[str] = None, response_tokens: int = 0, lengths: bool = False,
                 router: Optional[Dict[str, Any]] = None) -> None:
        from kvc_router import KVCAwareAdmissionBalancer

        cfg = user_router_config(servers, max_num_seqs, dict(knobs or {}), turns, response_tokens, router)
        cfg["config"]["admission"] = {"enabled": True}
        if lengths:
            # The releases carry request ids and output counts (release()),
            # as the verl hook sends them: admission then ranks every held
            # request by its prompt's learnt length.
            cfg["config"]["lengths"] = {"enabled": True}
        self.config = cfg
        self.needs_ids = True
        self.urls = {s.sid: s.url for s in servers}
        self.acquire_s: List[float] = []  # the submit alone (the decision); the hold is in each record's acquire_s
        self.held = 0  # requests the router held before admitting them
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kvc-admission-loop", daemon=True)
        self._thread.start()

        async def make() -> Any:
            return KVCAwareAdmissionBalancer(servers={s.sid: None for s in servers}, max_cache_size=100000,
                                             router_config=cfg)

        self.lb = self._call(make())
        self._wait_collectors()

    def _call(self, coro: Any, timeout: float = 600.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def acquire(self, rid, prompt_ids, on_submitted: Optional[Callable[[], None]] = None):
        from kvc_router.admission import Held

        t0 = time.perf_counter()
        res = self._call(self.lb.route_batch([], [(rid, prompt_ids)]))[0]
        t1 = time.perf_counter()
        self.acquire_s.append(t1 - t0)
        if on_submitted is not None:
            on_submitted()  # the next request of the step may be submitted now
        self.held += isinstance(res, Held)
        while isinstance(res, Held):
            got = self._call(self.lb.await_admission([res.ticket]))
            if got:
                res = got[0][1]
        if isinstance(res, BaseException):
            raise res
        sid, _ = res
        return self.urls[sid], sid, sid

    def release(self, ticket, rid=None, output_tokens=None):
        self._call(self.lb.release_server(server_id=ticket, request_id=rid, output_tokens=output_tokens))

    def close(self) -> None:
        try:
            self.lb.close()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)


class DynamoRoute(Route):
    """NVIDIA Dynamo's KvRouter (ai-dynamo-runtime) in the request path, as
    Dynamo's frontend is: a process of its own (testbed/kvc_harness/dynamo_route.py,
    under .venv-peers' Python) serving an HTTP proxy. The client sends each
    completion to it with the prompt's token ids (verl's client holds them);
    it asks ``best_worker`` (with a request id, so the router tracks the
    request), forwards the request to that server, calls
    ``mark_prefill_complete`` when the first streamed token comes back and
    ``free`` when the response ends. Fed by the fleet's KV events through
    Dynamo's own ZMQ relay; Dynamo's defaults. The proxy always streams from
    the engine so that the first token is the real one (a non-streamed
    request would keep counting its prompt as pending prefill until it
    finished), and answers a non-streamed client with one completion, so the
    client does per request what it does behind any other router.

    Earlier arena runs called the router from the client (acquire, first
    token, release over a Unix socket): each call waited for the client's GIL
    behind its streaming threads (18 ms a decision on agent_task), and with a
    step sent in order those waits added up before the engines had the step."""

    needs_ids = True
    sends_ids = True

    def __init__(self, servers: List[Server], block_size: int, num_gpu_blocks: int, max_num_seqs: int,
                 max_num_batched_tokens: int, router_config: Optional[Dict[str, float]] = None) -> None:
        from kvc_harness.dynamo_route import DynamoRouterProcess

        self.router = DynamoRouterProcess(peers_python(), [(s.sid, s.events[0], s.topic) for s in servers], block_size,
                                     num_gpu_blocks, max_num_seqs, max_num_batched_tokens, MODEL,
                                     router_config=router_config, proxy_urls={s.sid: s.url for s in servers})
        self.url = self.router.proxy_url
        self.stats: Dict[str, Any] = {}

    def acquire(self, rid, prompt_ids):
        return self.url, "", None

    def read_stats(self) -> Dict[str, Any]:
        """The proxy's counters (requests, errors, first-token marks, overlap
        blocks, decision time); kept after close."""
        self.stats = self.router.proxy_stats()
        return self.stats

    @property
    def overlap_blocks(self) -> int:
        return int(self.stats.get("overlap_blocks", 0))

    @property
    def first_token_marks(self) -> int:
        return int(self.stats.get("first_token_marks", 0))

    def close(self) -> None:
        self.router.close()


def peers_python() -> str:
    return os.environ.get("KVR_PEERS_PYTHON") or os.path.join(REPO, ".venv-peers", "bin", "python")


def peers_available() -> Optional[str]:
    """None when .venv-peers has both routers, else the reason it cannot be used."""
    py = peers_python()
    if not os.path.isfile(py):
        return f"{py} is missing (run testbed/scripts/peers_venv.sh)"
    if not os.path.isfile(os.path.join(os.path.dirname(py), "vllm-router")):
        return "vllm-router console script missing in .venv-peers"
    if not os.path.isfile(os.path.join(os.path.dirname(py), "smg")):
        return "smg (Shepherd Model Gateway) missing in .venv-peers (rerun testbed/scripts/peers_venv.sh)"
    return None


def _free_port() -> int:
    s = socket.socket()
    s.bind((HOST, 0))
    p = s.getsockname()[1]
    s.close()
    return p


class PeerRouter(Route):
    """A real router process in front of the fleet; acquire returns its URL."""

    def __init__(self, policy: str, servers: List[Server], cleanup: Cleanup, log_path: str,
                 block_size: int, timeout: float = 60.0, extra_flags: Sequence[str] = ()) -> None:
        kind, pol, flags = PEERS[policy]
        self.finishes_sessions = pol == "sticky_least_loaded"
        self.finished = 0
        self.port = _free_port()
        # Both routers export Prometheus on 29000 by default: two routers on one
        # machine (or a leftover) would collide, so each gets its own port.
        self.prom_port = _free_port()
        self.url = f"http://{HOST}:{self.port}"
        workers = [s.url for s in servers]
        py = peers_python()
        if kind in ("sglang", "smg"):
            mod = "sglang_router.launch_router" if kind == "sglang" else "smg.launch_router"
            cmd = [py, "-m", mod, "--worker-urls", *workers, "--policy", pol,
                   "--host", HOST, "--port", str(self.port), "--log-level", "warn",
                   "--prometheus-host", HOST, "--prometheus-port", str(self.prom_port)]
        else:
            cmd = [os.path.join(os.path.dirname(py), "vllm-router"), "--worker-urls", *workers, "--policy", pol,
                   "--host", HOST, "--port", str(self.port), "--log-level", "warning",
                   "--prometheus-host", HOST, "--prometheus-port", str(self.prom_port)]
            if pol == "kv_aware":
                for s in servers:
                    cmd += ["--kv-event-source", f"{s.url}={','.join(s.events)}"]
                    if s.replay:
                        cmd += ["--kv-event-replay-source", f"{s.url}={','.join(s.replay)}"]
                cmd += ["--kv-event-model", MODEL, "--kv-event-block-size", str(block_size)]
        cmd += list(flags) + list(extra_flags)
        self.cmd = cmd
        log = open(log_path, "ab")
        try:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=die_with_parent)
        finally:
            log.close()
        cleanup.add_process(self.proc)
        self.cleanup = cleanup
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{policy}: router exited with {self.proc.returncode}; see {log_path}")
            try:
                if http_request(self.url + "/health", timeout=1.0)[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"{policy}: router not healthy after {timeout:.0f}s; see {log_path}")
            time.sleep(0.1)

    def acquire(self, rid, prompt_ids):
        return self.url, "", None

    def finish(self, rid: str) -> None:
        """vllm-router's sticky_least_loaded: POST /finish_session, as SkyRL's
        client does when a trajectory ends."""
        if not self.finishes_sessions:
            return
        status, body = http_request(f"{self.url}/finish_session?session_id={rid}", "POST", timeout=10.0)
        if status != 200:
            raise RuntimeError(f"POST /finish_session: HTTP {status}: {body[:200]!r}")
        self.finished += 1

    def decision_metrics(self) -> Dict[str, float]:
        """The router's own Prometheus counters about its routing decisions
        (why it chose what it chose), e.g. vllm-router's cache_aware
        decision kinds and per-worker picks."""
        try:
            status, body = http_request(f"http://{HOST}:{self.prom_port}/metrics", timeout=10.0)
        except OSError:
            return {}
        out: Dict[str, float] = {}
        if status != 200:
            return out
        for line in body.decode("utf-8", "replace").splitlines():
            if line.startswith("#") or not any(k in line for k in ("decision", "processed", "load_balancing",
                                                                   "overload", "session")):
                continue
            name, _, val = line.rpartition(" ")
            try:
                out[name] = float(val)
            except ValueError:
                pass
        return out

    def close(self) -> None:
        self.cleanup.stop_process(self.proc)


# ---------------------------------------------------------------------------
# One run


@dataclass
class ArenaConfig:
    servers: int = 4
    speed: float = 20.0  # simulated seconds per wall second
    num_gpu_blocks: int = 16384
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    out_dir: str = os.path.join(REPO, "build", "arena")
    # kvc_aware's strategy configuration: the frozen one (docs/frozen-kvc-aware.json)
    # with any --kvc-knob applied on top (tuning seeds only).
    kvc_knobs: Dict[str, Any] = field(default_factory=dict)
    # Where kvc_knobs' frozen part came from, and its commit (recorded in the outputs).
    kvc_frozen: str = ""
    kvc_frozen_commit: str = ""
    # Streamed requests measure client TTFT; non-streamed ones cut the
    # client's per-chunk work (the engines' clock has TTFT either way).
    stream: bool = True
    # vllm-sim's clock: "paced" (a busy engine advances by step durations only,
    # so this shared machine's stalls add no simulated time) or "wall".
    clock: str = "paced"
    # Workloads that also get the prefill-free bound: verl_default on a fleet
    # whose prefill costs nothing (vllm-sim --prefill-per-token -1).
    bound_workloads: Tuple[str, ...] = ("long_agent",)
    # Run this policy a second time on every seed (after the seed's other
    # runs), recorded as "<policy>#repeat": the noise floor. "" = none.
    repeat_policy: str = ""
    # Also run every policy without the burst hold on the same seeds, as
    # "<policy>+nohold" (issue 27): the hold blinds routers fed by KV events
    # while routers that record their own decisions keep them, so both
    # arrival models are reported for every router.
    both_holds: bool = False
    # With both_holds: run only the "+nohold" rows (to add them to a run that
    # has the held ones; arena_merge takes them because each row names its
    # hold).
    nohold_only: bool = False
    # Jobs submitted together reach the routers in the workload's order (Runner.ordered).
    ordered: bool = True
    # The engines are held (clocks frozen, no steps) until a burst of jobs
    # submitted together has arrived (Runner._hold_fleet).
    hold: bool = True
    # Parameters of policy variants "NAME@TAG": variant -> workload -> knobs
    # (TUNE_GRID's keys); see peer_flags.
    peer_params: Dict[str, Dict[str, Dict[str, Any]]] = field(default_factory=dict)
    overhead_probes: int = 8  # idle 4-token requests per peer, via the router and direct
    # Simulated seconds every later turn of a trajectory waits on top of its
    # tool's latency (--turn-gap; an experiment, 0 in every published run): how
    # an agent workload's engine-clock step responds to a client that is
    # slower between turns, as a slow proxy makes it.
    turn_gap_s: float = 0.0


FROZEN_DEFAULT = os.path.join(REPO, "docs", "frozen-kvc-aware.json")


def load_frozen(path: str) -> Tuple[Dict[str, Any], str]:
    """kvc_aware's frozen strategy configuration and its commit (with its
    status when it is not "frozen"), from testbed/scripts/freeze_kvc_aware.py's file,
    which names every strategy parameter."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    strategy, commit = doc.get("strategy"), doc.get("commit")
    if not isinstance(strategy, dict) or not commit:
        raise ValueError(f"{path}: needs \"commit\" and a \"strategy\" object")
    import kvc_router

    # A parameter left out would take today's default, so a rerun of an old
    # freeze would silently run a later behaviour (kvbench refuses it too).
    params = kvc_router.library_defaults("kvc_aware")["router"]["strategies"][0]["params"]
    missing = sorted(set(params) - set(strategy))
    if missing:
        raise ValueError(f"{path}: \"strategy\" does not name {', '.join(missing)}: a freeze names every kvc_aware "
                         "parameter (set each added after it to its value at that commit, its off value)")
    status = doc.get("status") or "frozen"
    return dict(strategy), commit if status == "frozen" else f"{commit} ({status})"


def frozen_router(path: str) -> Dict[str, Any]:
    """The router settings outside the strategy that a freeze records and its kvc_aware rows apply:
    ``session_move_tokens`` (0 in freezes from before it, which moved sessions by bound counts alone), so a
    rerun of an old freeze runs that freeze's behaviour (kvbench reads the same key)."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    router = (doc.get("library_defaults") or {}).get("router") or {}
    return {"session_move_tokens": router.get("session_move_tokens", 0)}


def _pct(xs: Sequence[float], q: float) -> float:
    """q in 0..1; the harness's one percentile definition."""
    return percentile(xs, q * 100.0)


CONNECT_RETRIES = 3
# A job submitted more than this many simulated seconds after its scheduled
# arrival marks the run as one whose pacing fell behind (reported, not hidden).
PACING_SLACK_S = 1.0
GATE_WAIT_S = 5.0  # wall seconds a first request waits for the previous one to be written
HOLD_TIMEOUT_S = 120.0  # wall seconds a burst may take to reach the held engines


class Runner:
    """Replays the steps of one workload through one route."""

    def __init__(self, route: Route, servers: List[Server], speed: float, stream: bool = True,
                 ordered: bool = True, hold: bool = True, turn_gap_s: float = 0.0) -> None:
        self.route = route
        self.turn_gap_s = turn_gap_s
        self.servers = servers
        self.speed = speed
        self.stream = stream
        self.records: List[dict] = []
        self._lock = threading.Lock()
        self._tok = itertools.cycle([s.url for s in servers])
        self._first_ids: Dict[str, List[int]] = {}
        self.ordered = ordered
        self.hold = hold
        self.holds: List[float] = []  # wall seconds each burst was held
        self.hold_timeouts = 0  # bursts the engines never held whole (the hold's deadline freed them)
        # Simulated seconds the latest job was submitted after its scheduled
        # arrival (the client's pacing fell behind the workload's schedule).
        self.late_s = 0.0
        self._records_at_hold = 0

    def _ids(self, text: str) -> List[int]:
        with self._lock:
            url = next(self._tok)
        return tokenize(url, text)

    def _request(self, rid: str, text: str, ids: Optional[List[int]], turn: Turn, seed: int, tag: str,
                 gate: Optional[Tuple[Optional[threading.Event], threading.Event]] = None) -> dict:
        rec: Dict[str, Any] = {"rid": rid, "step": tag, "error": None, "server": "", "acquire_s": 0.0}
        prev, mine = gate if gate is not None else (None, None)
        try:
            if prev is not None:
                prev.wait(GATE_WAIT_S)
            t0 = time.perf_counter()
            if self.route.holds_in_router:
                # Admission: the next request is submitted once this one is
                # (held or routed), not once it was sent to an engine.
                url, sid, ticket = self.route.acquire(rid, ids, on_submitted=mine.set if mine is not None else None)
            else:
                url, sid, ticket = self.route.acquire(rid, ids)
            t_sent = time.perf_counter()
            rec["acquire_s"] = t_sent - t0
            # Wall instants (this process's perf_counter) of the acquire and
            # the send: engine_clock_holds maps them onto the engines' clocks.
            rec["t_acquire"], rec["t_sent"] = t0, t_sent
            extra = {"prompt_token_ids": ids} if ids is not None and getattr(self.route, "sends_ids", False) else None
            rec["server"] = sid
            # The trajectory id as the peers' session keys (vllm-router:
            # x-session-id; sglang-router: x-smg-routing-key).
            headers = {"x-session-id": rid, "x-smg-routing-key": rid}
            try:
                for attempt in range(CONNECT_RETRIES + 1):
                    try:
                        rec.update(stream_text_completion(url, text, turn.max_tokens, seed, headers=headers,
                                                          on_first_token=lambda: self.route.first_token(ticket),
                                                          stream=self.stream,
                                                          on_sent=mine.set if mine is not None else None,
                                                          extra_body=extra))
                        break
                    except (ConnectionResetError, ConnectionRefusedError, BrokenPipeError):
                        # A whole step's requests connect at once; a router whose
                        # accept queue overflows drops the connection (with SYN
                        # cookies the client sees a reset, before any response
                        # byte). A real client's connection pool would reconnect;
                        # every retry is counted, and engine requests the client
                        # never got an answer for are counted too (duplicates).
                        if attempt == CONNECT_RETRIES:
                            raise
                        rec["retries"] = rec.get("retries", 0) + 1
                        time.sleep(0.05 * (attempt + 1))
            finally:
                self.route.release(ticket, rid, rec.get("completion_tokens") or None)
        except Exception as e:  # noqa: BLE001 - every failure is counted, never dropped
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
        finally:
            if mine is not None:
                mine.set()  # a failed request never holds the next one back
        with self._lock:
            self.records.append(rec)
        return rec

    def _hold_fleet(self) -> None:
        """Stops every engine's steps and clock (vllm-sim POST /sim/hold) while
        a step's burst is being sent: sending 1,024 requests takes this client
        a second or more of wall time (20+ simulated seconds at --speed 20),
        which a real client needs milliseconds for. Engines were seen to start
        the first arrivals' work at a rate set by the host's scheduling, a
        run-to-run noise in which requests started first."""
        with self._lock:
            self._records_at_hold = len(self.records)
        for s in self.servers:
            status, body = http_request(s.url + f"/sim/hold?timeout_s={HOLD_TIMEOUT_S:g}", "POST", timeout=10.0)
            if status != 200:
                raise RuntimeError(f"{s.url}/sim/hold: HTTP {status}: {body[:200]!r}")

    def _release_fleet(self, expect: int) -> None:
        """Waits until the engines hold every request of the burst (or the
        wait times out: the hold then ends anyway), then releases them.
        Nothing finishes while the fleet is held, so every record written
        meanwhile is a request that failed before reaching an engine: it is
        not waited for."""
        deadline = time.time() + HOLD_TIMEOUT_S - 5.0
        while time.time() < deadline:
            queued = 0
            for s in self.servers:
                status, body = http_request(s.url + "/sim/hold", timeout=10.0)
                if status == 200:
                    queued += int(json.loads(body).get("requests", 0))
            with self._lock:
                failed = len(self.records) - self._records_at_hold
            if queued >= expect - failed:
                break
            time.sleep(0.02)
        else:
            # The engines never held the whole burst (a router kept some):
            # the step then starts when the hold's deadline frees them.
            self.hold_timeouts += 1
        held = 0.0
        for s in self.servers:
            status, body = http_request(s.url + "/sim/release", "POST", timeout=10.0)
            if status == 200:
                held = max(held, float(json.loads(body).get("held_wall_s", 0.0)))
        self.holds.append(held)

    def _job(self, job: Job, tag: str,
             gate: Optional[Tuple[Optional[threading.Event], threading.Event]] = None) -> None:
        text = job.text
        ids = None
        if self.route.needs_ids:
            ids = self._first_ids.get(text) or self._ids(text)
        rng = random.Random(job.rid)
        try:
            self._turns(job, tag, text, ids, rng, gate)
        finally:
            try:
                self.route.finish(job.rid)
            except Exception as e:  # noqa: BLE001 - counted as an error of the trajectory
                with self._lock:
                    self.records.append({"rid": job.rid, "step": tag, "error": f"finish: {e}"[:300], "server": "",
                                         "acquire_s": 0.0})

    def _turns(self, job: Job, tag: str, text: str, ids: Optional[List[int]], rng: random.Random,
               gate: Optional[Tuple[Optional[threading.Event], threading.Event]]) -> None:
        for i, turn in enumerate(job.turns):
            r = self._request(job.rid, text, ids, turn, job.seed + i, tag, gate if i == 0 else None)
            if r["error"]:
                return
            if i == len(job.turns) - 1:
                return
            gap = turn.tool_latency_s + self.turn_gap_s
            if gap > 0:
                time.sleep(gap / self.speed)  # the tool call runs outside the fleet
            # Next prompt: context + this response + a seeded tool output.
            tool = " ".join(_words(rng, turn.tool_words, "o"))
            suffix = (r.get("text") or "").strip() + " " + tool
            text = text + " " + suffix
            if ids is not None:
                ids = ids + self._ids(suffix)

    def run_step(self, step: Step, mode: str, concurrency: int) -> float:
        """Runs one step; returns its makespan in simulated seconds."""
        if self.route.needs_ids:
            # First prompts are tokenised before the step starts: verl's
            # client holds token ids already, and 256 threads racing through
            # /tokenize at the step's start scrambled the order in which
            # requests reached the engines (run-to-run noise the peers'
            # clients, which send text, did not have).
            texts = sorted({j.text for j in step.jobs})
            with ThreadPoolExecutor(max_workers=4) as pool:
                self._first_ids = dict(zip(texts, pool.map(self._ids, texts)))
        burst = [j for j in step.jobs if j.arrival_s == 0.0] if mode != "closed" else []
        held = self.hold and len(burst) > 1
        if held:
            self._hold_fleet()
        t0 = time.perf_counter()
        if mode == "closed":
            with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
                list(pool.map(lambda j: self._job(j, step.name), step.jobs))
        else:
            threads = []
            prev: Optional[threading.Event] = None
            for job in sorted(step.jobs, key=lambda j: j.arrival_s):
                delay = t0 + job.arrival_s / self.speed - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                elif job.arrival_s > 0.0:
                    self.late_s = max(self.late_s, -delay * self.speed)
                # Jobs submitted together (rate 0) reach the router and the
                # engines in the workload's order: each first request is
                # routed and written only after the previous one was written.
                # Without this, 1,024 threads racing to connect reordered the
                # step's requests differently on every run, and with them
                # which long responses started late (issue 19's noise floor).
                gate = None
                if self.ordered and job.arrival_s == 0.0:
                    mine = threading.Event()
                    gate, prev = (prev, mine), mine
                th = threading.Thread(target=self._job, args=(job, step.name, gate), daemon=True)
                th.start()
                threads.append(th)
                if held and len(threads) == len(burst):
                    self._release_fleet(len(burst))
            for th in threads:
                th.join(timeout=1800)
        return (time.perf_counter() - t0) * self.speed


def _probe_overhead(route: Route, servers: List[Server], n: int) -> float:
    """Router overhead in wall ms: a peer's proxy hop (idle fleet, tiny
    prompts: median via the router minus median direct), or our acquire."""
    if isinstance(route, (Balancer, VerlDefaultRoute)):
        return _pct(route.acquire_s, 0.5) * 1000.0
    if not isinstance(route, (PeerRouter, DynamoRoute)) or n <= 0:
        return 0.0
    via, direct = [], []
    for i in range(n):
        text = f"probe{i} alpha beta gamma"
        # The Dynamo proxy gets the token ids, as in the run.
        extra = {"prompt_token_ids": tokenize(servers[0].url, text)} if isinstance(route, DynamoRoute) else None
        direct.append(stream_text_completion(servers[i % len(servers)].url, text, 1, i)["e2e"])
        via.append(stream_text_completion(route.url, text, 1, i, extra_body=extra)["e2e"])
    return (_pct(via, 0.5) - _pct(direct, 0.5)) * 1000.0


def sim_binary() -> str:
    path = os.environ.get("KVR_VLLM_SIM") or os.path.join(REPO, "bin", "vllm-sim")
    if not os.path.isfile(path):
        subprocess.run(["go", "build", "-o", path, "./cmd/vllm-sim"], cwd=REPO, check=True, timeout=600)
    return path


def base_policy(policy: str) -> str:
    """"sglang_router_cache_aware@tuned" -> "sglang_router_cache_aware"."""
    return policy.partition("@")[0]


def variant_params(policy: str, workload: str, cfg: ArenaConfig) -> Dict[str, Any]:
    """The knobs of a variant on a workload; {} for a plain policy. A variant
    without parameters for the workload is an error, never a silent default."""
    if "@" not in policy:
        return {}
    try:
        params = cfg.peer_params[policy][workload]
    except KeyError:
        raise ValueError(f"{policy}: no parameters for workload {workload!r} in ArenaConfig.peer_params") from None
    grid_keys = {k for pt in TUNE_GRID.get(base_policy(policy), []) for k in pt}
    bad = set(params) - grid_keys
    if bad:
        raise ValueError(f"{policy}: unknown knobs {sorted(bad)}; tunable: {sorted(grid_keys)}")
    return dict(params)


def peer_flags(params: Dict[str, float]) -> List[str]:
    """Launcher flags of sglang-router / vllm-router for TUNE_GRID knobs."""
    out: List[str] = []
    for k, v in sorted(params.items()):
        out += ["--" + k.replace("_", "-"), f"{v:g}"]
    return out


def run_one(spec: WorkloadSpec, policy: str, seed: int, cfg: ArenaConfig, log: Callable[[str], None] = print,
            sim_extra: Sequence[str] = ()) -> dict:
    """One cold fleet, one policy, one workload replay. Returns the result row
    (RESULT_KEYS) plus details."""
    os.makedirs(cfg.out_dir, exist_ok=True)
    cleanup = Cleanup()
    route: Optional[Route] = None
    try:
        max_num_seqs = spec.max_num_seqs or cfg.max_num_seqs
        num_gpu_blocks = spec.num_gpu_blocks or cfg.num_gpu_blocks
        extra = ["--model", MODEL, "--speed", str(cfg.speed), "--seed", str(seed), "--hash-seed", str(seed + 1),
                 "--num-gpu-blocks", str(num_gpu_blocks), "--block-size", str(cfg.block_size),
                 "--max-num-seqs", str(max_num_seqs), "--max-num-batched-tokens", str(cfg.max_num_batched_tokens),
                 # vLLM >= 0.24 tagged-map events: vllm-router 0.1.17 rejects the
                 # positional form ("KV event must be a tagged map"); see docs/arena.md.
                 "--kv-events-encoding", "map", "--clock", cfg.clock, *sim_extra]
        _, servers, _ = start_sim_fleet(sim_binary(), cfg.servers, cleanup, extra,
                                        os.path.join(cfg.out_dir, "vllm-sim.log"))
        if policy == "round_robin":
            route = RoundRobin(servers)
        elif policy == "verl_default":
            route = VerlDefaultRoute(servers, seed)
        elif policy == "kvc_aware":
            route = Balancer(servers, "kvc_aware", max_num_seqs, cfg.kvc_knobs, VERL_TURNS.get(spec.kind),
                             spec.response_max if spec.kind in VERL_TURNS else 0,
                             router=frozen_router(cfg.kvc_frozen) if cfg.kvc_frozen else None)
        elif policy in ("kvc_aware+admit", "kvc_aware+admit+lengths"):
            route = AdmitBalancer(servers, max_num_seqs, cfg.kvc_knobs, VERL_TURNS.get(spec.kind),
                                  spec.response_max if spec.kind in VERL_TURNS else 0,
                                  lengths=policy.endswith("+lengths"),
                                  router=frozen_router(cfg.kvc_frozen) if cfg.kvc_frozen else None)
        elif base_policy(policy) in DYNAMO_VARIANTS:
            knobs = {**DYNAMO_VARIANTS[base_policy(policy)], **variant_params(policy, spec.name, cfg)}
            route = DynamoRoute(servers, cfg.block_size, num_gpu_blocks, max_num_seqs, cfg.max_num_batched_tokens,
                                router_config=knobs)
        elif base_policy(policy) in PEERS:
            route = PeerRouter(base_policy(policy), servers, cleanup,
                               os.path.join(cfg.out_dir, f"{base_policy(policy)}.log"), cfg.block_size,
                               extra_flags=peer_flags(variant_params(policy, spec.name, cfg)))
        else:
            raise ValueError(f"unknown policy {policy!r}")
        urls = {s.sid: s.url for s in servers}
        _settle(route, servers, policy)
        settled = {(t["server"], t["engine"], t["id"]) for t in engine_timings(servers)}
        before = scrape_all(urls)
        runner = Runner(route, servers, cfg.speed, cfg.stream, cfg.ordered, cfg.hold, cfg.turn_gap_s)
        makespans: List[float] = []
        busy: List[float] = []
        steps = build_steps(spec, seed)
        reported = {st.name for st in steps[spec.report_from_step:]}
        jobs_run = 0
        load0 = os.getloadavg()[0]
        for step in steps:
            jobs_run += len(step.jobs)
            b0 = busy_times(servers)
            makespans.append(runner.run_step(step, spec.mode, spec.concurrency))
            busy.append(max(b - a for a, b in zip(b0, busy_times(servers))))
            if step.reset_after:
                reset_prefix_caches(urls)
                route.reset()
        after = scrape_all(urls)
        host_load = [load0, os.getloadavg()[0]]
        timings = [t for t in engine_timings(servers) if (t["server"], t["engine"], t["id"]) not in settled]
        if isinstance(route, DynamoRoute):
            route.read_stats()  # before the probes: the run's requests only
        overhead_ms = _probe_overhead(route, servers, cfg.overhead_probes)
        router_status = route.status() if isinstance(route, Balancer) else None
        admission_held = route.held if isinstance(route, AdmitBalancer) else None
        router_config_used = route.config if isinstance(route, Balancer) else None
        dynamo_overlap = route.overlap_blocks if isinstance(route, DynamoRoute) else None
        dynamo_marks = route.first_token_marks if isinstance(route, DynamoRoute) else None
        dynamo_proxy = dict(route.stats) if isinstance(route, DynamoRoute) else None
        sessions_finished = route.finished if isinstance(route, PeerRouter) and route.finishes_sessions else None
        peer_decisions = route.decision_metrics() if isinstance(route, PeerRouter) else None
        # What the router was started with (tuned rows: the flags / KvRouterConfig knobs actually passed).
        router_args: Any = None
        if isinstance(route, PeerRouter):
            router_args = route.cmd[route.cmd.index("--policy"):]
        elif isinstance(route, DynamoRoute):
            router_args = dict(route.router.router_config)
    finally:
        if route is not None:
            route.close()
        cleanup.run()
    delta = {sid: {k: after[sid][k] - before[sid][k] for k in COUNTERS} for sid in urls}
    # Admission's holds on the engines' clocks; every other route's acquire
    # is a decision of microseconds (or returns a proxy's URL at once), kept
    # as wall time x speed.
    holds = engine_clock_holds(runner.records, timings, cfg.speed) if admission_held is not None else None
    res = summarize(spec, policy, seed, runner.records, delta, makespans, cfg.speed, overhead_ms, router_status,
                    timings, holds)
    # report_from_step: the row's step times count the reported steps only
    # (every step ran; step_makespans_s keeps them all).
    res["row"]["makespan_s"] = sum(makespans[spec.report_from_step:])
    res["details"]["busy_makespan_s"] = sum(busy[spec.report_from_step:])
    res["details"]["jobs"] = jobs_run
    res["details"]["engine_makespan_s"] = engine_makespan(
        spec, [r for r in runner.records if r["step"] in reported], timings)
    # One step-time field, on the engines' clock: row["makespan_s"]. The
    # clients' clock (wall x speed; it stretches with host load) is kept
    # under its own name, with what it adds over the engines (client work,
    # proxy hops, scheduling); router decision time is router_overhead_ms.
    res["details"]["client_makespan_s"] = res["row"]["makespan_s"]
    res["row"]["makespan_s"] = res["details"]["engine_makespan_s"]
    res["details"]["client_over_engine_s"] = res["details"]["client_makespan_s"] - res["row"]["makespan_s"]
    res["details"]["pacing_late_max_s"] = runner.late_s
    res["details"]["pacing_fell_behind"] = runner.late_s > PACING_SLACK_S
    res["details"]["step_busy_s"] = busy
    res["details"]["burst_hold_wall_s"] = runner.holds
    # The host's 1-minute load average before and after the steps: rows
    # whose router paces the engines from its own process (Dynamo's queue)
    # leave engines idle, on the engine clock too, when the host is busy.
    res["details"]["host_load_1m"] = host_load
    if runner.hold_timeouts:
        res["details"]["burst_hold_timeouts"] = runner.hold_timeouts
    res["details"]["fleet"] = {"max_num_seqs": max_num_seqs, "num_gpu_blocks": num_gpu_blocks}
    if router_config_used is not None:
        res["details"]["router_config"] = router_config_used
    if dynamo_overlap is not None:
        res["details"]["dynamo_overlap_blocks"] = dynamo_overlap
        res["details"]["dynamo_first_token_marks"] = dynamo_marks
        res["details"]["dynamo_proxy"] = dynamo_proxy
    if sessions_finished is not None:
        res["details"]["sessions_finished"] = sessions_finished
    if peer_decisions:
        res["details"]["router_decisions"] = peer_decisions
    if router_args is not None:
        res["details"]["router_args"] = router_args
    if admission_held is not None:
        # Each request's acquire (the hold in admission included), which the
        # engines' TTFT and an agent step leave out: on the engines' clocks
        # (engine_clock_holds), and as wall time x speed (wall_*).
        sim = list((holds or {}).values())
        wall = [r["acquire_s"] * cfg.speed for r in runner.records if not r["error"]]
        res["details"]["admission_wait_s"] = {"p50": _pct(sim, 0.5), "p99": _pct(sim, 0.99),
                                              "mean": sum(sim) / len(sim) if sim else float("nan"),
                                              "wall_p50": _pct(wall, 0.5), "wall_p99": _pct(wall, 0.99),
                                              "held_share": admission_held / max(1, len(wall))}
    return res


def engine_makespan(spec: WorkloadSpec, records: List[dict], timings: List[dict]) -> float:
    """Makespan on the engines' simulated clock, without the client's and the
    proxies' time between requests (which this shared 2-core machine makes
    noisy): per step, the longest job's sum of engine latencies (arrival to
    finish of each of its requests, in turn order), or for more jobs than
    clients (grpo) the step's engine span, last finish minus first arrival.
    Responses are matched to engine timings by the completion id the server
    returns (routers pass it through)."""
    by_id = {t["id"]: t for t in timings}
    steps: Dict[str, List[dict]] = {}
    for r in records:
        if not r["error"] and r.get("id") in by_id:
            steps.setdefault(r["step"], []).append(dict(by_id[r["id"]], rid=r["rid"]))
    total = 0.0
    for reqs in steps.values():
        jobs = {r["rid"] for r in reqs}
        if spec.kind == "grpo" or (spec.mode == "closed" and len(jobs) > spec.concurrency):
            total += max(r["finish"] for r in reqs) - min(r["arrival"] for r in reqs)
            continue
        per_job: Dict[str, float] = {}
        for r in reqs:
            per_job[r["rid"]] = per_job.get(r["rid"], 0.0) + (r["finish"] - r["arrival"])
        total += max(per_job.values())
    return total


def busy_times(servers: List[Server]) -> List[float]:
    """Each server's simulated compute time so far (sum of its engines' step
    durations, GET /sim/stats). The busiest server's busy time over a step is
    a makespan figure that depends only on routing and batching, not on how
    promptly this shared machine schedules the processes."""
    out = []
    for s in servers:
        status, body = http_request(s.url + "/sim/stats", timeout=30.0)
        if status != 200:
            raise RuntimeError(f"GET {s.url}/sim/stats: HTTP {status}")
        out.append(sum(e["BusyTime"] for e in json.loads(body)))
    return out


def _zmq_batches(route: Balancer) -> List[int]:
    r = route.status().get("router") or {}
    subs = ((r.get("collectors") or {}).get("collectors") or {}).get("vllm_zmq") or []
    return [(s.get("events") or {}).get("batches", 0) for s in subs]


def _settle(route: Route, servers: List[Server], policy: str, timeout: float = 15.0) -> None:
    """A ZMQ subscriber misses what is published before its subscription
    reaches the publisher (ZMQ's slow joiner; ~1-2 s for both event
    subscribers here). A real fleet has been up long before a rollout starts,
    so before the workload every server serves one unique probe prompt and
    the run waits until event consumers saw it: kvc_aware until each of its
    subscribers counted a batch, vllm-router kv_aware for the same fixed
    settle time (its state is not observable). The probes are outside the
    counter deltas and never share a prefix with the workload."""
    t0 = time.time()
    deadline = t0 + timeout
    for rnd in itertools.count():
        for i, s in enumerate(servers):
            stream_text_completion(s.url, " ".join(f"settle{rnd}x{i}y{j}" for j in range(48)), 1, i)
        if isinstance(route, Balancer) and route.needs_ids:
            if all(b > 0 for b in _zmq_batches(route)):
                return
        elif isinstance(route, DynamoRoute) and route.router.router_config.get("use_kv_events") is False:
            return  # approximate mode: no events to wait for
        elif isinstance(route, DynamoRoute):
            # Dynamo's indexer holds this round's probe on every server.
            seen = 0
            for i, s in enumerate(servers):
                ids = tokenize(s.url, " ".join(f"settle{rnd}x{i}y{j}" for j in range(48)))
                seen += route.router.overlap_scores(ids).get(s.sid, 0) > 0
            if seen == len(servers):
                return
        elif not base_policy(policy).startswith("vllm_router_kv_aware") or time.time() - t0 >= 2.0:
            return
        if time.time() > deadline:
            raise RuntimeError(f"{policy}: KV-event subscribers saw no batch within {timeout:.0f}s")
        time.sleep(0.25)


def engine_timings(servers: List[Server]) -> List[dict]:
    """Every finished request's simulated-clock timings (vllm-sim's GET
    /sim/requests): engine arrival -> first token, free of client overhead."""
    out: List[dict] = []
    for s in servers:
        status, body = http_request(s.url + "/sim/requests", timeout=30.0)
        if status != 200:
            raise RuntimeError(f"GET {s.url}/sim/requests: HTTP {status}")
        out.extend(dict(t, server=s.sid) for t in json.loads(body))
    return out


def engine_clock_holds(records: List[dict], timings: List[dict], speed: float) -> Dict[Any, float]:
    """Each answered request's wait from its acquire to its arrival at an
    engine, on that engine's clock (simulated seconds), by engine request id.

    The engines' TTFT is on their paced clocks, which a busy engine advances
    by its steps only, so a host that cannot keep up at ``speed`` adds no
    simulated time to a request queued inside an engine. A wait in the
    router (admission's hold) measured as wall time x speed would count the
    host's stalls that the engine-queued waits of every other route leave
    out. So each server's clock is read off its own requests instead: every
    send (wall) and its arrival (the engine's clock) is a point of that
    engine's wall -> clock map; an acquire's wall instant goes through the
    map of the engine the request reached (linear between points, at
    ``speed`` beyond them)."""
    by_id = {t["id"]: t for t in timings}
    points: Dict[str, List[Tuple[float, float]]] = {}
    for r in records:
        t = by_id.get(r.get("id"))
        if t is not None and not r["error"] and "t_sent" in r:
            points.setdefault(t["server"], []).append((r["t_sent"], t["arrival"]))
    maps: Dict[str, Tuple[List[float], List[float]]] = {}
    for sid, pts in points.items():
        pts.sort()
        walls, clock, top = [], [], float("-inf")
        for w, c in pts:
            top = max(top, c)  # a clock never runs back; a late stamp does not bend the map
            walls.append(w)
            clock.append(top)
        maps[sid] = (walls, clock)

    def clock_at(sid: str, w: float) -> float:
        walls, clock = maps[sid]
        i = bisect.bisect_right(walls, w)
        if i == 0:
            return clock[0] - (walls[0] - w) * speed
        if i == len(walls):
            return clock[-1] + (w - walls[-1]) * speed
        w0, w1, c0, c1 = walls[i - 1], walls[i], clock[i - 1], clock[i]
        return c0 + (c1 - c0) * (w - w0) / (w1 - w0) if w1 > w0 else c0

    out: Dict[Any, float] = {}
    for r in records:
        t = by_id.get(r.get("id"))
        if t is not None and not r["error"] and "t_acquire" in r and t["server"] in maps:
            out[r["id"]] = max(0.0, t["arrival"] - clock_at(t["server"], r["t_acquire"]))
    return out


def summarize(spec: WorkloadSpec, policy: str, seed: int, records: List[dict], delta: Dict[str, Dict[str, float]],
              makespans: List[float], speed: float, overhead_ms: float, router_status: Optional[dict],
              timings: List[dict], holds: Optional[Dict[Any, float]] = None) -> dict:
    ok = [r for r in records if not r["error"]]
    q = sum(v["queries"] for v in delta.values())
    h = sum(v["hits"] for v in delta.values())
    load = [v["queries"] for v in delta.values()]
    mean_load = sum(load) / len(load) if load else 0.0
    eng = timings
    ttft = [t["first_token"] - t["arrival"] for t in eng]
    client_ttft = [r["ttft"] * speed for r in ok]
    srv_n = sum(v["ttft_count"] for v in delta.values())
    row = {
        "workload": spec.name,
        "policy": policy,
        "seed": seed,
        "hit_rate": h / q if q else 0.0,
        "ttft_p50_s": _pct(ttft, 0.5),
        "ttft_p99_s": _pct(ttft, 0.99),
        "makespan_s": sum(makespans),
        "imbalance": max(load) / mean_load if mean_load else float("nan"),
        "errors": len(records) - len(ok),
    }
    # TTFT with the wait in the client's acquire added: for kvc_aware+admit
    # that wait is admission's hold, which the engines' TTFT leaves out,
    # taken on the engine's clock (``holds``, engine_clock_holds); for every
    # other in-process route it is the routing decision (wall x speed).
    # Routers behind an HTTP hop hold requests inside it, where the client
    # cannot see the wait, so only in-process routes have it. The same with
    # every wait as wall time x speed (the host's stalls in a hold) is kept
    # as ttft_with_acquire_wall_*.
    by_id = {t["id"]: t for t in eng}
    with_acq_wall = [by_id[r["id"]]["first_token"] - by_id[r["id"]]["arrival"] + r.get("acquire_s", 0.0) * speed
                     for r in ok if r.get("id") in by_id]
    with_acq = with_acq_wall if holds is None else [
        by_id[r["id"]]["first_token"] - by_id[r["id"]]["arrival"] + holds[r["id"]] for r in ok if r.get("id") in holds]
    details = {
        "requests": len(records),
        "e2e_p99_s": _pct([t["finish"] - t["arrival"] for t in eng], 0.99),
        "client_ttft_p50_s": _pct(client_ttft, 0.5),
        "client_ttft_p99_s": _pct(client_ttft, 0.99),
        "ttft_with_acquire_p50_s": _pct(with_acq, 0.5),
        "ttft_with_acquire_p99_s": _pct(with_acq, 0.99),
        "ttft_with_acquire_wall_p50_s": _pct(with_acq_wall, 0.5),
        "ttft_with_acquire_wall_p99_s": _pct(with_acq_wall, 0.99),
        "client_e2e_p99_s": _pct([r["e2e"] * speed for r in ok], 0.99),
        "step_makespans_s": makespans,
        "server_ttft_mean_s": (sum(v["ttft_sum"] for v in delta.values()) / srv_n) if srv_n else float("nan"),
        "client_cached_share": sum(r.get("cached", 0) for r in ok) / max(1, sum(r.get("prompt_tokens", 0) for r in ok)),
        "router_overhead_ms": overhead_ms,
        "preemptions": sum(v["preemptions"] for v in delta.values()),
        "queries_by_server": load,
        "error_samples": sorted({r["error"] for r in records if r["error"]})[:3],
        "client_retries": sum(r.get("retries", 0) for r in records),
        # Engine requests no client answer matches: work a router did for a
        # connection the client saw reset (0 unless retries duplicated work).
        "unanswered_engine_requests": len({t["id"] for t in eng} - {r.get("id") for r in ok}),
    }
    if router_status is not None:
        r = router_status.get("router") or {}
        cols = (r.get("collectors") or {}).get("collectors") or {}
        details["event_stored_blocks"] = sum((s.get("events") or {}).get("stored_blocks", 0)
                                             for s in cols.get("vllm_zmq") or [])
        # What the router measured from the releases (the spreads' gates read
        # these): None before a step gave enough evidence.
        lens = r.get("lengths") or {}
        details["lengths_observed_tokens"] = lens.get("observed_tokens", 0)
        # Admission's longest-first picks (kvc_aware+admit+lengths; 0 otherwise).
        details["longest_first_picks"] = lens.get("longest_first_picks", 0)
        # lengths.min_corr's gate at the end of the run (None without lengths).
        details["longest_first_gated"] = lens.get("longest_first_gated")
        details["length_corr"] = lens.get("length_corr") if lens.get("length_corr_known") else None
        details["task_corr"] = lens.get("task_corr") if lens.get("task_corr_known") else None
    return {"row": row, "details": details}


# ---------------------------------------------------------------------------
# Whole arena, table, plot, JSON


def run_arena(workloads: Sequence[WorkloadSpec], policies: Sequence[str], seeds: Sequence[int], cfg: ArenaConfig,
              log: Callable[[str], None] = print) -> List[dict]:
    out = []
    for spec in workloads:
        for seed in seeds:
            for policy in policies:
                t0 = time.time()
                if not (cfg.nohold_only and cfg.both_holds and cfg.hold):
                    res = run_one(spec, policy, seed, cfg, log)
                    r, d = res["row"], res["details"]
                    log(f"  {spec.name:<11} seed {seed} {policy:<26} hit {r['hit_rate']:.3f} "
                        f"ttft p50 {r['ttft_p50_s']:.3f}s "
                        f"p99 {r['ttft_p99_s']:.3f}s makespan {r['makespan_s']:.1f}s imb {r['imbalance']:.2f} "
                        f"err {r['errors']} overhead {d['router_overhead_ms']:.2f}ms ({time.time() - t0:.1f}s wall)")
                    out.append(res)
                if cfg.both_holds and cfg.hold:
                    res = run_one(spec, policy, seed, replace(cfg, hold=False), log)
                    res["row"]["policy"] = policy + NOHOLD_SUFFIX
                    log(f"  {spec.name:<11} seed {seed} {res['row']['policy']:<26} step time "
                        f"{res['details']['engine_makespan_s']:.1f}s err {res['row']['errors']} (no burst hold)")
                    out.append(res)
            if cfg.repeat_policy:
                res = run_one(spec, cfg.repeat_policy, seed, cfg, log)
                res["row"]["policy"] = cfg.repeat_policy + REPEAT_SUFFIX
                log(f"  {spec.name:<11} seed {seed} {res['row']['policy']:<26} step time "
                    f"{res['details']['engine_makespan_s']:.1f}s (noise floor)")
                out.append(res)
            if spec.name in cfg.bound_workloads:
                res = run_one(spec, "verl_default", seed, cfg, log, sim_extra=["--prefill-per-token", "-1"])
                res["row"]["policy"] = BOUND
                log(f"  {spec.name:<11} seed {seed} {BOUND:<26} makespan {res['row']['makespan_s']:.1f}s")
                out.append(res)
    return out


TUNE_OBJECTIVES = {
    "step+ttft": "mean over tuning seeds of (step time / verl_default + TTFT p99 / verl_default) / 2",
    "step": "mean over tuning seeds of step time / verl_default",
}


def tune_peers(specs: Sequence[WorkloadSpec], peers: Sequence[str], seeds: Sequence[int], cfg: ArenaConfig,
               log: Callable[[str], None] = print, objective: str = "step+ttft") -> dict:
    """Tunes each peer in ``peers`` over its TUNE_GRID on the tuning
    ``seeds`` (never the reported ones), per workload, with one of kvbench's
    objectives (TUNE_OBJECTIVES: "step+ttft", the mean over seeds of (step
    time / verl_default's + TTFT p99 / verl_default's) / 2, or "step", step
    time alone, as `make kvbench-rl-tuned` tunes). Returns every point's
    objective and the chosen point per peer and workload (the launcher
    default when it wins)."""
    bad = [p for p in peers if p not in TUNE_GRID]
    if bad:
        raise ValueError(f"not tunable: {bad}; tunable peers: {sorted(TUNE_GRID)}")
    if objective not in TUNE_OBJECTIVES:
        raise ValueError(f"tuning objective {objective!r}: expected one of {sorted(TUNE_OBJECTIVES)}")
    points: List[dict] = []
    chosen: Dict[str, Dict[str, Dict[str, float]]] = {}
    for spec in specs:
        base = {seed: run_one(spec, "verl_default", seed, cfg, log) for seed in seeds}
        for peer in peers:
            best: Optional[Tuple[float, Dict[str, float]]] = None
            for i, params in enumerate(TUNE_GRID[peer]):
                name = f"{peer}@grid{i}"
                trial = replace(cfg, peer_params={name: {spec.name: params}})
                objs = []
                for seed in seeds:
                    r = run_one(spec, name, seed, trial, log)
                    b = base[seed]
                    step = r["details"]["engine_makespan_s"] / b["details"]["engine_makespan_s"]
                    p99 = r["row"]["ttft_p99_s"] / b["row"]["ttft_p99_s"]
                    objs.append(step if objective == "step" else (step + p99) / 2)
                    points.append({"workload": spec.name, "policy": peer, "params": params, "seed": seed,
                                   "step_ratio": step, "ttft_p99_ratio": p99, "errors": r["row"]["errors"],
                                   "router_args": r["details"].get("router_args"),
                                   "burst_holds": len(r["details"].get("burst_hold_wall_s") or [])})
                obj = sum(objs) / len(objs)
                log(f"  tune {spec.name:<11} {peer:<26} {params} objective {obj:.3f}")
                if best is None or obj < best[0]:
                    best = (obj, params)
            assert best is not None
            chosen.setdefault(peer, {})[spec.name] = best[1]
    return {"tune_seeds": list(seeds), "grid": {p: TUNE_GRID[p] for p in peers}, "points": points,
            "chosen": chosen, "objective": TUNE_OBJECTIVES[objective]}


def gain_shares(results: List[dict]) -> List[dict]:
    """Per (workload, seed, policy) with a prefill-free bound: the share of
    the achievable makespan gain over verl_default the policy captures,
    (verl_default - policy) / (verl_default - bound)."""
    out = []
    measures = (("engine", lambda r: r["details"]["engine_makespan_s"]),
                ("wall", lambda r: r["details"].get("client_makespan_s", r["row"]["makespan_s"])))
    for measure, get in measures:
        by = {(r["row"]["workload"], r["row"]["seed"], r["row"]["policy"]): get(r) for r in results}
        for (w, seed, p), m in sorted(by.items()):
            if (not is_policy(p) or p == "verl_default" or (w, seed, BOUND) not in by
                    or (w, seed, "verl_default") not in by):
                continue
            base, bound = by[(w, seed, "verl_default")], by[(w, seed, BOUND)]
            out.append({"measure": measure, "workload": w, "seed": seed, "policy": p, "makespan_s": m,
                        "verl_default_s": base, "bound_s": bound,
                        "share": (base - m) / (base - bound) if base > bound else float("nan")})
    return out


def portable_config(cfg: ArenaConfig) -> Dict[str, Any]:
    """The configuration as recorded in results: paths inside the repository
    relative to it, so committed JSON names no machine path."""
    d = asdict(cfg)
    if not d.get("turn_gap_s"):
        d.pop("turn_gap_s", None)  # recorded only when set: published runs' configurations stay comparable
    if not d.get("nohold_only"):
        d.pop("nohold_only", None)
    for k in ("out_dir", "kvc_frozen"):
        v = d.get(k)
        if isinstance(v, str) and os.path.isabs(v):
            rel = os.path.relpath(v, REPO)
            d[k] = rel if not rel.startswith("..") else v
    return d


def write_outputs(results: List[dict], out_dir: str, cfg: ArenaConfig,
                  extra: Optional[Dict[str, Any]] = None) -> Dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "arena.json"), "details": os.path.join(out_dir, "arena-details.json")}
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump({"results": [{k: r["row"][k] for k in RESULT_KEYS} for r in results
                               if is_policy(r["row"]["policy"])]}, f, indent=1)
    summary = [{"workload": a["workload"], "policy": a["policy"], "seeds": a["seeds"],
                **{k: v.as_dict() for k, v in a["ci"].items()}, "errors": a["errors"],
                "overhead_ms": a["overhead_ms"]} for a in aggregate(results)]
    with open(paths["details"], "w", encoding="utf-8") as f:
        json.dump({"config": portable_config(cfg), "runs": results, "gain_shares": gain_shares(results),
                   "summary": summary, "verdicts": verdicts(results), "noise_floor": noise_floor(results),
                   **(extra or {})}, f, indent=1)
    png = plot([r for r in results if is_policy(r["row"]["policy"])], os.path.join(out_dir, "arena.png"))
    if png:
        paths["png"] = png
    return paths


# Metrics with a 95% CI in the summary, and whether lower is better.
CI_METRICS = (("makespan_s", "row", True), ("client_makespan_s", "details", True), ("ttft_p99_s", "row", True),
              ("ttft_p50_s", "row", True),
              ("hit_rate", "row", False), ("engine_makespan_s", "details", True), ("busy_makespan_s", "details", True),
              ("imbalance", "row", True))


def ci_stats(results: List[dict]) -> Dict[Tuple[str, str], Dict[str, MeanCI]]:
    """Per (workload, policy): mean ± 95% CI (t) over seeds of CI_METRICS."""
    groups: Dict[Tuple[str, str], List[dict]] = {}
    for r in results:
        groups.setdefault((r["row"]["workload"], r["row"]["policy"]), []).append(r)
    return {k: {m: mean_ci([x[src].get(m, float("nan")) for x in rs]) for m, src, _ in CI_METRICS}
            for k, rs in groups.items()}


def noise_floor(results: List[dict]) -> List[dict]:
    """Per workload and seed, a repeated policy's two step times (engine
    clock) and their difference relative to their mean: what a second run of
    the same seed moves by, to read every interval against."""
    by = {(r["row"]["workload"], r["row"]["seed"], r["row"]["policy"]): r["details"]["engine_makespan_s"]
          for r in results}
    out = []
    for (w, seed, p), second in sorted(by.items()):
        if not p.endswith(REPEAT_SUFFIX):
            continue
        base = p[: -len(REPEAT_SUFFIX)]
        first = by.get((w, seed, base))
        if first is None:
            continue
        mean = (first + second) / 2
        out.append({"workload": w, "seed": seed, "policy": base, "first_s": first, "second_s": second,
                    "rel_diff": abs(first - second) / mean if mean > 0 else float("nan")})
    return out


def verdicts(results: List[dict],
             metrics: Sequence[str] = ("engine_makespan_s", "makespan_s", "ttft_p99_s", "hit_rate")) -> List[dict]:
    """Per workload and metric, who wins: "best" only when its 95% interval
    overlaps no other policy's, else the tie (the prefill-free bound is not a
    policy and takes no part)."""
    st = ci_stats([r for r in results if is_policy(r["row"]["policy"])])
    lower = {m: lo for m, _, lo in CI_METRICS}
    out = []
    for w in dict.fromkeys(k[0] for k in st):
        for m in metrics:
            v = verdict(m, {p: s[m] for (ww, p), s in st.items() if ww == w}, lower[m])
            if v is not None:
                out.append({"workload": w, "metric": m, "winner": v.winner, "tied": v.tied, "best_mean": v.best,
                            "text": v.text({p: s[m] for (ww, p), s in st.items() if ww == w},
                                           1 if m.endswith("makespan_s") else 3)})
    return out


def aggregate(results: List[dict]) -> List[dict]:
    """Mean over seeds per (workload, policy), with the spread (min..max) of hit rate."""
    groups: Dict[Tuple[str, str], List[dict]] = {}
    for r in results:
        groups.setdefault((r["row"]["workload"], r["row"]["policy"]), []).append(r)
    out = []
    for (w, p), rs in groups.items():
        def m(key: str, src: str = "row", rs: List[dict] = rs) -> float:
            vals = [x[src][key] for x in rs if not (isinstance(x[src][key], float) and math.isnan(x[src][key]))]
            return sum(vals) / len(vals) if vals else float("nan")
        hits = [x["row"]["hit_rate"] for x in rs]
        cis = {k: mean_ci([x[src].get(k, float("nan")) for x in rs]) for k, src, _ in CI_METRICS}
        out.append({"ci": cis, "workload": w, "policy": p, "seeds": len(rs), "hit_rate": m("hit_rate"),
                    "hit_min": min(hits), "hit_max": max(hits), "ttft_p50_s": m("ttft_p50_s"),
                    "ttft_p99_s": m("ttft_p99_s"), "e2e_p99_s": m("e2e_p99_s", "details"),
                    "client_ttft_p50_s": m("client_ttft_p50_s", "details"),
                    "client_ttft_p99_s": m("client_ttft_p99_s", "details"),
                    "makespan_s": m("makespan_s"), "imbalance": m("imbalance"),
                    "busy_s": m("busy_makespan_s", "details"),
                    "engine_makespan_s": m("engine_makespan_s", "details"),
                    "errors": sum(x["row"]["errors"] for x in rs),
                    "overhead_ms": m("router_overhead_ms", "details"),
                    "server_ttft_mean_s": m("server_ttft_mean_s", "details")})
    return out


def format_table(results: List[dict]) -> str:
    rows = aggregate(results)
    hdr = (f"{'workload':<11} {'policy':<28} {'seeds':>5} {'hit rate':>15} {'TTFT p50':>15} {'TTFT p99':>15} "
           f"{'client mk':>13} {'step time':>13} {'busy':>8} {'e2e p99':>8} {'cl p99':>7} {'imbal':>5} "
           f"{'err':>4} {'ovh ms':>7}")
    lines = ["arena: mean ± 95% CI (t) over seeds; hit rate from the servers' counters; TTFT/e2e on the engines' "
             "simulated clock (GET /sim/requests); cl = client-side TTFT (wall x speed, includes proxy hops); "
             "client mk = makespan on the clients' clock (wall x speed, sim s); step time = engine-clock makespan; "
             "busy = busiest server's simulated compute time (sim s); "
             "router overhead in wall ms", hdr, "-" * len(hdr)]
    last = None
    for a in rows:
        if last is not None and a["workload"] != last:
            lines.append("")
        last = a["workload"]
        c = a["ci"]
        lines.append(
            f"{a['workload']:<11} {a['policy']:<28} {a['seeds']:>5} "
            f"{c['hit_rate'].fmt(3):>15} {c['ttft_p50_s'].fmt(3):>15} {c['ttft_p99_s'].fmt(3):>15} "
            f"{c['client_makespan_s'].fmt(1):>13} {c['engine_makespan_s'].fmt(1):>13} {a['busy_s']:>8.1f} "
            f"{a['e2e_p99_s']:>8.2f} {a['client_ttft_p99_s']:>7.3f} {a['imbalance']:>5.2f} "
            f"{a['errors']:>4d} {a['overhead_ms']:>7.2f}")
    vs = verdicts(results)
    if vs:
        lines += ["", "who wins (\"best\" only where the 95% intervals do not overlap; else the tie):"]
        for v in vs:
            lines.append(f"  {v['workload']:<11} {v['metric']:<11} {v['text']}")
    shares = gain_shares(results)
    if shares:
        lines += ["", "share of the achievable makespan gain over verl_default "
                      "((verl_default - policy) / (verl_default - prefill-free bound)); busy = busiest server's "
                      "simulated compute time;",
                  "engine = longest job's summed engine latencies; wall = client makespan:"]
        groups: Dict[Tuple[str, str, str], List[dict]] = {}
        for g in shares:
            groups.setdefault((g["measure"], g["workload"], g["policy"]), []).append(g)
        for (meas, w, p), v in groups.items():
            mean_m = sum(g["makespan_s"] for g in v) / len(v)
            base = sum(g["verl_default_s"] for g in v) / len(v)
            bound = sum(g["bound_s"] for g in v) / len(v)
            share = (base - mean_m) / (base - bound) if base > bound else float("nan")
            lines.append(f"  {meas:<4} {w:<11} {p:<26} share of seed means {share:>7.1%}  "
                         f"(policy {mean_m:.1f}s, verl_default {base:.1f}s, bound {bound:.1f}s; per seed: "
                         + ", ".join(f"{g['share']:.0%}" for g in v) + ")")
    return "\n".join(lines)


def plot(results: List[dict], path: str) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = aggregate(results)
    workloads = list(dict.fromkeys(a["workload"] for a in rows))
    policies = list(dict.fromkeys(a["policy"] for a in rows))
    metrics = [("hit_rate", "server hit rate"), ("ttft_p50_s", "TTFT p50 (sim s)"),
               ("ttft_p99_s", "TTFT p99 (sim s)"), ("engine_makespan_s", "step time, engine clock (sim s)")]
    fig, axes = plt.subplots(len(metrics), 1, figsize=(max(8, 2.2 * len(workloads)), 3.0 * len(metrics)))
    width = 0.8 / max(1, len(policies))
    for ax, (key, label) in zip(axes, metrics):
        for i, p in enumerate(policies):
            vals = [next((a[key] for a in rows if a["workload"] == w and a["policy"] == p), float("nan"))
                    for w in workloads]
            ax.bar([x + i * width for x in range(len(workloads))], vals, width, label=p)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(workloads))])
        ax.set_xticklabels(workloads)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7, ncol=3)
    fig.suptitle("arena: real routers on vllm-sim fleets")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def iter_rows(results: List[dict]) -> Iterator[dict]:
    for r in results:
        yield r["row"]
