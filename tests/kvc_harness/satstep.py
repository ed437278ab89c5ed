"""One oversubscribed GRPO step through the Ray path: the demo's headline.

A real verl rollout step submits every sample at once: each agent-loop
coroutine acquires a server from the balancer actor, sends one non-streamed
``/v1/completions`` with token ids, releases the server. With thousands of
sequences against a fleet's few hundred running slots, step time is bound by
throughput and KV memory, which is where routing decides it (issue 18).

:class:`SatWorker` is that coroutine pool reduced to its routing part: an
async Ray actor per agent-loop worker, the acquire/release calls going through
kvc-router's client batching (``kvc_router.batching``, what verl's client does
with kvc-router installed; ``KVC_ROUTER_CLIENT_BATCHING=0`` gives one actor
call each), the HTTP call through the arena's client
(:func:`kvc_harness.arena.stream_text_completion`, non-streamed, token ids as
the prompt). The step's shape (prompt lengths, the long-tailed response
lengths of reasoning RL) is the arena's ``grpo_sat`` workload, sized to the
demo's fleet by prompts x samples; the prompts are token ids drawn by
:func:`kvc_harness.workloads.grpo_step`.

Figures: step time = the step's first arrival to its last completion on the
engines' clock (vllm-sim ``--clock paced``: a busy engine's clock advances by
its step durations only, so this shared machine's stalls add no simulated
time), beside the same span on the clients' clocks (first submission to last
completion, wall x speed, stalls included) and the busiest server's simulated
compute time; on servers without engine timings (real vLLM) step time is the
clients' span; prefix-cache hit rate and preemptions from the servers' /metrics;
TTFT per sample = its acquire wait (wall x speed) + the engine's arrival to
first token (vllm-sim's ``GET /sim/requests``), i.e. submission to first token
as the sample sees it. Servers without ``/sim/requests`` (real vLLM) get no
TTFT percentiles; the servers' TTFT histogram mean is reported either way."""

from __future__ import annotations

import asyncio
import functools
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from kvc_harness.balancer import router_config, router_summary, wait_collectors
from kvc_harness.client import COUNTERS, scrape_all
from kvc_harness.fleet import Server
from kvc_harness.report import percentile
from kvc_harness.workloads import WorkloadSpec

STEP = "grpo-sat"


@dataclass
class SatOptions:
    """The oversubscribed step and the fleet it runs on. ``prompts x samples``
    sequences against ``servers x max_num_seqs`` running slots."""

    prompts: int = 128
    samples: int = 8
    servers: int = 4
    max_num_seqs: int = 64
    gpu_blocks: int = 3072  # 16-token blocks per server (48k tokens): KV memory binds
    speed: float = 6.0  # vllm-sim simulated seconds per wall second
    workers: int = 4  # agent-loop worker actors
    seed: int = 0

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples

    @property
    def slots(self) -> int:
        return self.servers * self.max_num_seqs


def quick_options(seed: int = 0) -> SatOptions:
    """The test suite's size: still 4x oversubscribed, a few seconds per policy."""
    return SatOptions(prompts=16, samples=8, max_num_seqs=8, gpu_blocks=512, speed=8.0, seed=seed)


def workload(o: SatOptions) -> WorkloadSpec:
    """The arena's ``grpo_sat`` shape (prompt lengths, response median, tail
    and cap) at prompts x samples; one step, token-id prompts."""
    from kvc_harness.arena import workload_specs

    sat = workload_specs()["grpo_sat"]
    return WorkloadSpec(
        seed=o.seed,
        steps=1,
        prompts=o.prompts,
        samples=o.samples,
        prompt_tokens=tuple(sat.prompt_words),
        response_median=sat.response_median,
        response_sigma=sat.response_sigma,
        response_max=sat.response_max,
        tasks=0,
    )


def scale_for_quick(spec: WorkloadSpec) -> WorkloadSpec:
    """The quick run's shorter prompts and responses (the arena's short grpo_sat)."""
    from kvc_harness.arena import workload_specs

    sat = workload_specs(short=True)["grpo_sat"]
    spec.prompt_tokens = tuple(sat.prompt_words)
    spec.response_median, spec.response_max = sat.response_median, sat.response_max
    return spec


