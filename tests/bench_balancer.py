"""Benchmarks (not collected by pytest): run `python tests/bench_balancer.py`
(this directory is then on sys.path, so kvc_harness imports as is).

1. Python-level KVCAwareBalancer.acquire_server + release_server on an
   8k-token prompt, in process (target <= 100 us per acquire).
2. Ray actor round-trip throughput with 8k-token prompts: KVCAwareBalancer
   (kvc_aware) vs a plain-Python least-in-flight balancer actor, same run
   (target ratio >= 0.8).

The benchmarks are kvc_harness.overhead.bench_inprocess / bench_ray.
"""

from __future__ import annotations

import argparse

from kvc_harness.overhead import bench_inprocess, bench_ray
from kvc_harness.report import format_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--window", type=int, default=8, help="outstanding acquires per client")
    ap.add_argument("--no-ray", action="store_true")
    a = ap.parse_args()
    rows = bench_inprocess(a.iters)
    if not a.no_ray:
        rows += bench_ray(a.seconds, a.clients, a.window)
    print(format_rows(("benchmark", "value", "unit"), [(name, f"{v:.1f}", unit) for name, v, unit in rows], right=(1,)))


if __name__ == "__main__":
    main()
