"""KV-event ports and per-replica engine settings for ``kv_events: auto``.

Each replica gets its own block of ports and ZMQ topic through verl's
``engine_kwargs[<engine>]``: for vLLM (``rollout.name: vllm``) merged last
into ``vllm serve``'s arguments; for SGLang (``rollout.name: sglang``) into
the ``ServerArgs`` verl's SGLangHttpServer builds, where ``kv_events_config``
is a JSON string, ``enable_metrics`` turns /metrics on and ``page_size``
(default 1) is set to the router's block size so a resident prompt's blocks
are the router's blocks. The balancer is then told where to subscribe and
which /metrics names to read.
"""

from __future__ import annotations

import json
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


def base_port(configured: int) -> int:
    """kv_events_base_port when set (not 0), else the environment's, else the default."""
    if configured:
        return int(configured)
    env = os.environ.get(ENV_BASE_PORT)
    return int(env) if env else DEFAULT_KV_EVENTS_BASE_PORT


def kv_events_ports(replica_rank: int, dp_size: int, base: int, servers: int = 1, server: int = 0) -> Tuple[int, int]:
    """(PUB port, replay port) of DP rank 0 of server `server` of a replica;
    the engine adds the DP rank to both. Each replica owns the block
    [base + 2*dp*servers*rank, base + 2*dp*servers*(rank+1)): one server, or
    a prefill/decode replica's 1 + N servers, each with its own ports."""
    first = base + 2 * dp_size * (replica_rank * servers + server)
    return first, first + dp_size


def pd_servers(cfg: Any) -> int:
    """Servers a replica runs: 1, or (rollout.disaggregation.enabled, verl
    0.9.x prefill/decode replicas) 1 prefill + decode_replicas decode servers,
    which share the replica's config and so would bind the same event ports."""
    d = get(cfg, "disaggregation", None)
    if d is not None and bool(get(d, "enabled", False)):
        return 1 + max(1, int(get(d, "decode_replicas", 1) or 1))
    return 1


def _events_config(engine: str, pub: int, replay: int, topic: str) -> Any:
    if engine == "sglang":
        # SGLang takes a JSON string (ServerArgs.kv_events_config) and
        # publishes whenever a publisher is named (no enable flag).
        cfg_json = {"publisher": "zmq", "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}"}
        return json.dumps({**cfg_json, "topic": topic})
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{pub}",
        "replay_endpoint": f"tcp://*:{replay}",
        "topic": topic,
    }


def server_engine_kwargs(engine_kwargs: Any, pd: dict, server: int) -> dict:
    """The engine kwargs of server `server` (1..N: the decode servers) of a
    prefill/decode replica: its own KV-event ports and topic. The prefill
    server (0) keeps the replica's, the ones the balancer subscribes to."""
    ek = dict(plain(engine_kwargs) or {})
    vk = dict(ek.get(pd["engine"]) or {})
    pub, replay = kv_events_ports(pd["rank"], pd["dp"], pd["base"], pd["servers"], server)
    vk["kv_events_config"] = _events_config(pd["engine"], pub, replay, f"{TOPIC_PREFIX}{pd['rank']}.decode-{server}")
    ek[pd["engine"]] = vk
    return ek


#: rollout.name values the hook configures, and the /metrics collector of each.
ENGINES = ("vllm", "sglang")
METRICS_COLLECTOR = {"vllm": "vllm_metrics", "sglang": "sglang_metrics"}


def configure_replica(
    replica: Any, metrics_on: bool, kv_auto: bool, base: int, engine: str = "vllm", block_size: int = 0
) -> Optional[dict]:
    """Puts this replica's settings into its ``config.engine_kwargs[engine]``
    (verl merges those last into the server's arguments)."""
    cfg = replica.config
    ek = dict(plain(cfg.engine_kwargs) or {})
    vk = dict(ek.get(engine) or {})
    spec = None
    if metrics_on:
        if engine == "sglang":
            vk["enable_metrics"] = True
        else:
            vk["disable_log_stats"] = False
    if engine == "sglang" and block_size > 0:
        if vk.get("page_size") not in (None, block_size):
            logger.warning(
                "kvc-router: engine_kwargs.sglang.page_size=%s replaced by the router's block size %d "
                "(events and queries must use one block size)",
                vk.get("page_size"),
                block_size,
            )
        vk["page_size"] = block_size
    if kv_auto:
        dp = int(get(cfg, "data_parallel_size", 1) or 1)
        rank = int(replica.replica_rank)
        servers = pd_servers(cfg)
        pub, replay = kv_events_ports(rank, dp, base, servers, 0)
        topic = f"{TOPIC_PREFIX}{rank}"
        if vk.get("kv_events_config"):
            logger.warning(
                "kvc-router: kv_events: auto replaces engine_kwargs.vllm.kv_events_config of replica %d", rank
            )
        vk["kv_events_config"] = _events_config(engine, pub, replay, topic)
        if servers > 1:
            # Read by the prefill/decode launch patch (one call per server).
            replica._kvc_pd = {"engine": engine, "rank": rank, "dp": dp, "base": base, "servers": servers, "next": 0}
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
    ek[engine] = vk
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


def _metrics_for(inner: dict, engine: str) -> dict:
    """SGLang servers serve sglang:* metrics: the strategies read them with
    the sglang_metrics collector (vllm_metrics would fail every scrape and
    mark every server unhealthy)."""
    if engine != "sglang":
        return inner

    def swap(names: Any) -> List[str]:
        return ["sglang_metrics" if n in ("vllm_metrics", "vllm_polling") else n for n in list(names or [])]

    strategies = [dict(s) for s in (inner.get("strategies") or [])] or [{"name": "kvc_aware"}]
    for s in strategies:
        s["collector_names"] = swap(s["collector_names"]) if "collector_names" in s else ["sglang_metrics"]
    inner["strategies"] = strategies
    coll = dict(inner.get("collector") or {})
    if coll.get("names"):
        coll["names"] = swap(coll["names"])
        inner["collector"] = coll
    inner["metrics_flavor"] = "sglang"
    return inner


def balancer_block(plan: dict, endpoints: Dict[str, List[dict]], engine: str = "vllm") -> dict:
    """The router config handed to the balancer: the user's, the /metrics
    collector of the servers' engine, plus the vllm_zmq collector (SGLang
    publishes the same wire format) and the endpoints when kv_events is auto."""
    from ..config import load_router_config

    inner = _metrics_for(dict(plan["config"]), engine)
    if load_router_config(plan).kv_events == "auto":
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
