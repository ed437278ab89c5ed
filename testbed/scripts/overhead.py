#!/usr/bin/env python3
"""`make overhead`: what routing costs, in one table, each figure next to a
baseline measured in the same run (what is measured: kvc_harness.overhead).
Run from the repository root with ``make overhead`` (PYTHONPATH=testbed); needs
Go, the .venv and python/kvc_router/libkvcrouter.so."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

try:
    from kvc_harness import overhead
    from kvc_harness.overhead import format_overhead, measure
except ModuleNotFoundError as e:
    if e.name != "kvc_harness":
        raise
    sys.exit("kvc_harness not found: run with PYTHONPATH=testbed (as `make overhead` does)")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description=f"{__doc__}\n\n{overhead.__doc__}", formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
