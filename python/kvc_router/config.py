"""The balancer configuration, as the user wrote it, handed to the library.

The library owns the one schema: every key, default, check and error, and
the shapes a configuration may take (verl's ``router:`` block, the whole
verl config, a router type, the bare ``config`` mapping ...; see
docs/configuration.md). This module only reads what Python alone can read
(a YAML path, OmegaConf containers, strategy objects), sends it unchanged as
the balancer's document ``{"router_config": ...}`` and wraps the library's
answer, the effective configuration, in :class:`RouterConfig`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple

from . import _native
from .endpoints import KVEventEndpoint, _join, _plain, parse_endpoint
from .errors import ConfigError, NativeError, allowed_text

_CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
#: Deepest nesting accepted in a router config (real ones are < 8 deep).
MAX_CONFIG_DEPTH = 64
_SCHEMA_LISTS = {"ROUTER_TYPES": "router_modes", "COLLECTOR_NAMES": "collectors",
                 "METRICS_FLAVORS": "metrics_flavors", "KV_EVENTS_MODES": "kv_events_modes"}  # fmt: skip


def __getattr__(name: str) -> Any:
    """Names the library's schema defines (``ROUTER_TYPES``, ``STRATEGY_TARGETS`` ...)."""
    if name == "STRATEGY_TARGETS":
        return dict(_native.config_schema()["targets"])
    if name in _SCHEMA_LISTS:
        return tuple(_native.config_schema()[_SCHEMA_LISTS[name]])
    raise AttributeError(name)


class StrategyOptions:
    """A strategy as an object (verl's style); :meth:`to_dict` is its mapping form."""

    name: ClassVar[str]
    target: ClassVar[str]

    def to_dict(self) -> Dict[str, Any]:
        """The mapping form with only the fields that were set."""
        out: Dict[str, Any] = {"_target_": self.target}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = dict(v) if isinstance(v, Mapping) else list(v) if isinstance(v, tuple) else v
        return out


@dataclass(frozen=True)
class KVCAwareStrategyConfig(StrategyOptions):
    """kvc_aware, as verl PR #6940 names it (also its ``_target_``). A field
    left ``None`` takes the library's default (docs/configuration.md, which
    also says what each means; a test keeps the fields equal to the
    library's parameters)."""

    alpha: Optional[float] = None
    load_threshold: Optional[float] = None
    layer_weights: Optional[Mapping[str, float]] = None
    collector_names: Optional[Tuple[str, ...]] = None
    weight: Optional[float] = None
    marginal: Optional[bool] = None
    token_load: Optional[bool] = None
    kv_tokens: Optional[int] = None
    saved_scale_tokens: Optional[int] = None
    session_weight: Optional[float] = None
    sibling_spread: Optional[bool] = None
    group_spread: Optional[float] = None
    group_spread_min_ratio: Optional[float] = None
    group_spread_min_corr: Optional[float] = None
    group_spread_open_corr: Optional[float] = None
    group_spread_open_max_servers: Optional[int] = None
    group_spread_open_ratio: Optional[float] = None
    group_spread_max_servers: Optional[int] = None
    task_spread: Optional[float] = None
    task_spread_min_corr: Optional[float] = None
    work_weight: Optional[float] = None

    name: ClassVar[str] = "kvc_aware"
    target: ClassVar[str] = "kvc_router.config.KVCAwareStrategyConfig"


@dataclass(frozen=True)
class LeastInflightStrategyConfig(StrategyOptions):
    """verl's default: fewest in-flight requests, ties to the first-added server."""

    weight: Optional[float] = None

    name: ClassVar[str] = "least_inflight"
    target: ClassVar[str] = "kvc_router.config.LeastInflightStrategyConfig"


@dataclass(frozen=True)
class MetricsConfig:
    """``router.config.metrics``: the router's metrics in Ray's Prometheus
    export (:mod:`kvc_router.metrics`); defaults and ranges are the library's."""

    enabled: Optional[bool] = None  # None: on inside a Ray actor, off elsewhere
    period_s: float = 5.0
    max_server_labels: int = 64


@dataclass(frozen=True)
class CollectorConfig:
    """What the balancer itself reads of ``router.config.collector``: the
    configured KV-event endpoints and how to ask server handles for theirs."""

    endpoints: Mapping[str, Tuple[KVEventEndpoint, ...]] = field(default_factory=dict)
    topic: str = ""
    use_handle_endpoints: bool = True
    handle_timeout_ms: int = 5000


