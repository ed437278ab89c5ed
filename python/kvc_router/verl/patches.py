"""The patches applied to verl's modules right after they execute.

Each patch has a name (``verl.<module>.<Class>.<attr>``) and records whether
it applied. A patch that cannot apply (verl renamed or moved what it wraps)
is harmless while no config asks for kvc_aware; as soon as one does, start-up
fails with :class:`VerlIncompatibleError` naming the verl version and the
patch, instead of verl quietly running its default balancer:

* the gate (:func:`ensure_supported`) runs where a kvc_aware config is first
  seen: the config conversion (``omega_conf_to_dataclass``) and the
  ``LLMServerManager`` wrappers;
* a patch that fails on a module imported after the gate ran raises from that
  import.

Without a ``router`` block asking for kvc_aware every patched function calls
verl's original unchanged.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import batching
from ..config import load_router_config
from . import actor
from .detection import SUPPORTED_TEXT, asks_for_router, get, is_tested, router_block, unsupported_reason, verl_version
from .ports import (
    ENGINES,
    balancer_block,
    base_port,
    configure_replica,
    endpoints_for,
    server_engine_kwargs,
    warn_once,
)

logger = logging.getLogger("kvc_router.verl")

_PATCHED = "_kvc_router_patched"
_lock = threading.RLock()

CONFIG = "verl.utils.config.omega_conf_to_dataclass"
INIT_SERVERS = "verl.workers.rollout.llm_server.LLMServerManager._initialize_llm_servers"
INIT_LB = "verl.workers.rollout.llm_server.LLMServerManager._init_global_load_balancer"
ACQUIRE = "verl.workers.rollout.llm_server.LLMServerClient._acquire_server"
UPDATE_WEIGHTS = "verl.checkpoint_engine.base.CheckpointEngineManager.update_weights"
PD_VLLM = "verl.workers.rollout.vllm_rollout.vllm_pd_replica.vLLMPDReplica._spawn_pd_server"
PD_SGLANG = "verl.workers.rollout.sglang_rollout.sglang_pd_replica.SGLangPDReplica._launch_one"

APPLIED = "applied"
NOT_NEEDED = "not needed"
FAILED = "failed"

#: patch name -> (state, detail)
_results: Dict[str, Tuple[str, str]] = {}
#: Set once a config asking for kvc_aware was seen in this process.
_requested = False


class VerlIncompatibleError(RuntimeError):
    """kvc_aware was asked for, but this verl cannot run it."""


class PatchError(Exception):
    """A patch's target is not where (or not what) it expects."""


# --------------------------------------------------------------------------
# Bookkeeping and the gate


def results() -> Dict[str, Tuple[str, str]]:
    with _lock:
        return dict(_results)


def _record(name: str, state: str, detail: str = "") -> None:
    with _lock:
        _results[name] = (state, detail)


def _failure_message(name: str, detail: str, version: str) -> str:
    return (
        f"kvc-router: actor_rollout_ref.rollout.router asks for kvc_aware, but patch {name} cannot apply to "
        f"verl {version} ({detail}); refusing to start rather than run verl's default balancer. "
        f"kvc-router supports {SUPPORTED_TEXT}."
    )


def ensure_supported() -> None:
    """Raises :class:`VerlIncompatibleError` if kvc_aware cannot run here;
    called wherever a config asking for kvc_aware is seen."""
    global _requested
    with _lock:
        _requested = True
        failed = [(n, d) for n, (s, d) in _results.items() if s == FAILED]
    version = verl_version()
    reason = unsupported_reason(version)
    if reason is not None:
        raise VerlIncompatibleError(f"kvc-router: actor_rollout_ref.rollout.router asks for kvc_aware, but {reason}")
    if failed:
        name, detail = failed[0]
        raise VerlIncompatibleError(_failure_message(name, detail, version))
    if not is_tested(version):
        warn_once(
            "untested",
            "kvc-router: verl %s is not a release kvc-router was tested with (%s); every patch applied",
            version,
            SUPPORTED_TEXT,
        )


