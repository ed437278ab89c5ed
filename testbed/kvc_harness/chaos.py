"""The long chaos run behind ``make chaos``: the fault and hostile-input test
files at scale (their sizes come from KVR_* environment variables), then the Go
event flood; each part a subprocess whose figure lines are echoed.
testbed/scripts/chaos.py is its command line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List

from kvc_harness import REPO
from kvc_harness.procs import harness_env


@dataclass
class ChaosOptions:
    cycles: int = 20  # kill/restart cycles (KVR_CHAOS_CYCLES)
    completions: int = 400  # completions with withheld event batches (KVR_CHAOS_COMPLETIONS)
    c_iters: int = 1_000_000  # random hostile C ABI calls (KVR_C_HOSTILE_ITERS)
    py_flood_blocks: int = 2_000_000  # Python push-path flood (KVR_PY_FLOOD_BLOCKS)
    flood_blocks: int = 10_000_000  # Go flood (KVR_FLOOD_BLOCKS)
    churn_acquires: int = 10_000_000  # acquires under pool churn, per mode (KVR_CHURN_ACQUIRES)
    hostile_requests: int = 20_000  # requests beside a hostile /metrics server (KVR_CHAOS_HOSTILE_REQUESTS)
    admission_requests: int = 2_000  # requests per admission fault case (KVR_CHAOS_ADMISSION_REQUESTS)
    zmq_rounds: int = 20  # connections dropped per hostile ZMQ peer kind (KVR_CHAOS_ZMQ_ROUNDS)


FIGURES = re.compile(
    r"(kill/restart cycles|replay:|no replay:|failure episodes|goroutines \d+ with|slow /metrics|ALL OK|"
    r"push flood|oversized frame|flood:|RSS .* before|acquire latency|pool churn:|hostile metrics:|retained heap|"
    r"memory after|hostile zmq peer|dead client:|actor restart:|"
    r"passed|failed|^ok|^FAIL)"
)


def run_step(title: str, cmd: List[str], env: Dict[str, str], timeout: float) -> bool:
    """Runs one part from the repository root with `env` added; prints its
    figure lines, and its output tail when it fails. Whether it passed."""
    print(f"== {title}: {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    p = subprocess.run(
        cmd, cwd=REPO, env=harness_env({**os.environ, **env}), capture_output=True, text=True, timeout=timeout
    )
    for line in (p.stdout + p.stderr).splitlines():
        if FIGURES.search(line) and "level=" not in line:
            print("   " + line.strip())
    ok = p.returncode == 0
    print(f"   -> {'OK' if ok else 'FAILED'} in {time.monotonic() - t0:.0f}s", flush=True)
    if not ok:
        print((p.stdout + p.stderr)[-6000:])
    return ok


def run_chaos(o: ChaosOptions) -> bool:
    """Every part, in order, each run even when an earlier one failed."""
    py = sys.executable
    ok = run_step(
        "faults",
        [py, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_faults.py"],
        {"KVR_CHAOS_CYCLES": str(o.cycles), "KVR_CHAOS_COMPLETIONS": str(o.completions)},
        timeout=3600,
    )
    ok &= run_step(
        "hostile input",
        [py, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_hostile.py"],
        {"KVR_C_HOSTILE_ITERS": str(o.c_iters), "KVR_PY_FLOOD_BLOCKS": str(o.py_flood_blocks), "KVR_CHAOS_MEMORY": "1"},
        timeout=3600,
    )
    ok &= run_step(
        "pool churn: acquires racing add/remove, no missing handle",
        [py, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_concurrency.py", "-k", "pool_churn"],
        {"KVR_CHURN_ACQUIRES": str(o.churn_acquires)},
        timeout=7200,
    )
    ok &= run_step(
        "hostile metrics: impossible /metrics values, no traffic to that server",
        [py, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_faults.py", "-k",
         "hostile_metrics or impossible_metrics or collector_panics"],
        {"KVR_CHAOS_HOSTILE_REQUESTS": str(o.hostile_requests)},
        timeout=3600,
    )
    ok &= run_step(
        "admission under faults: a dead client holding tickets, an actor restart, a churning pool",
        [py, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_admission_chaos.py"],
        {"KVR_CHAOS_ADMISSION_REQUESTS": str(o.admission_requests)},
        timeout=3600,
    )
    ok &= run_step(
        "hostile ZMQ peers: 2^50 header, 400 MiB frame vs 1 MiB limit, endless MORE frames, slow-loris greeting",
        [py, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_hostile_zmq.py"],
        {"KVR_CHAOS_ZMQ_ROUNDS": str(o.zmq_rounds)},
        timeout=1800,
    )
    ok &= run_step(
        "memory after giant batches (Go)",
        ["go", "test", "-count=1", "-run", "^TestMemoryReturnsAfterGiantBatches$", "-v", "./core/internal/collector"],
        {},
        timeout=600,
    )
    ok &= run_step(
        "event flood (Go push path)",
        ["go", "test", "-count=1", "-run", "^TestEventFlood$", "-v", "-timeout", "30m", "./core/internal/collector"],
        {"KVR_FLOOD_BLOCKS": str(o.flood_blocks)},
        timeout=3600,
    )
    return ok