class RouterConfig:
    """A configuration the library accepted: ``effective`` is its effective
    document (kvr_validate_config's: every default filled in, the keys only
    Python acts on under ``integration``); ``document`` is what was sent.
    ``RouterConfig(type=..., **config)`` builds one from router.config's
    keys (verl PR #6940's ``KVCAwareConfig(strategies=[...])``); without a
    type, config keys mean kvc_aware and no keys the default router."""

    def __init__(self, type: Optional[str] = None, **config: Any) -> None:
        src = {"type": type, "config": config or None} if type else (config or None)
        self.effective, self.document = _load(src, {})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RouterConfig) and self.effective == other.effective

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RouterConfig({self.document.get('router_config')!r})"

    type = property(lambda self: str(self.effective["router"]["mode"]))

    strategies = property(lambda self: tuple(self.effective["router"]["strategies"]))

    @property
    def collector_names(self) -> Tuple[str, ...]:
        return tuple(c["name"] for c in self.effective["collectors"]["collectors"])

    sticky_max_size = property(lambda self: int(self.effective["router"]["sticky_max_size"]))

    @property
    def admission_enabled(self) -> bool:
        """Router-side admission is on (kvc_aware mode only: kvc_router.admission)."""
        return self.type == "kvc_aware" and bool(self.effective["router"]["admission"]["enabled"])

    @property
    def admission_claim_timeout_s(self) -> float:
        """``admission.claim_timeout_ms`` in seconds: how long the admission
        balancer keeps a ticket whose owner neither claims nor asks for it."""
        ms = self.effective["router"]["admission"].get("claim_timeout_ms") or 30_000
        return float(ms) / 1000.0

    @property
    def integration(self) -> Mapping[str, Any]:
        """The keys only the Python package and its verl hook act on."""
        return self.effective["integration"]

    metrics_flavor = property(lambda self: str(self.integration["metrics_flavor"]))
    kv_events = property(lambda self: str(self.integration["kv_events"]))
    kv_events_base_port = property(lambda self: int(self.integration["kv_events_base_port"]))
    enable_server_metrics = property(lambda self: bool(self.integration["enable_server_metrics"]))

    @property
    def metrics(self) -> MetricsConfig:
        return MetricsConfig(**self.integration["metrics"])

    @property
    def collector(self) -> CollectorConfig:
        zmq = [c for c in self.effective["collectors"]["collectors"] if c["name"] == "vllm_zmq"]
        eps = (zmq[0].get("endpoints") or {}) if zmq else {}
        return CollectorConfig(
            endpoints={s: tuple(KVEventEndpoint(e["endpoint"], e.get("replay"), e.get("topic", "")) for e in v)
                       for s, v in eps.items()},
            **self.integration["collector"],
        )  # fmt: skip

    def native(self, sticky_default: Optional[int] = None) -> dict:
        """The kvr_router_new document; ``sticky_default`` (the balancer's
        ``max_cache_size``) applies when sticky_max_size is unset."""
        doc = dict(self.document)
        if sticky_default is not None:
            doc["max_cache_size"] = sticky_default
        return doc

    def validate(self) -> dict:
        """The effective configuration (the library checked it on load)."""
        return _native.validate_config(dict(self.document))


KVCAwareConfig = RouterConfig  # upstream verl's name


def library_defaults(router_type: str = "default", *, async_balancer: bool = False) -> dict:
    """The library's effective configuration for a router type with an empty
    config; with ``async_balancer``, as the admission balancer (the class
    verl's hook creates for kvc_aware) runs it: admission on."""
    doc: Dict[str, Any] = {"router_config": {"type": router_type, "config": {}}}
    if async_balancer:
        doc["async_balancer"] = True
    return _validate(doc)


def packaged_config_path(name: str) -> str:
    """Path of a packaged YAML config (``default`` or ``kvc_aware``)."""
    return os.path.join(_CONFIG_DIR, f"{name}.yaml")