# --------------------------------------------------------------------------
# Entry point from _kvc_router_verl_boot


def on_import(name: str, module: Any) -> None:
    """Patches one verl module right after it executed. Raises only
    :class:`VerlIncompatibleError`, and only once kvc_aware was asked for."""
    table = _TABLE.get(name, ())
    for patch_name, apply in table:
        try:
            with _lock:
                state = apply(module)
            _record(patch_name, state)
        except Exception as e:  # noqa: BLE001 - never break verl's import for a config that does not need us
            detail = str(e) if isinstance(e, PatchError) else repr(e)
            _record(patch_name, FAILED, detail)
            if _requested:
                raise VerlIncompatibleError(_failure_message(patch_name, detail, verl_version())) from e
            logger.warning(
                "kvc-router: patch %s cannot apply to verl %s (%s); a config asking for kvc_aware will fail",
                patch_name,
                verl_version(),
                detail,
            )


def _mark(fn: Any) -> Any:
    setattr(fn, _PATCHED, True)
    return fn


def _is_patched(fn: Any) -> bool:
    return getattr(fn, _PATCHED, False)


def _need(obj: Any, attr: str, what: str) -> Any:
    value = getattr(obj, attr, None)
    if value is None:
        raise PatchError(f"{what} has no {attr}")
    return value


def _wrap_method(cls: Any, name: str, make: Callable[[Any], Any]) -> str:
    orig = cls.__dict__.get(name)
    if orig is None:
        orig = getattr(cls, name, None)
    if orig is None or not callable(orig):
        raise PatchError(f"{cls.__name__}.{name} does not exist")
    if not _is_patched(orig):
        setattr(cls, name, _mark(make(orig)))
    return APPLIED


# --------------------------------------------------------------------------
# verl.utils.config: drop the router key before RolloutConfig conversion


def _is_rollout_target(config: Any, dataclass_type: Any) -> bool:
    if dataclass_type is not None:
        return any(c.__name__ == "RolloutConfig" for c in getattr(dataclass_type, "__mro__", ()))
    target = get(config, "_target_")
    return isinstance(target, str) and target.endswith(".RolloutConfig")


def patch_config(module: Any) -> str:
    orig = _need(module, "omega_conf_to_dataclass", "verl.utils.config")
    if _is_patched(orig):
        return APPLIED

    @functools.wraps(orig)
    def omega_conf_to_dataclass(config, dataclass_type=None):
        try:
            has_router = "router" in config and _is_rollout_target(config, dataclass_type)
        except Exception:  # noqa: BLE001
            has_router = False
        if not has_router:
            return orig(config, dataclass_type)
        if asks_for_router(config):
            # The key is only stripped when the rest of the hook can honour it.
            ensure_supported()
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
    return APPLIED


# --------------------------------------------------------------------------
# verl.workers.rollout.llm_server: the manager


def _manager(module: Any) -> Any:
    return _need(module, "LLMServerManager", "verl.workers.rollout.llm_server")


def patch_init_servers(module: Any) -> str:
    return _wrap_method(_manager(module), "_initialize_llm_servers", _make_initialize)


def patch_init_lb(module: Any) -> str:
    return _wrap_method(_manager(module), "_init_global_load_balancer", _make_init_lb)


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


def plan_for(manager: Any) -> Optional[dict]:
    """The manager's validated router block (cached on it), or None; passes
    the gate when it asks for kvc_aware."""
    if hasattr(manager, "_kvc_plan"):
        return manager._kvc_plan
    plan = router_block(getattr(manager, "rollout_config", None))
    if plan is not None:
        ensure_supported()
    manager._kvc_plan = plan
    return plan


