"""Helpers of tests/vllm (imported by the test modules as ``vllm_lib``)."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence


def balancer(engines: Sequence[Any], collectors: Sequence[str] = ("vllm_metrics", "vllm_zmq"), **extra: Any) -> Any:
    """An in-process KVCAwareBalancer (the class verl wraps in ray.remote)
    over the engines, with the given live collectors."""
    from kvc_harness.balancer import kvc_config
    from kvc_router import KVCAwareBalancer

    endpoints = {e.sid: [{"endpoint": e.endpoint, "replay": e.replay, "topic": e.topic}] for e in engines}
    cfg = kvc_config(endpoints=endpoints, collectors=collectors, interval_ms=100, timeout_ms=2000, **extra)
    cfg["config"]["model"] = "tiny"
    return KVCAwareBalancer(servers={e.sid: None for e in engines}, router_config=cfg)


def wait_until(pred: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def index_blocks(lb: Any, sid: str) -> int:
    from kvc_harness.balancer import index_server

    return int(index_server(lb.get_status(), sid).get("entries", 0) or 0)


def predicted_tokens(detail: Dict[str, Any]) -> int:
    return sum(detail["hit_blocks"]) * detail["block_size"]


def prompt(seed: int, n: int, base: int = 100) -> List[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(base, 30000) for _ in range(n)]


def served(usage: Optional[Dict[str, Any]]) -> int:
    from kvc_harness.client import cached_tokens

    return cached_tokens(usage or {})


def settle(lb: Any, sid: str, quiet: float = 1.0, timeout: float = 60.0) -> None:
    """Until the server's event subscription has seen no new batch for
    `quiet` seconds (the engine publishes a step's events when the step
    ends; a request that stores no new block publishes none)."""
    from kvc_harness.balancer import publisher_status

    deadline = time.monotonic() + timeout
    last = publisher_status(lb.get_status(), sid).get("last_seq")
    still = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        cur = publisher_status(lb.get_status(), sid).get("last_seq")
        if cur != last:
            last, still = cur, time.monotonic()
        elif time.monotonic() - still >= quiet:
            return
    raise AssertionError(f"events of {sid} did not settle in {timeout:.0f}s")
