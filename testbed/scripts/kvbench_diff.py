#!/usr/bin/env python3
"""Compare two kvbench --json outputs for routing changes.

A refactor must leave every routing outcome of a fixed-seed run unchanged
(placements, hit rates, step times on the simulated clock, TTFTs). The only
fields allowed to differ are the router's own decision times, which kvbench
measures on the host's wall clock. Exit 0 when the runs agree, 1 otherwise
(with the first differing paths).

  go build -o /tmp/kvbench-before ./cmd/kvbench   # at the old commit
  go build -o /tmp/kvbench-after ./cmd/kvbench    # at the new commit
  /tmp/kvbench-before --workload grpo --seed 7 --quiet --json before.json
  /tmp/kvbench-after  --workload grpo --seed 7 --quiet --json after.json
  python3 testbed/scripts/kvbench_diff.py before.json after.json
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Iterator, Tuple

# Host wall-clock measurements: they vary run to run whatever the code does.
WALL_CLOCK_KEYS = ("decision_p50_us", "decision_p99_us", "decision_mean_us", "wall_s")


def diffs(a: Any, b: Any, path: str = "") -> Iterator[Tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in WALL_CLOCK_KEYS:
                continue
            if k not in a or k not in b:
                yield f"{path}/{k}", a.get(k, "<missing>"), b.get(k, "<missing>")
            else:
                yield from diffs(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{path}[len]", len(a), len(b)
        for i, (x, y) in enumerate(zip(a, b)):
            yield from diffs(x, y, f"{path}[{i}]")
    elif a != b:
        yield path, a, b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    args = ap.parse_args()
    with open(args.before, encoding="utf-8") as f:
        a = json.load(f)
    with open(args.after, encoding="utf-8") as f:
        b = json.load(f)
    found = list(diffs(a, b))
    for p, x, y in found[:20]:
        print(f"{p}: {x!r} -> {y!r}")
    print(f"{len(found)} routing differences (ignoring {', '.join(WALL_CLOCK_KEYS)})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
