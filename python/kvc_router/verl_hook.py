"""verl integration: ``router.type: kvc_aware`` under ``actor_rollout_ref.rollout``.

How it reaches verl
-------------------
The kvc-router wheel installs ``kvc_router_verl.pth`` into site-packages; the
interpreter runs it at start-up in every process of the environment (driver,
``TaskRunner``, agent-loop workers, rollout servers: Ray starts them all with
the same interpreter). It imports ``_kvc_router_verl_boot``, which only puts a
finder on ``sys.meta_path``; when verl's own modules finish executing,
:func:`on_import` patches them in place. ``KVC_ROUTER_VERL_HOOK=0`` switches
everything off. Without a ``router`` block asking for ``kvc_aware`` every
patched function calls verl's original unchanged.

What is patched (all idempotent)
--------------------------------
* ``verl.utils.config.omega_conf_to_dataclass``: a rollout config carrying the
  (non-schema) ``router`` key is converted to ``RolloutConfig`` without it
  (verl's structured merge / ``RolloutConfig(**kwargs)`` would reject it).
* ``LLMServerManager._initialize_llm_servers``: warns once when
  ``disable_log_stats`` is true; with ``enable_server_metrics: true`` or
  ``kv_events: auto`` in the router config each replica's ``engine_kwargs.vllm``
  gets ``disable_log_stats: false`` / its own ``kv_events_config``.
* ``LLMServerManager._init_global_load_balancer``: creates
  ``KVCAwareBalancer`` through verl's ``load_balancer_cls`` hook (0.9.x; a
  subclass that carries the router config), or directly on older verl.
* ``LLMServerClient._acquire_server`` (only when it takes no ``**extra``, i.e.
  verl 0.9.0 / 0.8.0): sends ``prompt_ids`` when the balancer asks for them
  (verl >= 0.9.1 does this itself via ``require_acquire_fields()``).
* ``CheckpointEngineManager.update_weights``: after each weight sync every
  KVCAwareBalancer created in this process gets ``reset_prefix_index()``.

``python -m kvc_router.verl_hook status|install|uninstall`` shows / writes /
removes the ``.pth`` file (e.g. for an editable install, which has none).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import os
import sys
import sysconfig
import threading
from typing import Any, Dict, List, Optional, Tuple

logger = logging.getLogger("kvc_router.verl")

PTH_NAME = "kvc_router_verl.pth"
PTH_LINE = "import _kvc_router_verl_boot\n"
ENV_SWITCH = "KVC_ROUTER_VERL_HOOK"
ENV_BASE_PORT = "KVC_ROUTER_KV_EVENTS_BASE_PORT"
DEFAULT_KV_EVENTS_BASE_PORT = 30000
TOPIC_PREFIX = "kvc-router.replica-"

_PATCHED = "_kvc_router_patched"
_lock = threading.RLock()
_warned: set = set()
#: Balancer actors created in this process (reset after each weight sync).
_balancers: List[Any] = []


# --------------------------------------------------------------------------
# Which config asks for us


def _plain(obj: Any) -> Any:
    mod = type(obj).__module__ or ""
    if mod.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(obj, resolve=True)
    return obj


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    try:
        if isinstance(cfg, dict):
            return cfg.get(key, default)
        return getattr(cfg, key, default) if not hasattr(cfg, "get") else cfg.get(key, default)
    except Exception:  # noqa: BLE001 - OmegaConf raises on missing keys in struct mode
        return default


def router_block(rollout_config: Any) -> Optional[dict]:
    """The normalised ``{"type", "config"}`` block that asks for kvc_aware, or None.

    Sources: ``rollout.router`` (this package's key) and, on verl >= 0.9.1,
    ``rollout.router_config_path`` whose YAML names ``kvc_router.KVCAwareBalancer``.
    """
    block = _plain(_get(rollout_config, "router"))
    if block is not None:
        if isinstance(block, str):
            block = {"type": block}
        if not isinstance(block, dict):
            raise TypeError(f"actor_rollout_ref.rollout.router must be a mapping, got {type(block).__name__}")
        rtype = block.get("type", "default")
        if rtype in (None, "default"):
            return None
        if rtype != "kvc_aware":
            from .config import ROUTER_TYPES
            from .errors import ConfigError

            raise ConfigError(
                f"actor_rollout_ref.rollout.router.type: {rtype!r} (allowed: {', '.join(map(repr, ROUTER_TYPES))})",
                key="router.type",
                allowed=ROUTER_TYPES,
            )
        return _normalise_block(block)
    path = _get(rollout_config, "router_config_path")
    if path:
        data = _read_router_yaml(path)
        if isinstance(data, dict) and _names_us(data.get("router_class")):
            rest = {k: v for k, v in data.items() if k != "router_class"}
            if not rest:
                return _normalise_block({"type": "kvc_aware"})
            if "router" in rest:
                rest = rest["router"]
            if "type" in rest or set(rest) <= {"config"}:
                return _normalise_block(rest) if rest.get("type", "kvc_aware") == "kvc_aware" else None
            return _normalise_block({"type": "kvc_aware", "config": rest})
    return None


def _names_us(cls_name: Any) -> bool:
    return isinstance(cls_name, str) and cls_name.startswith("kvc_router.") and cls_name.endswith("KVCAwareBalancer")


def _read_router_yaml(path: str) -> Any:
    try:
        from verl.utils.import_utils import resolve_config_path

        path = resolve_config_path(path)
    except Exception:  # noqa: BLE001 - older verl, or a missing file (verl reports it)
        pass
    if not os.path.isfile(path):
        return None
    import yaml

    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def _normalise_block(block: dict) -> dict:
    """``{"type": "kvc_aware", "config": {...}}`` with the packaged defaults
    filled in when ``config`` is absent; validated here, in the driver."""
    from .config import load_router_config, packaged_config_path

    inner = block.get("config")
    if inner is None:
        import yaml

        with open(packaged_config_path("kvc_aware"), encoding="utf-8") as f:
            inner = yaml.safe_load(f)["router"]["config"]
    out = {"type": "kvc_aware", "config": _plain(inner)}
    load_router_config(out)  # ConfigError names the bad key
    return out


# --------------------------------------------------------------------------
# Entry point from _kvc_router_verl_boot


def on_import(name: str, module: Any) -> None:
    """Patches one verl module right after it executed. Never raises."""
    try:
        with _lock:
            if name == "verl.utils.config":
                _patch_config(module)
            elif name == "verl.workers.rollout.llm_server":
                _patch_llm_server(module)
            elif name == "verl.checkpoint_engine.base":
                _patch_checkpoint_engine(module)
            # verl.workers.rollout.router (0.9.1) needs no patch: the manager
            # passes load_balancer_cls, which wins over router_config_path.
    except Exception as e:  # noqa: BLE001
        logger.warning("kvc-router: could not patch %s (%r); verl runs unmodified there", name, e)


def _mark(fn: Any) -> Any:
    setattr(fn, _PATCHED, True)
    return fn


def _is_patched(fn: Any) -> bool:
    return getattr(fn, _PATCHED, False)


# --------------------------------------------------------------------------
# verl.utils.config: drop the router key before RolloutConfig conversion


def _is_rollout_target(config: Any, dataclass_type: Any) -> bool:
    if dataclass_type is not None:
        return any(c.__name__ == "RolloutConfig" for c in getattr(dataclass_type, "__mro__", ()))
    target = _get(config, "_target_")
    return isinstance(target, str) and target.endswith(".RolloutConfig")


def _patch_config(module: Any) -> None:
    orig = getattr(module, "omega_conf_to_dataclass", None)
    if orig is None or _is_patched(orig):
        return

    @functools.wraps(orig)
    def omega_conf_to_dataclass(config, dataclass_type=None):
        try:
            has_router = "router" in config and _is_rollout_target(config, dataclass_type)
        except Exception:  # noqa: BLE001
            has_router = False
        if not has_router:
            return orig(config, dataclass_type)
        if isinstance(config, dict):
            return orig({k: v for k, v in config.items() if k != "router"}, dataclass_type)
        # A DictConfig: take the key out in place (a detached copy would lose
        # the parent that interpolations resolve against) and put it back.
        from omegaconf import flag_override

        with flag_override(config, ["struct", "readonly"], False):
            saved = config.pop("router")
        try:
            return orig(config, dataclass_type)
        finally:
            with flag_override(config, ["struct", "readonly"], False):
                config["router"] = saved

    module.omega_conf_to_dataclass = _mark(omega_conf_to_dataclass)


# --------------------------------------------------------------------------
# verl.workers.rollout.llm_server


def _wrap_method(cls: Any, name: str, make: Any) -> None:
    orig = cls.__dict__.get(name)
    if orig is None or _is_patched(orig):
        return
    setattr(cls, name, _mark(make(orig)))


def _patch_llm_server(module: Any) -> None:
    manager = getattr(module, "LLMServerManager", None)
    if manager is not None:
        _wrap_method(manager, "_initialize_llm_servers", _make_initialize)
        _wrap_method(manager, "_init_global_load_balancer", _make_init_lb)
    client = getattr(module, "LLMServerClient", None)
    if client is not None and "_acquire_server" in client.__dict__:
        params = inspect.signature(client._acquire_server).parameters.values()
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            _wrap_method(client, "generate", _make_generate)
            _wrap_method(client, "_acquire_server", _make_acquire)


def _maybe_async(orig: Any, before: Any, after: Any) -> Any:
    """Wraps ``orig`` (sync or async) with ``before(self) -> state`` and
    ``after(self, state)``."""
    if inspect.iscoroutinefunction(orig):

        @functools.wraps(orig)
        async def wrapper(self, *args, **kwargs):
            state = before(self)
            try:
                return await orig(self, *args, **kwargs)
            finally:
                after(self, state)

    else:

        @functools.wraps(orig)
        def wrapper(self, *args, **kwargs):
            state = before(self)
            try:
                return orig(self, *args, **kwargs)
            finally:
                after(self, state)

    return wrapper


def _plan(manager: Any) -> Optional[dict]:
    if hasattr(manager, "_kvc_plan"):
        return manager._kvc_plan
    plan = router_block(getattr(manager, "rollout_config", None))
    manager._kvc_plan = plan
    return plan


def warn_once(key: str, msg: str, *args: Any) -> None:
    if key in _warned:
        return
    _warned.add(key)
    logger.warning(msg, *args)


def _make_initialize(orig: Any) -> Any:
    def before(self):
        plan = _plan(self)
        if plan is None:
            return None
        rc = self.rollout_config
        inner = plan["config"]
        name = _get(rc, "name")
        metrics_on = bool(inner.get("enable_server_metrics"))
        kv_auto = inner.get("kv_events") == "auto"
        if name not in ("vllm", None) and (metrics_on or kv_auto):
            warn_once(
                "non-vllm",
                "kvc-router: kv_events/enable_server_metrics only configure vLLM servers; rollout.name=%r is "
                "left as it is",
                name,
            )
            return None
        if _get(rc, "disable_log_stats", True) and not metrics_on:
            warn_once(
                "log-stats",
                "kvc-router: actor_rollout_ref.rollout.disable_log_stats is true, so vLLM's /metrics gauges "
                "(running, waiting, kv_cache_usage_perc) never update and the kvc_aware balancer sees every "
                "server as idle. Set router.config.enable_server_metrics: true (or "
                "actor_rollout_ref.rollout.disable_log_stats=false).",
            )
        if not (metrics_on or kv_auto):
            return None
        base = _base_port(inner)
        events: Dict[int, dict] = {}
        orig_cls = self.rollout_replica_class

        def make_replica(*args, **kwargs):
            replica = orig_cls(*args, **kwargs)
            try:
                spec = configure_replica(replica, metrics_on, kv_auto, base)
            except Exception as e:  # noqa: BLE001
                logger.warning(
                    "kvc-router: could not configure replica %s: %r", getattr(replica, "replica_rank", "?"), e
                )
                spec = None
            if spec is not None:
                events[replica.replica_rank] = spec
            return replica

        self.rollout_replica_class = make_replica
        self._kvc_events = events
        return orig_cls

    def after(self, orig_cls):
        if orig_cls is not None:
            self.rollout_replica_class = orig_cls

    return _maybe_async(orig, before, after)


def _base_port(inner: dict) -> int:
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
    ek = dict(_plain(cfg.engine_kwargs) or {})
    vk = dict(ek.get("vllm") or {})
    spec = None
    if metrics_on:
        vk["disable_log_stats"] = False
    if kv_auto:
        dp = int(_get(cfg, "data_parallel_size", 1) or 1)
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
            tp = int(_get(cfg, "tensor_model_parallel_size", 1) or 1)
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


def bound_balancer_class(block: dict, full_determinism: bool) -> type:
    """A KVCAwareBalancer subclass carrying the router config, for verl's
    ``load_balancer_cls`` hook (which passes only servers and max_cache_size).
    Defined in a function, so Ray pickles it by value with its config."""
    from .balancer import DEFAULT_ROUTING_CACHE_SIZE, KVCAwareBalancer

    class VerlKVCAwareBalancer(KVCAwareBalancer):
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

    VerlKVCAwareBalancer.__qualname__ = VerlKVCAwareBalancer.__name__ = "KVCAwareBalancer"
    return VerlKVCAwareBalancer


def _make_init_lb(orig: Any) -> Any:
    def prepare(self):
        plan = _plan(self)
        if plan is None:
            return None
        block = balancer_block(plan, endpoints_for(self))
        fd = bool(_get(self.rollout_config, "full_determinism", False))
        if plan["config"].get("kv_events") != "auto":
            logger.info("kvc-router: kv_events is off: the balancer runs in approximate mode (see get_status())")
        attr = next((a for a in ("_load_balancer_cls", "load_balancer_cls") if a in self.__dict__), None)
        if attr is not None:
            prev = self.__dict__[attr]
            default = getattr(sys.modules.get("verl.workers.rollout.llm_server"), "GlobalRequestLoadBalancer", None)
            if prev is not None and prev is not default:
                warn_once(
                    "lb-cls",
                    "kvc-router: LLMServerManager got load_balancer_cls=%r from its caller; router.type "
                    "kvc_aware is ignored",
                    prev,
                )
                return None
            setattr(self, attr, bound_balancer_class(block, fd))
            return ("hook", (attr, prev))
        return ("direct", (block, fd))

    def finish(self, how):
        if how is None:
            return
        if how[0] == "direct":
            import ray

            from .balancer import DEFAULT_ROUTING_CACHE_SIZE, KVCAwareBalancer

            block, fd = how[1]
            self.global_load_balancer = ray.remote(KVCAwareBalancer).remote(
                servers=dict(zip(self.server_addresses, self.server_handles)),
                max_cache_size=DEFAULT_ROUTING_CACHE_SIZE,
                full_determinism=fd,
                router_config=block,
            )
        else:
            attr, prev = how[1]
            setattr(self, attr, prev)
        register_balancer(self.global_load_balancer)
        logger.info(
            "kvc-router: KVCAwareBalancer is verl's global load balancer (%d servers)", len(self.server_addresses)
        )

    if inspect.iscoroutinefunction(orig):

        @functools.wraps(orig)
        async def wrapper(self, *args, **kwargs):
            how = prepare(self)
            if how is not None and how[0] == "direct":
                finish(self, how)
                return None
            try:
                result = await orig(self, *args, **kwargs)
            except BaseException:
                if how is not None:
                    setattr(self, how[1][0], how[1][1])
                raise
            finish(self, how)
            return result

    else:

        @functools.wraps(orig)
        def wrapper(self, *args, **kwargs):
            how = prepare(self)
            if how is not None and how[0] == "direct":
                finish(self, how)
                return None
            try:
                result = orig(self, *args, **kwargs)
            except BaseException:
                if how is not None:
                    setattr(self, how[1][0], how[1][1])
                raise
            finish(self, how)
            return result

    return wrapper


def register_balancer(handle: Any) -> None:
    with _lock:
        if handle is not None and all(h is not handle for h in _balancers):
            _balancers.append(handle)


def registered_balancers() -> List[Any]:
    with _lock:
        return list(_balancers)


# -- client (verl 0.9.0 / 0.8.0 shape: _acquire_server(request_id) only) ----

_prompt: contextvars.ContextVar = contextvars.ContextVar("kvc_router_prompt_ids", default=None)


def _make_generate(orig: Any) -> Any:
    @functools.wraps(orig)
    async def generate(self, *args, **kwargs):
        token = _prompt.set(kwargs.get("prompt_ids"))
        try:
            return await orig(self, *args, **kwargs)
        finally:
            _prompt.reset(token)

    return generate


def _make_acquire(orig: Any) -> Any:
    @functools.wraps(orig)
    async def _acquire_server(self, request_id, *args, **kwargs):
        lb = getattr(self, "_load_balancer", None)
        fields = getattr(self, "_kvc_fields", None)
        if fields is None and lb is not None:
            try:
                fields = list(await lb.require_acquire_fields.remote())
            except Exception:  # noqa: BLE001 - verl's own balancer has no such method
                fields = []
            self._kvc_fields = fields
        ids = _prompt.get()
        if fields and "prompt_ids" in fields and ids is not None and not args and not kwargs:
            return await lb.acquire_server.remote(request_id=request_id, prompt_ids=ids)
        return await orig(self, request_id, *args, **kwargs)

    return _acquire_server


# --------------------------------------------------------------------------
# verl.checkpoint_engine.base: reset the prefix index after each weight sync


async def reset_balancers(timeout: float = 10.0) -> int:
    """``reset_prefix_index()`` on every balancer of this process; returns how
    many answered. Dead actors are forgotten."""
    handles = registered_balancers()
    if not handles:
        return 0
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


def _patch_checkpoint_engine(module: Any) -> None:
    mgr = getattr(module, "CheckpointEngineManager", None)
    if mgr is None:
        return
    orig = mgr.__dict__.get("update_weights")
    if orig is None or _is_patched(orig):
        return
    inner = getattr(orig, "__wrapped__", None)
    if inner is None or not inspect.iscoroutinefunction(inner):
        return
    try:
        from verl.utils.ray_utils import auto_await
    except Exception:  # noqa: BLE001
        return

    @functools.wraps(inner)
    async def update_weights(self, *args, **kwargs):
        result = await inner(self, *args, **kwargs)
        await reset_balancers()
        return result

    # verl's auto_await looks at its caller's frame, so re-decorate the
    # coroutine function instead of wrapping the decorated one.
    mgr.update_weights = _mark(auto_await(update_weights))


# --------------------------------------------------------------------------
# .pth management


def _site_dirs() -> List[str]:
    return [sysconfig.get_paths()["purelib"]]


def pth_path() -> str:
    return os.path.join(_site_dirs()[0], PTH_NAME)


def status() -> dict:
    boot = sys.modules.get("_kvc_router_verl_boot")
    active = any(type(f).__name__ == "VerlImportWatcher" for f in sys.meta_path)
    return {
        "pth": pth_path(),
        "pth_installed": os.path.isfile(pth_path()),
        "boot_module": getattr(boot, "__file__", None),
        "watcher_active": active,
        "disabled_by_env": os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"),
        "balancers_in_process": len(registered_balancers()),
    }


def main(argv: Optional[List[str]] = None) -> int:
    import json

    args = list(sys.argv[1:] if argv is None else argv) or ["status"]
    cmd = args[0]
    if cmd == "install":
        with open(pth_path(), "w", encoding="utf-8") as f:
            f.write(PTH_LINE)
        print(f"wrote {pth_path()}")
    elif cmd == "uninstall":
        if os.path.isfile(pth_path()):
            os.remove(pth_path())
            print(f"removed {pth_path()}")
    elif cmd != "status":
        print("usage: python -m kvc_router.verl_hook [status|install|uninstall]", file=sys.stderr)
        return 2
    print(json.dumps(status(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
