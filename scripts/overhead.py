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
   least-in-flight actor, 8k-token prompts.
4. KV-event ingest: ``go test -bench DecodeApply`` in core/collector (msgpack
   decode + index update), against decoding the same batches with Python's
   msgpack, and as engines one core keeps up with.

Run from the repository root with ``make overhead`` (PYTHONPATH=tests); needs
Go, the .venv and python/kvc_router/libkvcrouter.so. The measurements are
kvc_harness.overhead.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

try:
    from kvc_harness.overhead import format_overhead, measure
except ModuleNotFoundError as e:
    if e.name != "kvc_harness":
        raise
    sys.exit("kvc_harness not found: run with PYTHONPATH=tests (as `make overhead` does)")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--benchtime", default="1s", help="go test -benchtime (default 1s)")
    ap.add_argument("--iters", type=int, default=20000, help="C ABI pairs per case")
    ap.add_argument("--ray-seconds", type=float, default=3.0, help="seconds per Ray balancer (default 3)")
    ap.add_argument("--quick", action="store_true", help="short runs (benchtime 0.2s, 3000 pairs, 1 s Ray)")
    ap.add_argument("--no-ray", action="store_true")
    a = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    rows = measure(a.benchtime, a.iters, a.ray_seconds, quick=a.quick, no_ray=a.no_ray, log=log)
    print(format_overhead(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
