#!/usr/bin/env python3
"""What routing costs, in one table, each figure next to a baseline measured
in the same run:

1. Go core decision time: ``go test -bench Acquire`` in core/router (64
   event-fed servers, the prompt cached on 4 of them); kvc_aware against the
   default least-in-flight path.
2. C ABI call cost: one acquire + release pair through ``kvc_router._native``
   (ctypes), 16-token and 8k-token prompts, against the Go core's own Acquire
   and against the cheapest ctypes call into the library (``kvr_abi_version``).
3. Ray actor round trip: ``ray.remote(KVCAwareBalancer)`` against a plain-Python
   least-in-flight actor (tests/bench_balancer.py), 8k-token prompts.
4. KV-event ingest: ``go test -bench DecodeApply`` in core/collector (msgpack
   decode + index update), against decoding the same batches with Python's
   msgpack, and as engines one core keeps up with.

Run from the repository root (``make overhead``); needs Go, the .venv and
python/kvc_router/libkvcrouter.so (``make test-py`` or the Makefile's $(PYLIB)).
"""

from __future__ import annotations

import argparse
import array
import os
import random
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# One saturated engine's prefill (8B model on an H100, the simulator's
# default profile: ~50k tokens/s) in 16-token blocks per second.
ENGINE_BLOCKS_PER_S = 50_000 / 16

_BENCH = re.compile(r"^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$")


def go_bench(pkg: str, pattern: str, benchtime: str) -> dict:
    """Runs one package's benchmarks; returns {name: {unit: value}}."""
    cmd = ["go", "test", "-run", "^$", "-bench", pattern, "-benchtime", benchtime, "-count", "1", pkg]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    res = {}
    for line in out.stdout.splitlines():
        m = _BENCH.match(line.strip())
        if not m:
            continue
        fields = m.group(3).split()
        vals = {}
        for i in range(0, len(fields) - 1, 2):
            try:
                vals[fields[i + 1]] = float(fields[i])
            except ValueError:
                pass
        res[m.group(1)] = vals
    return res


# ---------------------------------------------------------------------------
# C ABI


def _event_batch(tokens, first_hash, block_size=16):
    import msgpack

    n = len(tokens) // block_size
    stored = [
        "BlockStored",
        list(range(first_hash, first_hash + n)),
        None,
        list(tokens[: n * block_size]),
        block_size,
        None,
        "GPU",
    ]
    return msgpack.packb([time.time(), [stored], 0], use_bin_type=True)


def abi_cost(iters: int) -> dict:
    """ns per acquire+release pair through ctypes, as the Go benchmark's setup."""
    sys.path.insert(0, os.path.join(REPO, "python"))
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
                r.update_events(ids[s * 16].encode(), _event_batch(tokens, 1000 + s * 100000))
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


# ---------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--benchtime", default="1s", help="go test -benchtime (default 1s)")
    ap.add_argument("--iters", type=int, default=20000, help="C ABI pairs per case")
    ap.add_argument("--ray-seconds", type=float, default=3.0, help="seconds per Ray balancer (default 3)")
    ap.add_argument("--quick", action="store_true", help="short runs (benchtime 0.2s, 3000 pairs, 1 s Ray)")
    ap.add_argument("--no-ray", action="store_true")
    a = ap.parse_args(argv)
    if a.quick:
        a.benchtime, a.iters, a.ray_seconds = "0.2s", 3000, 1.0
    rows = []  # (measurement, value, baseline, ratio)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    log("go test -bench Acquire ./core/router ...")
    rb = go_bench("./core/router", "Acquire", a.benchtime)
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
    abi = abi_cost(a.iters)
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

    if not a.no_ray:
        log("Ray actor round trips (tests/bench_balancer.py) ...")
        sys.path.insert(0, os.path.join(REPO, "tests"))
        tests = os.path.join(REPO, "tests")
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [tests] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        os.environ.setdefault("RAY_ADDRESS", "local")  # a private cluster, never someone else's
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        import bench_balancer

        ray_rows = bench_balancer.bench_ray(a.ray_seconds, clients=4, window=8)
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

    log("go test -bench DecodeApply ./core/collector ...")
    cb = go_bench("./core/collector", "DecodeApply", a.benchtime)
    py = python_msgpack_blocks_per_s(0.5 if a.quick else 1.0)
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

    w = [max(len(r[i]) for r in rows + [("measurement", "value", "baseline (same run)", "ratio")]) for i in range(4)]
    head = ("measurement", "value", "baseline (same run)", "ratio")
    print(f"{head[0]:<{w[0]}}  {head[1]:>{w[1]}}  {head[2]:<{w[2]}}  {head[3]}")
    print("-" * (sum(w) + 6))
    for r in rows:
        print(f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:<{w[2]}}  {r[3]}")
    print(
        f"(machine: {os.cpu_count()} cores; engines/core assumes one engine prefills "
        f"{ENGINE_BLOCKS_PER_S:.0f} blocks/s = 50k tokens/s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
