"""How the balancer actor is created for verl, and the balancers of this process.

``ACTOR_OPTIONS`` is the one place for Ray actor options of the balancer the
hook creates (e.g. ``{"max_concurrency": 64}`` for a threaded balancer). Empty
means "as verl creates its own balancer": then on verl 0.9.x the class goes
through verl's ``load_balancer_cls`` hook; otherwise (options set, or verl
0.8.x without that hook) the hook creates the actor itself with these options.

:func:`balancer_class` is the one place the class is chosen: with
admission on (``admission.enabled`` true, or its default ``auto`` in
kvc_aware mode) it is the async :class:`~kvc_router.KVCAwareAdmissionBalancer`, and :func:`actor_options`
adds ``max_concurrency`` = ``ADMISSION_MAX_CONCURRENCY`` (an async actor's
default of 1,000 concurrent calls could be filled by held acquire calls when
client batching is off, and the releases that would admit them would then
queue behind them), so the hook creates that actor itself.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from typing import Any, Dict, List, Mapping

logger = logging.getLogger("kvc_router.verl")

#: Ray ``.options(...)`` for the balancer actor created through verl.
ACTOR_OPTIONS: Dict[str, Any] = {}
#: Concurrent calls of the admission balancer's async actor: held acquires
#: (one each without client batching) plus the releases that admit them.
ADMISSION_MAX_CONCURRENCY = 100_000

_lock = threading.RLock()
#: Balancer actors created in this process (reset after each weight sync).
_balancers: List[Any] = []


def admission_enabled(block: Any) -> bool:
    """Whether router-side admission runs for router config ``block`` in the
    balancer the hook creates: ``admission.enabled`` true, or its default
    ``auto`` in kvc_aware mode (the hook can create the async class that
    holds acquires)."""
    if block is None:
        return False
    from ..config import load_router_config

    return load_router_config(block, async_balancer=True).admission_enabled


def admission_cap(block: Any, max_num_seqs: Any, data_parallel_size: Any = 1) -> Any:
    """``block`` with ``admission.max_inflight`` set from the rollout config
    when admission is on and the user set no cap (neither ``max_inflight``
    nor ``load.max_num_seqs``): each server's running slots,
    ``max_num_seqs`` x ``data_parallel_size`` (engines behind one server
    address) x ``headroom``. vLLM's /metrics does not report max_num_seqs,
    so without this the cap would be the library's 256 whatever verl runs."""
    if not admission_enabled(block) or isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int):
        return block
    inner = dict(block.get("config") or {})
    adm = dict(inner.get("admission") or {})
    load = inner.get("load") or {}
    if max_num_seqs < 1 or adm.get("max_inflight") or (isinstance(load, Mapping) and load.get("max_num_seqs")):
        return block
    dp = data_parallel_size if isinstance(data_parallel_size, int) and data_parallel_size > 0 else 1
    headroom = adm.get("headroom") or 1
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or headroom <= 0:
        return block  # the library reports the bad headroom
    adm["max_inflight"] = max(1, math.ceil(max_num_seqs * dp * headroom))
    inner["admission"] = adm
    return {**block, "config": inner}


def rollout_turns(rollout_config: Any) -> str:
    """What verl's rollout config says its sessions are: ``"multi"`` when
    ``multi_turn.enable`` is on or the default agent loop is not
    ``single_turn_agent`` (tool and agent loops send turn after turn),
    else ``"single"`` (GRPO: one request per sample)."""
    from .detection import get

    mt = get(rollout_config, "multi_turn")
    if get(mt, "enable", False) is True:
        return "multi"
    loop = get(get(rollout_config, "agent"), "default_agent_loop", None)
    if isinstance(loop, str) and loop and loop != "single_turn_agent":
        return "multi"
    return "single"