def _make_initialize(orig: Any) -> Any:
    def before(self):
        plan = plan_for(self)
        if plan is None:
            return None
        rc = self.rollout_config
        settings = load_router_config(plan)  # the library's effective values
        name = get(rc, "name") or "vllm"
        metrics_on = settings.enable_server_metrics
        kv_auto = settings.kv_events == "auto"
        if name not in ENGINES and (metrics_on or kv_auto):
            warn_once(
                "non-vllm",
                "kvc-router: kv_events/enable_server_metrics configure vLLM and SGLang servers only; "
                "rollout.name=%r is left as it is",
                name,
            )
            return None
        if name == "vllm" and get(rc, "disable_log_stats", True) and not metrics_on:
            warn_once(
                "log-stats",
                "kvc-router: actor_rollout_ref.rollout.disable_log_stats is true, so vLLM's /metrics gauges "
                "(running, waiting, kv_cache_usage_perc) never update and the kvc_aware balancer sees every "
                "server as idle. Set router.config.enable_server_metrics: true (or "
                "actor_rollout_ref.rollout.disable_log_stats=false).",
            )
        if not (metrics_on or kv_auto):
            return None
        base = base_port(settings.kv_events_base_port)
        # SGLang's page_size must be the block size the router keys prompts with.
        block_size = int(settings.effective["router"].get("block_size") or 0)
        events: Dict[int, dict] = {}
        orig_cls = self.rollout_replica_class

        def make_replica(*args, **kwargs):
            replica = orig_cls(*args, **kwargs)
            try:
                spec = configure_replica(replica, metrics_on, kv_auto, base, engine=name, block_size=block_size)
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


def _make_init_lb(orig: Any) -> Any:
    def prepare(self):
        plan = plan_for(self)
        if plan is None:
            return None
        block = balancer_block(plan, endpoints_for(self), engine=get(self.rollout_config, "name") or "vllm")
        # turns first: admission's default (auto) is off for a multi-turn rollout, and the cap and class follow it.
        block = actor.session_turns(block, self.rollout_config)
        block = actor.admission_cap(
            block, get(self.rollout_config, "max_num_seqs", None), get(self.rollout_config, "data_parallel_size", 1)
        )
        fd = bool(get(self.rollout_config, "full_determinism", False))
        if load_router_config(plan).kv_events != "auto":
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
            if not actor.actor_options(block):
                setattr(self, attr, actor.bound_balancer_class(block, fd))
                return ("hook", (attr, prev))
        # verl 0.8.x (no load_balancer_cls), or actor options to apply.
        return ("direct", (block, fd))

    def finish(self, how):
        if how is None:
            return
        if how[0] == "direct":
            block, fd = how[1]
            servers = dict(zip(self.server_addresses, self.server_handles))
            self.global_load_balancer = actor.create_actor(servers, block, fd)
        else:
            attr, prev = how[1]
            setattr(self, attr, prev)
        actor.register_balancer(self.global_load_balancer)
        logger.info(
            "kvc-router: KVCAwareBalancer is verl's global load balancer (%d servers)", len(self.server_addresses)
        )

    def restore(self, how):
        if how is not None and how[0] == "hook":
            setattr(self, how[1][0], how[1][1])

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
                restore(self, how)
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
                restore(self, how)
                raise
            finish(self, how)
            return result

    return wrapper


# --------------------------------------------------------------------------
# verl.workers.rollout.llm_server: the client. Three jobs:
# * verl 0.9.0 / 0.8.0 call ``_acquire_server(request_id)`` only, so the
#   prompt is taken from ``generate``'s arguments (verl >= 0.9.1 forwards the
#   fields the balancer names in ``require_acquire_fields()`` itself);
# * when the balancer is ours, acquires and releases go through this event
#   loop's :class:`kvc_router.batching.Batcher` (one actor call for many);
# * when the balancer is ours, the release a ``generate`` makes waits until
#   that ``generate`` returns (no await in between: the same loop step) and
#   carries the request id and the output's token count, which the router's
#   length learner learns from (verl's release sends neither).
#   With verl's own balancer (no ``route_batch``) verl's code runs unchanged.

