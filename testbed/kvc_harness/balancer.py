"""Balancer configs the tests and runs build, and readers of the balancer's
``get_status()`` document (router servers, collectors, index)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

if TYPE_CHECKING:
    from kvc_harness.fleet import Server

# kvc_aware with no live collectors: routing from pushed metrics/events only.
KVC_NO_COLLECTORS: Dict[str, Any] = {
    "type": "kvc_aware",
    "config": {"strategies": [{"_target_": "kvc_router.config.KVCAwareStrategyConfig"}]},
}


def kvc_config(
    endpoints: Optional[Dict[str, List[Dict[str, str]]]] = None,
    urls: Optional[Dict[str, str]] = None,
    interval_ms: int = 50,
    timeout_ms: int = 200,
    collectors: Sequence[str] = ("vllm_metrics", "vllm_zmq"),
    log_level: str = "info",
    **extra: Any,
) -> Dict[str, Any]:
    """A kvc_aware balancer config with live collectors tuned for tests."""
    collector: Dict[str, Any] = {
        "interval_ms": interval_ms,
        "timeout_ms": timeout_ms,
        "backoff_max_ms": 4 * interval_ms,
        "idle_redial_ms": 300,
        "retry_ms": 100,
        "replay_timeout_ms": 1000,
        "use_handle_endpoints": False,
    }
    if endpoints:
        collector["endpoints"] = endpoints
    if urls:
        collector["urls"] = urls
    collector.update(extra.pop("collector", {}))
    cfg: Dict[str, Any] = {
        "strategies": [{"_target_": "kvc_router.config.KVCAwareStrategyConfig", "collector_names": list(collectors)}],
        "log_level": log_level,
        "model": "sim/llama-8b",
        "collector": collector,
    }
    cfg.update(extra)
    return {"type": "kvc_aware", "config": cfg}


def server_status(status: Dict[str, Any], sid: str) -> Dict[str, Any]:
    """The router's entry for one server; KeyError when absent."""
    for s in status["router"]["servers"]:
        if s["id"] == sid:
            return s
    raise KeyError(sid)


def subscriptions(status: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The balancer's KV-event subscriptions ([] without any, or in default mode)."""
    return (((status.get("router") or {}).get("collectors") or {}).get("collectors") or {}).get("vllm_zmq") or []


def publisher_status(status: Dict[str, Any], sid: str) -> Dict[str, Any]:
    """The KV-event subscription of one server ({} when none)."""
    for p in subscriptions(status):
        if p["server"] == sid:
            return p
    return {}


def index_server(status: Dict[str, Any], sid: str) -> Dict[str, Any]:
    """The prefix index's figures for one server ({} when none)."""
    for s in status["router"]["index"]["servers"] or []:
        if s["name"] == sid:
            return s
    return {}


def poller_target(status: Dict[str, Any], sid: str) -> Dict[str, Any]:
    """The /metrics poller's target for one server ({} when none)."""
    for t in status["router"]["collectors"]["collectors"].get("vllm_metrics") or []:
        if t["server"] == sid:
            return t
    return {}


def router_config(
    policy: str, servers: Sequence[Server], interval_ms: int = 100, max_num_seqs: int = 0
) -> Optional[Dict[str, Any]]:
    """None is verl's behaviour; kvc_aware gets the metrics poller and, where the
    servers publish them, the KV-event subscriber. Router-side admission is
    set off here, so a "kvc_aware" row is the routing alone whichever class
    runs it (verl's hook runs admission at kvc_aware's defaults,
    ``admission.enabled: auto``); the ``+admit`` rows turn it on."""
    if policy == "default":
        return None
    collectors = ["vllm_metrics"]
    endpoints: Dict[str, List[Dict[str, str]]] = {}
    for s in servers:
        if s.events:
            endpoints[s.sid] = [
                {"endpoint": e, **({"replay": s.replay[i]} if i < len(s.replay) else {}), "topic": s.topic}
                for i, e in enumerate(s.events)
            ]
    if endpoints:
        collectors.append("vllm_zmq")
    cfg: Dict[str, Any] = {
        "type": "kvc_aware",
        "config": {
            "strategies": [{"_target_": "kvc_router.config.KVCAwareStrategyConfig", "collector_names": collectors}],
            "sticky_max_size": 10000,
            "collector": {"interval_ms": interval_ms, "timeout_ms": 1000, "endpoints": endpoints},
            "admission": {"enabled": False},
        },
    }
    if max_num_seqs:
        # The servers' running-set capacity (vLLM's --max-num-seqs; /metrics does not report it).
        cfg["config"]["load"] = {"max_num_seqs": max_num_seqs}
    return cfg


def wait_collectors(ray: Any, lb: Any, timeout: float = 15.0) -> bool:
    """Waits until every server has been scraped once (and its event
    subscription is up), so the first step is not routed blind. `lb` is a
    balancer actor. Returns whether that happened within timeout (a run goes
    on either way; the summary shows what the router saw)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = ray.get(lb.get_status.remote())["router"]
        if all(s["load"]["has_metrics"] for s in st["servers"]):
            return True
        time.sleep(0.1)
    return False


def router_summary(status: dict) -> dict:
    """The router-side figures a run reports: mode, counters, KV-event blocks
    applied, subscriptions, scrapes, the admission queue."""
    r = status.get("router") or {}
    cols = (r.get("collectors") or {}).get("collectors") or {}
    subs = subscriptions(status)
    stored = sum((s.get("events") or {}).get("stored_blocks", 0) for s in subs)
    return {
        "mode": r.get("mode"),
        "counters": r.get("counters"),
        "event_stored_blocks": stored,
        "event_subscriptions": len(subs),
        "scrapes": sum(t.get("scrapes", 0) for t in cols.get("vllm_metrics") or []),
        "admission": r.get("admission"),
        # What the router learnt of response lengths (None with lengths off).
        "lengths": r.get("lengths"),
    }
