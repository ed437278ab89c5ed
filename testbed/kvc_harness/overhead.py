#!/usr/bin/env python3
"""What routing costs, in one table, each figure next to a baseline measured
in the same run:

1. Go core decision time: ``go test -bench Acquire`` in core/internal/router (64
   event-fed servers, the prompt cached on 4 of them); kvc_aware against the
   default least-in-flight path.
2. C ABI call cost: one acquire + release pair through ``kvc_router._native``
   (ctypes), 16-token and 8k-token prompts, against the Go core's own Acquire
   and against the cheapest ctypes call into the library (``kvr_abi_version``).
3. Ray actor round trip: ``ray.remote(KVCAwareBalancer)`` against a plain-Python
   least-in-flight actor (:class:`PlainLeastInflight`), 8k-token prompts.
4. KV-event ingest: ``go test -bench DecodeApply`` in core/internal/collector (msgpack
   decode + index update), against decoding the same batches with Python's
   msgpack, and as engines one core keeps up with.

Also the balancer micro-benchmarks of tests/bench_balancer.py: Python-level
acquire_server cost in process (:func:`bench_inprocess`) and Ray round trips
(:func:`bench_ray`).

Needs Go, the .venv and python/kvc_router/libkvcrouter.so (``make overhead``
builds what is missing); testbed/scripts/overhead.py is the command line.
"""

from __future__ import annotations

import array
import os
import random
import re
import subprocess
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Tuple

from kvc_harness import REPO, report
from kvc_harness.procs import start_ray
from kvc_harness.wire import block_stored, event_batch
from kvc_harness.workloads import shared_prefix_prompts

PROMPT_TOKENS = 8192
# (benchmark, value, unit)
Row = Tuple[str, float, str]

# One saturated engine's prefill (8B model on an H100, the simulator's
# default profile: ~50k tokens/s) in 16-token blocks per second.
ENGINE_BLOCKS_PER_S = 50_000 / 16

_BENCH = re.compile(r"^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$")


def go_bench(pkg: str, pattern: str, benchtime: str) -> Dict[str, Dict[str, float]]:
    """Runs one package's benchmarks; returns {name: {unit: value}}."""
    cmd = ["go", "test", "-run", "^$", "-bench", pattern, "-benchtime", benchtime, "-count", "1", pkg]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    res: Dict[str, Dict[str, float]] = {}
    for line in out.stdout.splitlines():
        m = _BENCH.match(line.strip())
        if not m:
            continue
        fields = m.group(3).split()
        vals: Dict[str, float] = {}
        for i in range(0, len(fields) - 1, 2):
            try:
                vals[fields[i + 1]] = float(fields[i])
            except ValueError:
                pass
        res[m.group(1)] = vals
    return res


def abi_cost(iters: int) -> Dict[str, float]:
    """ns per acquire+release pair through ctypes, as the Go benchmark's setup."""
    from kvc_router import _native
    from kvc_router.config import load_router_config

    lib = _native.load()
    out = {}
    t0 = time.perf_counter_ns()
    for _ in range(iters):
        lib.kvr_abi_version()
    out["floor"] = (time.perf_counter_ns() - t0) / iters
    ids = [f"10.0.0.{i}:8000" for i in range(64)]
    rng = random.Random(7)
    for label, n in (("16", 16), ("8k", 8192)):
        for mode in ("kvc_aware", "default"):
            strategy = "kvc_aware" if mode == "kvc_aware" else "least_inflight"
            cfg = load_router_config(
                {
                    "type": mode,
                    "config": {
                        "strategies": [{"name": strategy}],
                        "model": "m",
                        "events_default": True,
                        "speculate": False,
                    },
                }
            )
            r = _native.Router(cfg.native())
            r.add_servers(ids)
            for i, sid in enumerate(ids):  # as the Go benchmark: fresh metrics on every server
                text = (
                    f'vllm:num_requests_running{{engine="0"}} {i % 9}\n'
                    'vllm:num_requests_waiting{engine="0"} 0\n'
                    'vllm:kv_cache_usage_perc{engine="0"} 0.3\n'
                    'vllm:cache_config_info{block_size="16",engine="0"} 1.0\n'
                )
                r.update_metrics(sid.encode(), text.encode(), _native.METRICS_FLAVORS["vllm"])
            tokens = [rng.randrange(1, 150_000) for _ in range(n)]
            for s in range(4):
                r.update_events(ids[s * 16].encode(), event_batch(block_stored(tokens, first_hash=1000 + s * 100000)))
            buf = array.array("i", tokens)
            keep, addr, cnt = _native.pack_tokens(buf)
            for i in range(200):
                idx, gen, sid = r.acquire(f"w{i}".encode(), addr, cnt, -1, -1)
                r.release(ids[idx].encode())
            _, gen, _ = r.acquire(b"g", addr, cnt, -1, -1)
            rids = [f"r{i}".encode() for i in range(iters)]
            sids = [s.encode() for s in ids]
            t0 = time.perf_counter_ns()
            for rid in rids:
                idx, _, _ = r.acquire(rid, addr, cnt, -1, gen)
                r.release(sids[idx])
            out[f"{mode}/{label}"] = (time.perf_counter_ns() - t0) / iters
            del keep
            r.close()
    return out


