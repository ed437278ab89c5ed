"""KV-event ports and per-replica vLLM settings for ``kv_events: auto``.

Each replica gets its own block of ports and ZMQ topic through verl's
``engine_kwargs["vllm"]`` (merged last into ``vllm serve``'s arguments); the
balancer is then told where to subscribe.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Optional, Tuple

from .detection import get, plain

logger = logging.getLogger("kvc_router.verl")

ENV_BASE_PORT = "KVC_ROUTER_KV_EVENTS_BASE_PORT"
DEFAULT_KV_EVENTS_BASE_PORT = 30000
TOPIC_PREFIX = "kvc-router.replica-"

_warned: set = set()


def warn_once(key: str, msg: str, *args: Any) -> None:
    if key in _warned:
        return
    _warned.add(key)
    logger.warning(msg, *args)


def base_port(inner: dict) -> int:
    if inner.get("kv_events_base_port"):
        return int(inner["kv_events_base_port"])
    env = os.environ.get(ENV_BASE_PORT)
    return int(env) if env else DEFAULT_KV_EVENTS_BASE_PORT


def kv_events_ports(replica_rank: int, dp_size: int, base: int) -> Tuple[int, int]:
    """(PUB port, replay port) of DP rank 0 of a replica; vLLM adds the DP rank
    to both. Each replica owns the block [base + 2*dp*rank, base + 2*dp*(rank+1))."""
    first = base + 2 * dp_size * replica_rank
    return first, first + dp_size


def configure_replica(replica: Any, metrics_on: bool, kv_auto: bool, base: int) -> Optional[dict]:
    """Puts this replica's settings into its ``config.engine_kwargs["vllm"]``
    (verl merges those last into the ``vllm serve`` arguments)."""
    cfg = replica.config
    ek = dict(plain(cfg.engine_kwargs) or {})
    vk = dict(ek.get("vllm") or {})
    spec = None
    if metrics_on:
        vk["disable_log_stats"] = False
    if kv_auto:
        dp = int(get(cfg, "data_parallel_size", 1) or 1)
        rank = int(replica.replica_rank)
        pub, replay = kv_events_ports(rank, dp, base)
        topic = f"{TOPIC_PREFIX}{rank}"
        if vk.get("kv_events_config"):
            logger.warning(
                "kvc-router: kv_events: auto replaces engine_kwargs.vllm.kv_events_config of replica %d", rank
            )
        vk["kv_events_config"] = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{pub}",
            "replay_endpoint": f"tcp://*:{replay}",
            "topic": topic,
        }
        nnodes = int(getattr(replica, "nnodes", 1) or 1)
        local = dp
        if nnodes > 1:
            tp = int(get(cfg, "tensor_model_parallel_size", 1) or 1)
            local = max(1, int(getattr(replica, "gpus_per_replica_node", tp)) // tp)
            warn_once(
                "multinode",
                "kvc-router: replica spans %d nodes; only the %d DP ranks on its first node are subscribed",
                nnodes,
                local,
            )
        spec = {"pub": pub, "replay": replay, "ranks": min(dp, local), "topic": topic}
    ek["vllm"] = vk
    cfg.engine_kwargs = ek  # a mutable field of verl's RolloutConfig
    return spec


def _host_of(server_id: str) -> str:
    if server_id.startswith("["):
        return server_id[1 : server_id.index("]")]
    return server_id.rsplit(":", 1)[0]


def endpoints_for(manager: Any) -> Dict[str, List[dict]]:
    """server id -> KV-event endpoints, from the ports given to each replica."""
    events = getattr(manager, "_kvc_events", None) or {}
    out: Dict[str, List[dict]] = {}
    for replica, sid in zip(getattr(manager, "rollout_replicas", []) or [], manager.server_addresses):
        spec = events.get(getattr(replica, "replica_rank", None))
        if not spec or not sid:
            continue
        host = _host_of(sid)
        h = f"[{host}]" if ":" in host else host
        out[sid] = [
            {
                "endpoint": f"tcp://{h}:{spec['pub'] + k}",
                "replay": f"tcp://{h}:{spec['replay'] + k}",
                "topic": spec["topic"],
            }
            for k in range(spec["ranks"])
        ]
    return out


def balancer_block(plan: dict, endpoints: Dict[str, List[dict]]) -> dict:
    """The router config handed to the balancer: the user's, plus the
    vllm_zmq collector and the endpoints when kv_events is auto."""
    inner = dict(plan["config"])
    if inner.get("kv_events") == "auto":
        coll = dict(inner.get("collector") or {})
        names = list(coll.get("names") or [])
        if "vllm_zmq" not in names:
            names.append("vllm_zmq")
        coll["names"] = names
        eps = dict(coll.get("endpoints") or {})
        for sid, lst in endpoints.items():
            eps.setdefault(sid, lst)
        coll["endpoints"] = eps
        inner["collector"] = coll
    return {"type": "kvc_aware", "config": inner}