def session_turns(block: Any, rollout_config: Any) -> Any:
    """``block`` with the router's ``turns`` set from the rollout config
    (:func:`rollout_turns`) and its ``response_tokens`` from
    ``rollout.response_length`` in kvc_aware mode, each unless the user set
    it: a fresh router then spreads an agent task's trajectories from the
    first request (task_spread), keeps a first GRPO step's groups whole
    when responses are shorter than prompts, splits them in two when
    responses may be up to a few times longer, and spreads them when
    responses may be far longer (group_spread's gates)."""
    if not isinstance(block, Mapping) or block.get("type") != "kvc_aware":
        return block
    from .detection import get

    inner = dict(block.get("config") or {})
    told: Dict[str, Any] = {}
    if inner.get("turns") is None:
        told["turns"] = rollout_turns(rollout_config)
    length = get(rollout_config, "response_length", None)
    if inner.get("response_tokens") is None and isinstance(length, int) and not isinstance(length, bool):
        if 0 < length <= 1 << 24:  # else the library's default (not said)
            told["response_tokens"] = length
    if not told:
        return block
    return {**block, "config": {**inner, **told}}


def actor_options(block: Any = None) -> Dict[str, Any]:
    """Ray options for the balancer actor of router config ``block``."""
    opts = dict(ACTOR_OPTIONS)
    if admission_enabled(block):
        opts.setdefault("max_concurrency", ADMISSION_MAX_CONCURRENCY)
    return opts


def balancer_class(block: Any) -> type:
    """The balancer class for router config ``block``: the async admission
    balancer when admission runs (:func:`admission_enabled`: kvc_aware's
    default), else KVCAwareBalancer."""
    if admission_enabled(block):
        from ..admission import KVCAwareAdmissionBalancer

        return KVCAwareAdmissionBalancer
    from ..balancer import KVCAwareBalancer

    return KVCAwareBalancer


def bound_balancer_class(block: dict, full_determinism: bool) -> type:
    """A subclass of :func:`balancer_class` carrying the router config, for
    verl's ``load_balancer_cls`` hook (which passes only servers and
    max_cache_size). Defined in a function, so Ray pickles it by value with
    its config."""
    from ..balancer import DEFAULT_ROUTING_CACHE_SIZE

    base: Any = balancer_class(block)

    class VerlKVCAwareBalancer(base):
        _kvc_router_config = block
        _kvc_full_determinism = bool(full_determinism)

        def __init__(
            self, servers=None, max_cache_size=DEFAULT_ROUTING_CACHE_SIZE, full_determinism=None, router_config=None
        ):
            super().__init__(
                servers,
                max_cache_size,
                self._kvc_full_determinism if full_determinism is None else full_determinism,
                self._kvc_router_config if router_config is None else router_config,
            )

    VerlKVCAwareBalancer.__qualname__ = VerlKVCAwareBalancer.__name__ = base.__name__
    return VerlKVCAwareBalancer


def create_actor(servers: Dict[str, Any], block: dict, full_determinism: bool) -> Any:
    """The balancer actor, created the way verl creates its own (unnamed,
    owned by this process) plus ``ACTOR_OPTIONS``."""
    import ray

    from ..balancer import DEFAULT_ROUTING_CACHE_SIZE

    cls: Any = ray.remote(balancer_class(block))
    opts = actor_options(block)
    if opts:
        cls = cls.options(**opts)
    return cls.remote(
        servers=servers,
        max_cache_size=DEFAULT_ROUTING_CACHE_SIZE,
        full_determinism=full_determinism,
        router_config=block,
    )


def register_balancer(handle: Any) -> None:
    with _lock:
        if handle is not None and all(h is not handle for h in _balancers):
            _balancers.append(handle)


def registered_balancers() -> List[Any]:
    with _lock:
        return list(_balancers)


async def reset_balancers(timeout: float = 10.0) -> int:
    """``reset_prefix_index()`` on every balancer of this process; returns how
    many answered. Dead actors are forgotten."""
    handles = registered_balancers()
    done = 0
    for h in handles:
        try:
            await asyncio.wait_for(asyncio.wrap_future(h.reset_prefix_index.remote().future()), timeout)
            done += 1
        except Exception as e:  # noqa: BLE001
            logger.warning("kvc-router: reset_prefix_index() failed on a balancer (%r); forgetting it", e)
            with _lock:
                _balancers[:] = [x for x in _balancers if x is not h]
    return done