def python_msgpack_blocks_per_s(seconds: float = 1.0) -> float:
    """Baseline for event ingest: decode-only with Python msgpack, the same batch
    shape as BenchmarkDecodeApply (8 BlockStored runs of 16 blocks + 8 removals)."""
    import msgpack

    runs, blocks, bs = 8, 16, 16
    payloads = []
    for p in range(64):
        events = []
        for i in range(runs):
            hs = [(p * 1_000_000 + i * 1000 + j) | 1 << 63 for j in range(blocks)]
            toks = [p * 7 + i * 13 + j for j in range(blocks * bs)]
            events.append(["BlockStored", hs, None, toks, bs, None, "GPU"])
            events.append(["BlockRemoved", hs[:1], "GPU"])
        payloads.append(msgpack.packb([1.0, events, 0], use_bin_type=True))
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for pl in payloads:
            msgpack.unpackb(pl, raw=False)
        n += len(payloads)
    return n * runs * (blocks + 1) / (time.perf_counter() - t0)


class PlainLeastInflight:
    """A minimal pure-Python least-in-flight balancer with a sticky LRU."""

    def __init__(self, servers: Dict[str, Any], max_cache_size: int = 10000) -> None:
        self.handles = dict(servers)
        self.inflight = {s: 0 for s in servers}
        self.cache: OrderedDict[str, str] = OrderedDict()
        self.max = max_cache_size

    def acquire_server(self, request_id: str, prompt_ids: Optional[List[int]] = None) -> Tuple[str, Any]:
        sid = self.cache.get(request_id)
        if sid is not None and sid in self.inflight:
            self.cache.move_to_end(request_id)
        else:
            sid = min(self.inflight, key=self.inflight.get)
            self.cache[request_id] = sid
            if len(self.cache) > self.max:
                self.cache.popitem(last=False)
        self.inflight[sid] += 1
        return sid, self.handles[sid]

    def release_server(self, server_id: str, **kwargs: Any) -> None:
        if self.inflight.get(server_id, 0) > 0:
            self.inflight[server_id] -= 1


def bench_inprocess(iters: int) -> List[Row]:
    """acquire_server (then release) in process, 8k-token prompts: us per call."""
    from kvc_router import KVCAwareBalancer

    rng = random.Random(0)
    servers = {f"10.0.0.{i}:8000": None for i in range(8)}
    ps = shared_prefix_prompts(64, rng, PROMPT_TOKENS)
    rows = []
    for mode in (None, "kvc_aware"):
        lb = KVCAwareBalancer(
            servers,
            router_config=mode
            if mode is None
            else {"type": "kvc_aware", "config": {"strategies": [{"name": "kvc_aware"}]}},
        )
        for label, conv in (("list[int]", lambda p: p), ("array('i')", lambda p: array.array("i", p))):
            data = [conv(p) for p in ps]
            for i in range(200):  # warm up
                sid, _ = lb.acquire_server(f"w{i}", data[i % len(data)])
                lb.release_server(sid)
            t0 = time.perf_counter()
            for i in range(iters):
                lb.acquire_server(f"r{i}", data[i % len(data)])
            t1 = time.perf_counter()
            for _ in range(iters):
                lb.release_server("10.0.0.0:8000")
            rows.append((f"acquire_server, 8k tokens, {mode or 'default'}, {label}", (t1 - t0) / iters * 1e6, "us/op"))
            lb.clear_sticky_cache()
        lb.close()
    return rows


def bench_ray(seconds: float, clients: int, window: int) -> List[Row]:
    """Ray round trips per second through each balancer actor, `clients`
    client actors with `window` acquires outstanding each; starts and stops
    its own Ray."""
    from kvc_router import KVCAwareBalancer

    ray = start_ray(num_cpus=4)
    servers = {f"10.0.0.{i}:8000": None for i in range(8)}
    rng = random.Random(1)
    ps = shared_prefix_prompts(16, rng, PROMPT_TOKENS)

    @ray.remote(num_cpus=0)
    class Client:
        def __init__(self, lb, ps):
            self.lb, self.ps = lb, ps

        def run(self, seconds, window, tag):
            import ray as r

            n, pending, deadline = 0, [], time.time() + seconds
            while time.time() < deadline:
                while len(pending) < window:
                    p = self.ps[n % len(self.ps)]
                    pending.append(self.lb.acquire_server.remote(request_id=f"{tag}-{n}", prompt_ids=p))
                    n += 1
                done, pending = r.wait(pending, num_returns=1)
                for sid, _ in r.get(done):
                    self.lb.release_server.remote(server_id=sid)
            r.get(pending)
            return n

    results = {}
    for name, cls, kwargs in (
        ("plain-Python least-inflight", PlainLeastInflight, {}),
        (
            "KVCAwareBalancer kvc_aware",
            KVCAwareBalancer,
            {"router_config": {"type": "kvc_aware", "config": {"strategies": [{"name": "kvc_aware"}]}}},
        ),
        ("KVCAwareBalancer default", KVCAwareBalancer, {}),
    ):
        lb = ray.remote(cls).remote(servers=servers, max_cache_size=10000, **kwargs)
        ray.get(lb.acquire_server.remote(request_id="warm", prompt_ids=ps[0]))
        cs = [Client.remote(lb, ps) for _ in range(clients)]
        ray.get([c.run.remote(1.0, window, "w") for c in cs])  # warm-up
        t0 = time.time()
        n = sum(ray.get([c.run.remote(seconds, window, f"c{k}") for k, c in enumerate(cs)]))
        results[name] = n / (time.time() - t0)
        for a in cs + [lb]:
            ray.kill(a)
    ray.shutdown()
    base = results["plain-Python least-inflight"]
    return [(f"Ray round trips, 8k tokens: {k}", v, f"ops/s (x{v / base:.2f})") for k, v in results.items()]