def load_router_config(
    source: Any = None,
    validate: bool = True,
    *,
    max_cache_size: Optional[int] = None,
    sync_balancer: bool = False,
    async_balancer: bool = False,
) -> RouterConfig:
    """Any accepted input (``None``, a router type, a YAML path, verl's
    router block or the whole verl config, the bare ``config`` mapping, as
    dicts or OmegaConf, or a :class:`RouterConfig`) as a :class:`RouterConfig`.
    The library checks it (``validate`` is kept for compatibility: there is
    no unchecked configuration), so every error is a :class:`ConfigError`
    naming the key as the user wrote it. ``max_cache_size``,
    ``sync_balancer`` and ``async_balancer`` are the balancer's (see
    :class:`KVCAwareBalancer`): ``admission.enabled``'s default, ``auto``, is
    on only where ``async_balancer`` says acquires can be held."""
    if isinstance(source, RouterConfig):
        if max_cache_size is None and not sync_balancer and not async_balancer:
            return source
        source = source.document.get("router_config")
    extra: Dict[str, Any] = {"max_cache_size": max_cache_size} if max_cache_size is not None else {}
    if sync_balancer:
        extra["sync_balancer"] = True
    if async_balancer:
        extra["async_balancer"] = True
    rc = RouterConfig.__new__(RouterConfig)
    rc.effective, rc.document = _load(source, extra)
    return rc


def _load(source: Any, extra: Dict[str, Any]) -> Tuple[Mapping[str, Any], Dict[str, Any]]:
    doc = {"router_config": _json_ready(_read(source)), **extra}
    return _validate(doc), doc


def _validate(doc: dict) -> dict:
    try:
        return _native.validate_config(doc)
    except ConfigError as e:  # the library's {"key", "reason"}: the user's key
        key, reason = e.key or "router_config", getattr(e, "reason", None)
        raise ConfigError(f"{key}: {reason}" if reason else str(e), key=key) from None


def _read(src: Any) -> Any:
    """The configuration as data: YAML files read, OmegaConf made plain."""
    types = __getattr__("ROUTER_TYPES")
    if isinstance(src, str) and src in types:
        return src
    if isinstance(src, os.PathLike) or (
        isinstance(src, str) and (src.endswith((".yaml", ".yml")) or os.path.isfile(src))
    ):
        data = _read_yaml(os.fspath(src))
        return {} if data is None else data
    if isinstance(src, str):
        raise ConfigError(f"router_config: {src!r} is neither a router type ({allowed_text(types)}) "
                          "nor a YAML file path", key="router_config", allowed=types)  # fmt: skip
    src = _plain(src)
    if src is not None and not isinstance(src, Mapping):
        raise ConfigError(f"router_config must be a dict, DictConfig, YAML path or None, got {type(src).__name__}",
                          key="router_config")  # fmt: skip
    return src


def _read_yaml(path: str) -> Any:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except RecursionError:
        raise ConfigError(f"router config {path!r} is nested too deeply to read (limit {MAX_CONFIG_DEPTH} levels)",
                          key="router_config") from None  # fmt: skip
    except OSError as e:
        raise ConfigError(f"cannot read router config {path!r}: {e}", key="router_config") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"router config {path!r} is not valid YAML: {e}", key="router_config") from e


def _json_ready(value: Any) -> Any:
    """A plain JSON copy of ``value``: OmegaConf containers and strategy
    objects become dicts and lists. Refuses, naming the key, what JSON cannot
    carry (non-finite numbers, other objects) and nesting deeper than
    MAX_CONFIG_DEPTH (or a mapping containing itself). Iterative, so it
    cannot hit Python's recursion limit."""
    root: list = [None]
    stack: list = [(value, root, 0, "", 0)]
    while stack:
        v, parent, slot, path, depth = stack.pop()
        v = _plain(v.to_dict() if isinstance(v, StrategyOptions) else v)
        key = path or "router_config"
        if isinstance(v, (Mapping, list, tuple)):
            if depth >= MAX_CONFIG_DEPTH:
                raise ConfigError(f"{key}: nested more than {MAX_CONFIG_DEPTH} levels deep (or a mapping that contains "
                                  "itself)", key=key)  # fmt: skip
            new: Any
            if isinstance(v, Mapping):
                parent[slot] = new = {}
                stack.extend((x, new, str(k), _join(path, str(k)), depth + 1) for k, x in v.items())
            else:
                parent[slot] = new = [None] * len(v)
                stack.extend((x, new, i, f"{path}[{i}]", depth + 1) for i, x in enumerate(v))
        elif isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{key}: must be a finite number, got {v}", key=key)
        elif v is None or isinstance(v, (str, int, float)):
            parent[slot] = v
        else:
            raise ConfigError(f"{key}: a {type(v).__name__} is not a configuration value", key=key)
    return root[0]


__all__ = ["ConfigError", "NativeError", "RouterConfig", "KVCAwareConfig", "KVCAwareStrategyConfig",
           "LeastInflightStrategyConfig", "CollectorConfig", "MetricsConfig", "KVEventEndpoint",
           "load_router_config", "library_defaults", "packaged_config_path", "parse_endpoint"]  # fmt: skip
