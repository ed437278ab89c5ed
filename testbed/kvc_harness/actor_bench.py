"""Balancer actor throughput: acquire/release pairs per second through a Ray
actor, driven by N concurrent async callers through verl's own client code
(``LLMServerClient._acquire_server`` awaited, then its fire-and-forget
``_release_server``), for KVCAwareBalancer and for verl's own
GlobalRequestLoadBalancer in the same run.

The client code is verl's as the kvc-router hook leaves it: with verl's
balancer it runs unchanged (one actor call per acquire and per release);
with ours the hook batches the calls of one event loop
(:mod:`kvc_router.batching`). ``kvc_unbatched`` turns batching off
(``KVC_ROUTER_CLIENT_BATCHING=0`` in the client processes) to show what the
batching is worth.

Run from an interpreter where both verl and kvc_router import, with the
kvc-router verl hook installed (see testbed/scripts/actor_bench.py). The callers live
in client actors (verl's agent-loop workers), not in the driver.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

VERL_CLASS = "verl.workers.rollout.router.GlobalRequestLoadBalancer"


@dataclass(frozen=True)
class Variant:
    """One balancer actor set-up: the class (dotted path), how Ray creates it
    (``actor_options`` passed to ``ray.remote``) and its constructor kwargs."""

    name: str
    cls_path: str
    actor_options: Dict[str, Any] = field(default_factory=dict)
    kwargs: Dict[str, Any] = field(default_factory=dict)
    #: environment of the client processes (e.g. batching off)
    client_env: Dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchConfig:
    callers: Tuple[int, ...] = (8, 32, 128)
    seconds: float = 3.0
    warmup_seconds: float = 1.0
    rounds: int = 2
    servers: int = 8
    prompt_tokens: int = 2048
    client_actors: int = 2
    num_cpus: int = 4


def kvc_config() -> Dict[str, Any]:
    """kvc_aware routing with no collectors (the servers are not real)."""
    return {"type": "kvc_aware", "config": {"strategies": [{"name": "kvc_aware", "collector_names": []}]}}


def default_variants() -> List[Variant]:
    kvc = {"router_config": kvc_config()}
    return [
        Variant("verl", VERL_CLASS),
        Variant("verl_prompt", VERL_WITH_PROMPT),
        Variant("verl_batched", VERL_BATCHED),
        Variant("kvc", "kvc_router.KVCAwareBalancer", {}, kvc),
        Variant("kvc_unbatched", "kvc_router.KVCAwareBalancer", {}, kvc, {"KVC_ROUTER_CLIENT_BATCHING": "0"}),
    ]


def extra_variants() -> List[Variant]:
    """Measured earlier and not shipped (docs/performance.md): an async actor
    and a threaded one, both without client batching."""
    kvc = {"router_config": kvc_config()}
    off = {"KVC_ROUTER_CLIENT_BATCHING": "0"}
    return [
        Variant("kvc_async", KVC_ASYNC, {}, kvc, off),
        Variant("kvc_threaded", "kvc_router.KVCAwareBalancer", {"max_concurrency": 8}, kvc, off),
    ]


def metrics_variants() -> List[Variant]:
    """The Ray metrics exporter's cost (kvc_router.metrics): the shipped
    variant (exporter on, 5 s period) against the exporter off and at a
    10x shorter period."""
    def cfg(**metrics: Any) -> Dict[str, Any]:
        c = kvc_config()
        return {"router_config": {"type": c["type"], "config": {**c["config"], "metrics": metrics}}}

    return [
        Variant("kvc_metrics_off", "kvc_router.KVCAwareBalancer", {}, cfg(enabled=False)),
        Variant("kvc", "kvc_router.KVCAwareBalancer", {}, {"router_config": kvc_config()}),
        Variant("kvc_metrics_0.5s", "kvc_router.KVCAwareBalancer", {}, cfg(enabled=True, period_s=0.5)),
    ]


def grpo_prompts(n_groups: int, group: int, tokens: int, seed: int = 0) -> List[List[int]]:
    """GRPO-like prompts: groups share all but their last 1/8."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n_groups):
        base = [rng.randrange(1, 150_000) for _ in range(tokens)]
        for _ in range(group):
            p = list(base)
            tail = max(1, tokens // 8)
            p[-tail:] = [rng.randrange(1, 150_000) for _ in range(tail)]
            out.append(p)
    return out


def _import(path: str) -> Any:
    import importlib

    if path == VERL_WITH_PROMPT:
        return _verl_with_prompt()
    if path == KVC_ASYNC:
        return _kvc_async()
    if path == VERL_BATCHED:
        return _verl_batched()
    mod, _, name = path.rpartition(".")
    return getattr(importlib.import_module(mod), name)


VERL_WITH_PROMPT = "verl+prompt"
KVC_ASYNC = "kvc+async"
VERL_BATCHED = "verl+batch"


def _verl_batched() -> Any:
    """verl's balancer given our ``route_batch``, so the same batching client
    batches to it: the control that separates what batching is worth from
    what our balancer costs or saves. Not something verl ships."""
    base = _import(VERL_CLASS)

    class VerlBatched(base):  # type: ignore[misc, valid-type]
        def route_batch(self, releases: List[str], acquires: List[Tuple[str, Any]]) -> List[Any]:
            for sid in releases:
                base.release_server(self, sid)
            out: List[Any] = []
            for rid, _ in acquires:
                try:
                    out.append(base.acquire_server(self, rid))
                except Exception as e:  # noqa: BLE001
                    out.append(e)
            return out

    return VerlBatched


def _kvc_async() -> Any:
    """KVCAwareBalancer with async hot-path methods, which makes Ray create
    an async actor (calls run on one event loop, concurrency 1000) from a
    plain ``ray.remote(cls)``. Measured, not shipped: it was slower than the
    sync actor on the 2-core test machine (docs/performance.md)."""
    from kvc_router import KVCAwareBalancer

    class AsyncKVCAwareBalancer(KVCAwareBalancer):
        async def acquire_server(self, request_id: str, prompt_ids: Any = None) -> Any:  # type: ignore[override]
            return KVCAwareBalancer.acquire_server(self, request_id, prompt_ids)

        async def release_server(  # type: ignore[override]
            self, server_id: str, request_id: Optional[str] = None, **kwargs: Any
        ) -> None:
            KVCAwareBalancer.release_server(self, server_id, request_id, **kwargs)

    return AsyncKVCAwareBalancer


def _verl_with_prompt() -> Any:
    """verl's balancer made to receive the prompt as ours does (and ignore
    it): the control that separates the cost of the payload from the cost
    of our routing."""
    base = _import(VERL_CLASS)

    class VerlWithPrompt(base):  # type: ignore[misc, valid-type]
        def require_acquire_fields(self) -> List[str]:
            return ["prompt_ids"]

        def acquire_server(self, request_id: str, prompt_ids: Any = None) -> Any:
            return base.acquire_server(self, request_id)

    return VerlWithPrompt


class _Client:
    """A verl agent-loop worker: `callers` coroutines generating through one
    real ``verl.workers.rollout.llm_server.LLMServerClient``."""

    def __init__(self, lb: Any, prompts: List[List[int]], env: Optional[Dict[str, str]] = None) -> None:
        import os

        os.environ.update(env or {})
        import _kvc_router_verl_boot  # noqa: F401 - the hook (the .pth has usually imported it already)
        from verl.workers.rollout.llm_server import LLMServerClient

        self.client = LLMServerClient(config=None, load_balancer_handle=lb)
        self.prompts = prompts

    def hooked(self) -> bool:
        """True if the kvc-router hook patched the client's acquire path."""
        from verl.workers.rollout.llm_server import LLMServerClient

        return bool(getattr(LLMServerClient._acquire_server, "_kvc_router_patched", False))

    async def run(self, callers: int, seconds: float, tag: str) -> int:
        import asyncio

        client = self.client
        deadline = time.monotonic() + seconds
        counts = [0] * callers

        async def caller(c: int) -> None:
            k = 0
            while time.monotonic() < deadline:
                prompt = self.prompts[(c * 7 + k) % len(self.prompts)]
                sid, _ = await client._acquire_server(f"{tag}-{c}-{k}", prompt_ids=prompt, sampling_params={})
                client._release_server(sid, request_id=f"{tag}-{c}-{k}")  # fire-and-forget, as verl does
                k += 1
            counts[c] = k

        await asyncio.gather(*(caller(c) for c in range(callers)))
        return sum(counts)


def _drain(ray: Any, lb: Any, timeout: float = 60.0) -> None:
    """Waits until every fire-and-forget release has been applied."""
    end = time.monotonic() + timeout
    while ray.get(lb.get_total_inflight.remote()) != 0:
        if time.monotonic() > end:
            raise RuntimeError("releases did not drain")
        time.sleep(0.005)


def measure(ray: Any, lb: Any, clients: Sequence[Any], callers: int, cfg: BenchConfig, tag: str) -> float:
    """Pairs per second with `callers` concurrent callers spread over clients."""
    per = [callers // len(clients) + (1 if i < callers % len(clients) else 0) for i in range(len(clients))]
    ray.get([c.run.remote(n, cfg.warmup_seconds, f"w{tag}{i}") for i, (c, n) in enumerate(zip(clients, per)) if n])
    _drain(ray, lb)
    t0 = time.monotonic()
    done = sum(ray.get([c.run.remote(n, cfg.seconds, f"{tag}{i}") for i, (c, n) in enumerate(zip(clients, per)) if n]))
    _drain(ray, lb)
    return done / (time.monotonic() - t0)


def run(
    ray: Any,
    cfg: BenchConfig,
    variants: Optional[List[Variant]] = None,
    log=print,
    every: Optional[Dict[str, Dict[int, List[float]]]] = None,
) -> Dict[str, Dict[int, float]]:
    """Returns {variant: {callers: pairs/s}}: the best of cfg.rounds rounds,
    variants interleaved within each round so machine noise hits all alike.
    ``every`` (if given) receives each round's figure."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    variants = variants or default_variants()
    servers = {f"10.0.0.{i}:8000": None for i in range(cfg.servers)}
    prompts = grpo_prompts(4, 16, cfg.prompt_tokens)
    Client = ray.remote(num_cpus=0)(_Client)
    actors = []
    try:
        setups = []
        for v in variants:
            cls = _import(v.cls_path)
            actor_cls = ray.remote(**v.actor_options)(cls) if v.actor_options else ray.remote(cls)
            lb = actor_cls.remote(servers=servers, **v.kwargs)
            actors.append(lb)
            ray.get(lb.get_total_inflight.remote())  # constructed
            cs = [Client.remote(lb, prompts, v.client_env) for _ in range(cfg.client_actors)]
            actors += cs
            if not all(ray.get([c.hooked.remote() for c in cs])):
                raise RuntimeError("the kvc-router verl hook did not patch LLMServerClient in the client actors")
            setups.append((v, lb, cs))
        out: Dict[str, Dict[int, float]] = {v.name: {} for v in variants}
        for rnd in range(cfg.rounds):
            for n in cfg.callers:
                for v, lb, cs in setups:
                    r = measure(ray, lb, cs, n, cfg, f"r{rnd}n{n}")
                    out[v.name][n] = max(out[v.name].get(n, 0.0), r)
                    if every is not None:
                        every.setdefault(v.name, {}).setdefault(n, []).append(r)
                    log(f"round {rnd} callers {n:4d} {v.name:12s} {r:9.0f} pairs/s")
        return out
    finally:
        for a in actors:
            ray.kill(a)


def rows(results: Dict[str, Dict[int, float]], kvc: str, callers: Sequence[int]) -> List[Dict[str, Any]]:
    """The build/overhead/actor.json rows for one KVC variant against verl."""
    return [
        {"callers": n, "kvc_pairs_per_s": round(results[kvc][n], 1), "verl_pairs_per_s": round(results["verl"][n], 1)}
        for n in callers
    ]
