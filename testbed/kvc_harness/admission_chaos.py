"""Helpers of the admission chaos cases (tests/test_admission_chaos.py) that
Ray workers run, so they live in an importable module."""

from __future__ import annotations

import os
from typing import Any, List


def hold_and_die(lb: Any, n: int, base: int) -> None:
    """A client that submits ``n`` acquires through ``route_batch`` while the
    pool is full, gets their Held tickets, and dies without asking for them
    (the process exits: nothing is cancelled or released)."""
    import ray

    prompts: List[Any] = [[base + 1000 * i + t for t in range(64)] for i in range(n)]
    got = ray.get(lb.route_batch.remote([], [(f"dead-{base}-{i}", p) for i, p in enumerate(prompts)]))
    held = sum(1 for g in got if type(g).__name__ == "Held")
    print(f"dead client holds {held} tickets", flush=True)
    os._exit(1)


def pid() -> int:
    return os.getpid()