_prompt: contextvars.ContextVar = contextvars.ContextVar("kvc_router_prompt_ids", default=None)
#: (client, [server ids it released]) while a generate of that client runs
_deferred: contextvars.ContextVar = contextvars.ContextVar("kvc_router_deferred_release", default=None)


def patch_client(module: Any) -> str:
    client = _need(module, "LLMServerClient", "verl.workers.rollout.llm_server")
    acquire = getattr(client, "_acquire_server", None)
    if acquire is None:
        raise PatchError("LLMServerClient._acquire_server does not exist")
    params = inspect.signature(acquire).parameters.values()
    needs_prompt = not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    releases = callable(getattr(client, "_release_server", None))
    if needs_prompt or releases:
        if not inspect.iscoroutinefunction(getattr(client, "generate", None)):
            raise PatchError("LLMServerClient.generate is not a coroutine function")
        _wrap_method(client, "generate", lambda orig: _make_generate(orig, needs_prompt))
    if releases:
        # Without it (a verl releasing inline) releases stay single calls.
        _wrap_method(client, "_release_server", _make_release)
    return _wrap_method(client, "_acquire_server", _make_acquire)


def output_tokens(output: Any) -> Optional[int]:
    """How many tokens a ``generate`` output holds (``TokenOutput.token_ids``),
    or None when it has no token list."""
    ids = getattr(output, "token_ids", None)
    if ids is None or isinstance(ids, (str, bytes)):
        return None
    try:
        return len(ids)
    except TypeError:
        return None


def _make_generate(orig: Any, with_prompt: bool) -> Any:
    @functools.wraps(orig)
    async def generate(self, *args, **kwargs):
        token = _prompt.set(kwargs.get("prompt_ids")) if with_prompt else None
        lb = getattr(self, "_load_balancer", None)
        released: Optional[List[Any]] = [] if batching.supports_batching(lb) else None
        held = _deferred.set((self, released)) if released is not None else None
        out = None
        try:
            out = await orig(self, *args, **kwargs)
            return out
        finally:
            if held is not None:
                _deferred.reset(held)
            if token is not None:
                _prompt.reset(token)
            if released:
                rid = args[0] if args else kwargs.get("request_id")
                # One release per generate is verl's; anything else (or a
                # failed generate) is released without a count.
                n = output_tokens(out) if out is not None and len(released) == 1 else None
                for sid in released:
                    _release_to(lb, sid, rid if n is not None else None, n)

    return generate


def _release_to(lb: Any, server_id: Any, request_id: Any, n: Optional[int]) -> None:
    b = batching.batcher_for(lb)
    if b is not None:
        b.release(server_id, request_id, n)
    elif request_id is None:
        lb.release_server.remote(server_id=server_id)
    else:
        # Batching off (KVC_ROUTER_BATCH=0): one call, as verl's.
        lb.release_server.remote(server_id=server_id, request_id=request_id, output_tokens=n)


def _make_acquire(orig: Any) -> Any:
    @functools.wraps(orig)
    async def _acquire_server(self, request_id, *args, **kwargs):
        lb = getattr(self, "_load_balancer", None)
        if not args:
            b = batching.batcher_for(lb)
            if b is not None:
                ids = kwargs["prompt_ids"] if "prompt_ids" in kwargs else _prompt.get()
                return await b.acquire(request_id, ids)
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