def measure(
    benchtime: str = "1s",
    iters: int = 20000,
    ray_seconds: float = 3.0,
    quick: bool = False,
    no_ray: bool = False,
    log: Callable[[str], Any] = print,
) -> List[Tuple[str, str, str, str]]:
    """Every overhead figure as (measurement, value, same-run baseline, ratio);
    `quick` shortens every run (benchtime 0.2s, 3000 pairs, 1 s of Ray)."""
    if quick:
        benchtime, iters, ray_seconds = "0.2s", 3000, 1.0
    rows: List[Tuple[str, str, str, str]] = []

    log("go test -bench Acquire ./core/internal/router ...")
    rb = go_bench("./core/internal/router", "Acquire", benchtime)
    us = lambda b: rb[b]["ns/op"] / 1e3  # noqa: E731
    for size in ("8k", "32k"):
        kvc, dfl = us(f"BenchmarkAcquire{size}KVC"), us(f"BenchmarkAcquire{size}Default")
        rows.append(
            (
                f"Go core Acquire+Release, {size} prompt, kvc_aware",
                f"{kvc:.1f} us",
                f"default path {dfl:.2f} us",
                f"x{kvc / dfl:.1f}",
            )
        )

    log("C ABI (ctypes) acquire/release pairs ...")
    abi = abi_cost(iters)
    core8k = rb["BenchmarkAcquire8kKVC"]["ns/op"]
    for label in ("16", "8k"):
        v = abi[f"kvc_aware/{label}"]
        if label == "8k":
            base, ratio = f"Go core {core8k / 1e3:.1f} us", f"{(v - core8k) / 1e3:+.1f} us (x{v / core8k:.2f})"
        else:
            base, ratio = f"ctypes floor {abi['floor']:.0f} ns", f"x{v / abi['floor']:.1f}"
        rows.append((f"C ABI acquire+release pair, {label}-token prompt, kvc_aware", f"{v / 1e3:.1f} us", base, ratio))
    d8 = abi["default/8k"]
    rows.append(
        (
            "C ABI acquire+release pair, 8k-token prompt, default",
            f"{d8 / 1e3:.2f} us",
            f"ctypes floor {abi['floor']:.0f} ns",
            f"x{d8 / abi['floor']:.1f}",
        )
    )

    if not no_ray:
        log("Ray actor round trips ...")
        ray_rows = bench_ray(ray_seconds, clients=4, window=8)
        vals = {name.split(": ", 1)[1]: v for name, v, _ in ray_rows}
        base = vals["plain-Python least-inflight"]
        for k in ("KVCAwareBalancer kvc_aware", "KVCAwareBalancer default"):
            rows.append(
                (
                    f"Ray round trips/s, 8k prompt, {k}",
                    f"{vals[k]:.0f} /s",
                    f"plain-Python actor {base:.0f} /s",
                    f"x{vals[k] / base:.2f}",
                )
            )

    log("go test -bench DecodeApply ./core/internal/collector ...")
    cb = go_bench("./core/internal/collector", "DecodeApply", benchtime)
    py = python_msgpack_blocks_per_s(0.5 if quick else 1.0)
    for layout in ("array", "map"):
        bps = cb[f"BenchmarkDecodeApply/{layout}"]["blocks/s"]
        rows.append(
            (
                f"KV-event ingest (decode+index), {layout} layout",
                f"{bps / 1e6:.2f} M blocks/s",
                f"Python msgpack decode only {py / 1e6:.2f} M",
                f"x{bps / py:.1f}; {bps / ENGINE_BLOCKS_PER_S:.0f} engines/core",
            )
        )

    return rows


def format_overhead(rows: List[Tuple[str, str, str, str]]) -> str:
    """The overhead table, with the machine note under it."""
    table = report.format_rows(("measurement", "value", "baseline (same run)", "ratio"), rows, right=(1,))
    return (
        f"{table}\n(machine: {os.cpu_count()} cores; engines/core assumes one engine prefills "
        f"{ENGINE_BLOCKS_PER_S:.0f} blocks/s = 50k tokens/s)"
    )
