#!/usr/bin/env python3
"""Does the Python copy of the server pool pay? (docs/performance.md, "The pool has one copy")

acquire_server + release_server in process, 8 servers, through the balancer's
two paths: with its copy of the pool (``_view``: it passes the pool generation
it knows, and the library answers with the server's index into that copy) and
without (generation -1: the library returns the server id string on every
call, which Python decodes and frees). Thread CPU per pair, best of ROUNDS
rounds, the two paths interleaved. Run from the repository root:

  PYTHONPATH=python:testbed .venv/bin/python testbed/scripts/mirror_bench.py
"""

from __future__ import annotations

import array
import random
import time

from kvc_harness.workloads import shared_prefix_prompts
from kvc_router import KVCAwareBalancer

ROUNDS, N = 9, 2000


def main() -> None:
    servers = {f"10.0.0.{i}:8000": None for i in range(8)}
    kvc = {"type": "kvc_aware", "config": {"strategies": [{"name": "kvc_aware"}]}}
    rows = []
    for mode, ntok in (("default", 16), ("kvc_aware", 16), ("kvc_aware", 8192)):
        lb = KVCAwareBalancer(dict(servers), router_config=None if mode == "default" else kvc)
        prompts = [array.array("i", p[:ntok]) for p in shared_prefix_prompts(64, random.Random(0), max(ntok, 64))]
        with_copy = lb._view
        without = (with_copy[0], with_copy[1], -1)
        best = {"copy": 1e9, "none": 1e9}
        for i in range(500):
            lb.release_server(lb.acquire_server(f"w{i}", prompts[i % 64])[0])
        for r in range(ROUNDS):
            for label, view in (("copy", with_copy), ("none", without)):
                lb._view = view
                c0 = time.thread_time()
                for i in range(N):
                    lb.release_server(lb.acquire_server(f"r{r}{label}{i}", prompts[i % 64])[0])
                best[label] = min(best[label], (time.thread_time() - c0) / N * 1e6)
        lb._view = with_copy
        lb.close()
        rows.append((mode, ntok, best["copy"], best["none"]))
    print("| mode | prompt tokens | with the copy (µs) | without (µs) | the copy saves |")
    print("|---|---|---|---|---|")
    for mode, ntok, a, b in rows:
        print(f"| {mode} | {ntok} | {a:.2f} | {b:.2f} | {b - a:.2f} µs ({(b - a) / b * 100:.0f}%) |")


if __name__ == "__main__":
    main()