def _make_release(orig: Any) -> Any:
    @functools.wraps(orig)
    def _release_server(self, server_id, *args, **kwargs):
        deferred = _deferred.get()
        if deferred is not None and deferred[0] is self:
            deferred[1].append(server_id)  # sent when the generate returns
            return None
        lb = getattr(self, "_load_balancer", None)
        b = batching.batcher_for(lb)
        if b is not None:
            b.release(server_id)
            return None
        if batching.supports_batching(lb) and getattr(self, "_lb_require_release_fields", 0) is None:
            # Our balancer, released outside an event loop after a batched
            # acquire skipped verl's field query (generate's own release
            # carries its request id itself): no release fields.
            self._lb_require_release_fields = []
        return orig(self, server_id, *args, **kwargs)

    return _release_server


# --------------------------------------------------------------------------
# verl.checkpoint_engine.base: reset the prefix index after each weight sync


def patch_checkpoint_engine(module: Any) -> str:
    mgr = _need(module, "CheckpointEngineManager", "verl.checkpoint_engine.base")
    orig = mgr.__dict__.get("update_weights")
    if orig is None:
        raise PatchError("CheckpointEngineManager.update_weights does not exist")
    if _is_patched(orig):
        return APPLIED
    inner = getattr(orig, "__wrapped__", None)
    if inner is None or not inspect.iscoroutinefunction(inner):
        raise PatchError("CheckpointEngineManager.update_weights is not an auto_await coroutine function")
    try:
        from verl.utils.ray_utils import auto_await
    except Exception as e:  # noqa: BLE001
        raise PatchError(f"verl.utils.ray_utils.auto_await is missing ({e!r})") from e

    @functools.wraps(inner)
    async def update_weights(self, *args, **kwargs):
        result = await inner(self, *args, **kwargs)
        await actor.reset_balancers()
        return result

    # verl's auto_await looks at its caller's frame, so re-decorate the
    # coroutine function instead of wrapping the decorated one.
    mgr.update_weights = _mark(auto_await(update_weights))
    return APPLIED


# --------------------------------------------------------------------------
# verl 0.9.x prefill/decode replicas: 1 prefill + N decode servers built from
# one replica config, launched one after the other (prefill first). Each
# launch gets that server's own KV-event ports (kv_events: auto), else they
# would all bind the replica's.


def _make_pd_launch(orig: Any) -> Any:
    def before(self):
        pd = getattr(self, "_kvc_pd", None)
        if not pd:
            return None
        k = pd["next"]
        pd["next"] = k + 1
        if k == 0 or k >= pd["servers"]:
            return None
        saved = self.config.engine_kwargs
        self.config.engine_kwargs = server_engine_kwargs(saved, pd, k)
        return (saved,)

    def after(self, state):
        if state is not None:
            self.config.engine_kwargs = state[0]

    return _maybe_async(orig, before, after)


def patch_pd_vllm(module: Any) -> str:
    return _wrap_method(_need(module, "vLLMPDReplica", module.__name__), "_spawn_pd_server", _make_pd_launch)


def patch_pd_sglang(module: Any) -> str:
    return _wrap_method(_need(module, "SGLangPDReplica", module.__name__), "_launch_one", _make_pd_launch)


#: module -> [(patch name, apply)], applied in order after the module executed.
#: verl.workers.rollout.router (0.9.1) needs no patch: the manager passes
#: load_balancer_cls, which wins over router_config_path.
_TABLE: Dict[str, List[Tuple[str, Callable[[Any], str]]]] = {
    "verl.utils.config": [(CONFIG, patch_config)],
    "verl.workers.rollout.llm_server": [
        (INIT_SERVERS, patch_init_servers),
        (INIT_LB, patch_init_lb),
        (ACQUIRE, patch_client),
    ],
    "verl.checkpoint_engine.base": [(UPDATE_WEIGHTS, patch_checkpoint_engine)],
    "verl.workers.rollout.vllm_rollout.vllm_pd_replica": [(PD_VLLM, patch_pd_vllm)],
    "verl.workers.rollout.sglang_rollout.sglang_pd_replica": [(PD_SGLANG, patch_pd_sglang)],
}

#: Module names the boot's finder watches.
WATCHED = frozenset(_TABLE)