def sim_flags(o: SatOptions) -> List[str]:
    """vllm-sim flags of the step's fleet (besides ports and events)."""
    return [
        "--speed", str(o.speed), "--clock", "paced", "--num-gpu-blocks", str(o.gpu_blocks), "--seed", str(o.seed),
        "--max-num-seqs", str(o.max_num_seqs),
    ]


class SatWorker:
    """verl's agent-loop worker, reduced to routing: every sample of its share
    of the step is a coroutine started at once (open loop), which acquires a
    server through the balancer actor, calls it once (non-streamed, token
    ids) and releases it.

    Created with ``ray.remote(num_cpus=0)(SatWorker).remote(...)``; async
    methods make it an async actor, as verl's workers are."""

    def __init__(self, balancer: Any, urls: Dict[str, str], model: str, threads: int = 256) -> None:
        self.lb = balancer
        self.urls = dict(urls)
        self.model = model
        # The HTTP client is blocking; each in-flight sample holds a thread.
        self.pool = ThreadPoolExecutor(max_workers=threads)

    async def ready(self) -> bool:
        return True

    async def step(self, reqs: List[dict]) -> List[dict]:
        from kvc_router import batching

        from kvc_harness.arena import stream_text_completion

        loop = asyncio.get_running_loop()
        batcher = batching.batcher_for(self.lb)

        async def one(r: dict) -> dict:
            rec: Dict[str, Any] = {
                "rid": r["rid"], "server": "", "error": None, "prompt_len": len(r["prompt"]),
                "submit": time.time(), "acquire_s": 0.0,
            }
            try:
                t0 = time.perf_counter()
                if batcher is not None:
                    sid, _ = await batcher.acquire(r["rid"], r["prompt"])
                else:
                    sid, _ = await self.lb.acquire_server.remote(request_id=r["rid"], prompt_ids=r["prompt"])
                rec["acquire_s"] = time.perf_counter() - t0
                rec["server"] = sid
                try:
                    call = functools.partial(
                        stream_text_completion, self.urls[sid], r["prompt"], r["max_tokens"], r["seed"],
                        stream=False, model=self.model,
                    )
                    res = await loop.run_in_executor(self.pool, call)
                    rec.update({k: res[k] for k in ("e2e", "cached", "completion_tokens", "id")})
                finally:
                    if batcher is not None:
                        batcher.release(sid)
                    else:
                        self.lb.release_server.remote(server_id=sid)
            except Exception as e:  # noqa: BLE001 - counted and reported, never dropped
                rec["error"] = f"{type(e).__name__}: {e}"[:300]
            rec["done"] = time.time()
            return rec

        return list(await asyncio.gather(*(one(r) for r in reqs)))


def _sim_requests(servers: Sequence[Server]) -> Optional[List[dict]]:
    """vllm-sim's engine-clock timings of every server, or None when a server
    has no such endpoint (real vLLM)."""
    from kvc_harness.arena import engine_timings

    try:
        return engine_timings(list(servers))
    except (OSError, RuntimeError, ValueError):
        return None


def _busy(servers: Sequence[Server]) -> Optional[List[float]]:
    from kvc_harness.arena import busy_times

    try:
        return busy_times(list(servers))
    except (OSError, RuntimeError, ValueError, KeyError):
        return None


