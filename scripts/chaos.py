#!/usr/bin/env python3
"""Long chaos run (`make chaos`): the fault and hostile-input tests at scale,
then the 10M-block event flood, then every figure in one summary.

  - 20 kill/restart cycles of a vllm-sim in a 3-server fleet under traffic
    (KVR_CHAOS_CYCLES), 400 completions with every 3rd KV-event batch
    withheld, with and without replay (KVR_CHAOS_COMPLETIONS);
  - 1M seeded random hostile C ABI calls from C (KVR_C_HOSTILE_ITERS), the
    hypothesis-driven Python ABI and config fuzzing, exact size limits;
  - a 2M-block flood through the Python push path (KVR_PY_FLOOD_BLOCKS) and a
    10M-block flood in Go (KVR_FLOOD_BLOCKS, core/collector TestEventFlood).

Only loopback is used; every process started is stopped by the tests'
fixtures. Exit status 1 when any part fails.

    .venv/bin/python scripts/chaos.py [--cycles 20] [--flood-blocks 10000000]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FIGURES = re.compile(
    r"(kill/restart cycles|replay:|no replay:|failure episodes|goroutines \d+ with|slow /metrics|ALL OK|"
    r"push flood|oversized frame|flood:|RSS .* before|acquire latency|passed|failed|^ok|^FAIL)"
)


def run(title: str, cmd: list, env: dict, timeout: float) -> bool:
    print(f"== {title}: {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout)
    for line in (p.stdout + p.stderr).splitlines():
        if FIGURES.search(line) and "level=" not in line:
            print("   " + line.strip())
    ok = p.returncode == 0
    print(f"   -> {'OK' if ok else 'FAILED'} in {time.monotonic() - t0:.0f}s", flush=True)
    if not ok:
        print((p.stdout + p.stderr)[-6000:])
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--completions", type=int, default=400)
    ap.add_argument("--c-iters", type=int, default=1_000_000)
    ap.add_argument("--py-flood-blocks", type=int, default=2_000_000)
    ap.add_argument("--flood-blocks", type=int, default=10_000_000)
    args = ap.parse_args()
    py = sys.executable
    ok = run(
        "faults",
        [py, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_faults.py"],
        {"KVR_CHAOS_CYCLES": str(args.cycles), "KVR_CHAOS_COMPLETIONS": str(args.completions)},
        timeout=3600,
    )
    ok &= run(
        "hostile input",
        [py, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_hostile.py"],
        {"KVR_C_HOSTILE_ITERS": str(args.c_iters), "KVR_PY_FLOOD_BLOCKS": str(args.py_flood_blocks)},
        timeout=3600,
    )
    ok &= run(
        "event flood (Go push path)",
        ["go", "test", "-count=1", "-run", "^TestEventFlood$", "-v", "-timeout", "30m", "./core/collector"],
        {"KVR_FLOOD_BLOCKS": str(args.flood_blocks)},
        timeout=3600,
    )
    print("chaos:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