def run_policy(
    ray: Any,
    policy: str,
    servers: Sequence[Server],
    reqs: List[dict],
    model: str,
    workers: int = 4,
    max_num_seqs: int = 0,
    log: Callable[[str], Any] = print,
) -> dict:
    """The step under one policy: the balancer created as verl creates it,
    ``workers`` SatWorker actors each submitting its share at once. Returns the
    per-sample records, the servers' counter deltas, engine timings and the
    router's summary."""
    from kvc_router.verl import actor

    urls = {s.sid: s.url for s in servers}
    base, _, extra = policy.partition("+")
    cfg = router_config(base, servers, max_num_seqs=max_num_seqs)
    if extra == "admit" and cfg is not None:
        # kvc_aware+admit: router-side admission (cap = max_num_seqs per server).
        cfg["config"]["admission"] = {"enabled": True}
    # The class and actor options as kvc_router's verl integration picks them.
    cls = ray.remote(actor.balancer_class(cfg))
    opts = actor.actor_options(cfg)
    lb = (cls.options(**opts) if opts else cls).remote(
        servers={s.sid: None for s in servers},
        max_cache_size=10000,
        router_config=cfg,
    )
    share = -(-len(reqs) // max(1, workers))
    ws = [ray.remote(num_cpus=0)(SatWorker).remote(lb, urls, model, threads=max(8, share)) for _ in range(workers)]
    try:
        ray.get([w.ready.remote() for w in ws] + [lb.get_status.remote()])
        if base != "default":
            wait_collectors(ray, lb)
        before = scrape_all(urls)
        seen = {(t["server"], t["engine"], t["id"]) for t in (_sim_requests(servers) or [])}
        busy0 = _busy(servers)
        t0 = time.perf_counter()
        refs = [w.step.remote(reqs[i::workers]) for i, w in enumerate(ws) if reqs[i::workers]]
        records = [r for part in ray.get(refs) for r in part]
        wall = time.perf_counter() - t0
        after = scrape_all(urls)
        busy1 = _busy(servers)
        timings = _sim_requests(servers)
        status = ray.get(lb.get_status.remote())
    finally:
        for a in ws + [lb]:
            ray.kill(a)
    if timings is not None:
        timings = [t for t in timings if (t["server"], t["engine"], t["id"]) not in seen]
    by_server = [sum(1 for r in records if r["server"] == sid) for sid in urls]
    log(f"  [{policy}] {STEP}: {len(records)} samples at once, {wall:.1f}s wall, samples per server {by_server}")
    return {
        "policy": policy,
        "records": records,
        "counters": {sid: {k: after[sid][k] - before[sid][k] for k in COUNTERS} for sid in urls},
        "timings": timings,
        "busy": [b - a for a, b in zip(busy0, busy1)] if busy0 is not None and busy1 is not None else None,
        "router": router_summary(status),
    }


def summarize(run: dict, speed: float) -> dict:
    """Step time, hit rate, TTFT, preemptions of one policy's run. ``speed``
    converts wall seconds to the servers' clock (1 for real servers)."""
    recs = run["records"]
    ok = [r for r in recs if not r["error"]]
    c = run["counters"]
    q = sum(v["queries"] for v in c.values())
    h = sum(v["hits"] for v in c.values())
    srv_n = sum(v["ttft_count"] for v in c.values())
    out: Dict[str, Any] = {
        "policy": run["policy"],
        "requests": len(recs),
        "completed": len(ok),
        "errors": len(recs) - len(ok),
        "first_error": next((r["error"] for r in recs if r["error"]), None),
        "client_step_time_s": (max(r["done"] for r in recs) - min(r["submit"] for r in recs)) * speed
        if recs else 0.0,
        "hit_rate": h / q if q else 0.0,
        "hit_rate_by_server": {sid: (v["hits"] / v["queries"] if v["queries"] else 0.0) for sid, v in c.items()},
        "requests_by_server": {sid: sum(1 for r in recs if r["server"] == sid) for sid in c},
        "preemptions": sum(v["preemptions"] for v in c.values()),
        "server_ttft_mean_s": (sum(v["ttft_sum"] for v in c.values()) / srv_n) if srv_n else float("nan"),
        "acquire_p50_s": percentile([r["acquire_s"] * speed for r in ok], 50),
        "acquire_p99_s": percentile([r["acquire_s"] * speed for r in ok], 99),
        "busiest_server_busy_s": max(run["busy"]) if run.get("busy") else float("nan"),
        "engine_span_s": float("nan"),
        "ttft_p50_s": float("nan"),
        "ttft_p99_s": float("nan"),
        "engine_ttft_p50_s": float("nan"),
        "engine_ttft_p99_s": float("nan"),
        "ttft_samples_s": [],
        "router": run["router"],
    }
    timings = run.get("timings")
    if timings:
        by_id = {t["id"]: t for t in timings}
        matched = [(r, by_id[r["id"]]) for r in ok if r.get("id") in by_id]
        if matched:
            eng = [t["first_token"] - t["arrival"] for _, t in matched]
            ttft = sorted(r["acquire_s"] * speed + e for (r, _), e in zip(matched, eng))
            out["engine_span_s"] = max(t["finish"] for _, t in matched) - min(t["arrival"] for _, t in matched)
            out["engine_ttft_p50_s"], out["engine_ttft_p99_s"] = percentile(eng, 50), percentile(eng, 99)
            out["ttft_p50_s"], out["ttft_p99_s"] = percentile(ttft, 50), percentile(ttft, 99)
            out["ttft_samples_s"] = ttft
            out["ttft_matched"] = len(matched)
    # The headline: the engines' span where they report one, else the clients'.
    engine = not math.isnan(out["engine_span_s"])
    out["step_time_s"] = out["engine_span_s"] if engine else out["client_step_time_s"]
    out["step_time_clock"] = "engines" if engine else "clients"
    return out


def _chg(a: float, b: float) -> str:
    if not a or math.isnan(a) or math.isnan(b):
        return ""
    return f"{(b - a) / a * 100:+.0f}%"


def format_table(sums: List[dict], title: str, time_unit: str) -> str:
    """The headline comparison: step time first, hit rate and TTFT beside it."""
    base, new = sums[0], sums[-1]
    w0, wc = 44, 17
    rule = "-" * (w0 + wc * len(sums) + 12)
    lines = [title, "", f"{'':<{w0}}" + "".join(f"{s['policy']:>{wc}}" for s in sums) + f"{'change':>12}", rule]

    def row(label: str, key: str, fmt: Callable[[Any], str], change: Optional[str] = None) -> None:
        vals = [s.get(key, float("nan")) for s in sums]
        cells = "".join(f"{('n/a' if isinstance(v, float) and math.isnan(v) else fmt(v)):>{wc}}" for v in vals)
        ch = _chg(base.get(key, float("nan")), new.get(key, float("nan"))) if change is None else change
        lines.append(f"{label:<{w0}}{cells}{ch:>12}")

    sec = lambda v: f"{v:.2f}s"  # noqa: E731
    clock = "engines' clock" if all(s.get("step_time_clock") == "engines" for s in sums) else "clients' clock"
    row(f"STEP TIME ({clock}, {time_unit})", "step_time_s", sec)
    row("prefix-cache hit rate (servers)", "hit_rate", lambda v: f"{v * 100:.1f}%",
        f"{(new['hit_rate'] - base['hit_rate']) * 100:+.1f} pt")
    row(f"TTFT p50 (submit -> first token, {time_unit})", "ttft_p50_s", lambda v: f"{v:.3f}s")
    row(f"TTFT p99 (submit -> first token, {time_unit})", "ttft_p99_s", lambda v: f"{v:.3f}s")
    row("preemptions (servers)", "preemptions", lambda v: f"{v:.0f}", "")
    row(f"step time, clients' clock ({time_unit})", "client_step_time_s", sec)
    row(f"busiest server's compute ({time_unit})", "busiest_server_busy_s", sec)
    row(f"acquire wait p99 (Ray, {time_unit})", "acquire_p99_s", lambda v: f"{v:.3f}s")
    lines.append(f"{'samples completed / errors':<{w0}}" + "".join(
        f"{str(s['completed']) + ' / ' + str(s['errors']):>{wc}}" for s in sums))
    lines.append(f"{'samples per server':<{w0}}" + "".join(
        f"{' '.join(str(n) for n in s['requests_by_server'].values()):>{wc}}" for s in sums))
    lines.append(rule)
    return "\n".join(lines)
