"""Typed configuration of the balancer and its translation to the native JSON.

Accepted inputs (:func:`load_router_config`):

* ``None``: the packaged default mode (``configs/default.yaml``), which routes
  exactly like verl's ``GlobalRequestLoadBalancer``;
* ``"default"`` / ``"kvc_aware"``: the packaged defaults of that mode;
* a YAML file path (``str`` ending in ``.yaml``/``.yml``, or ``os.PathLike``);
* a ``dict`` or an OmegaConf ``DictConfig``, in any of three shapes: the whole
  ``{"router": {"type": ..., "config": {...}}}`` block, the ``{"type", "config"}``
  block, or the inner ``config`` mapping (then the type is ``kvc_aware``);
* a :class:`RouterConfig` (used as is).

``type: kvc_aware`` without a ``config`` uses ``configs/kvc_aware.yaml``.
Strategy ``_target_`` strings only select entries of an allow-list
(:data:`STRATEGY_TARGETS`); nothing is ever imported from a configuration.
Any unknown key, wrong type or out-of-range value raises :class:`ConfigError`
naming the key path and the allowed values.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .errors import ConfigError, allowed_text

ROUTER_TYPES = ("default", "kvc_aware")
COLLECTOR_NAMES = ("vllm_metrics", "vllm_polling", "sglang_metrics", "vllm_zmq")
METRICS_COLLECTORS = ("vllm_metrics", "vllm_polling", "sglang_metrics")
TIERS = ("gpu", "cpu", "ssd")
METRICS_FLAVORS = ("vllm", "sglang")
LOG_LEVELS = ("debug", "info", "warn", "error")

_KVC = "kvc_aware"
_LEAST = "least_inflight"

#: ``_target_`` strings accepted for strategies, mapped to native strategy names.
STRATEGY_TARGETS: Dict[str, str] = {
    # Upstream verl PR #6940 (verl.workers.rollout.llm_router) and its re-exports.
    "verl.workers.rollout.llm_router.config.strategy.KVCAwareStrategyConfig": _KVC,
    "verl.workers.rollout.llm_router.config.KVCAwareStrategyConfig": _KVC,
    "verl.workers.rollout.llm_router.KVCAwareStrategyConfig": _KVC,
    # This package.
    "kvc_router.config.KVCAwareStrategyConfig": _KVC,
    "kvc_router.KVCAwareStrategyConfig": _KVC,
    "kvc_router.config.LeastInflightStrategyConfig": _LEAST,
    "kvc_router.LeastInflightStrategyConfig": _LEAST,
}
STRATEGY_NAMES = (_KVC, _LEAST)

_CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


# --------------------------------------------------------------------------
# Dataclasses


@dataclass(frozen=True)
class KVCAwareStrategyConfig:
    """Prefix-cache hits per tier combined with load (see core/strategy)."""

    alpha: float = 0.3
    load_threshold: float = 0.9
    layer_weights: Mapping[str, float] = field(default_factory=lambda: {"gpu": 0.7, "cpu": 0.2, "ssd": 0.1})
    collector_names: Tuple[str, ...] = ()
    weight: float = 1.0
    # Refinements (core/strategy KVCAware): credit only hits beyond the
    # least-hit server; load at least in-flight prompt tokens / KV capacity
    # (kv_tokens when a server reports none); credit scaled by
    # min(1, saved tokens / saved_scale_tokens), 0 disables the scale.
    marginal: bool = True
    token_load: bool = True
    saved_scale_tokens: int = 4096
    kv_tokens: int = 480_000

    name = _KVC

    def native(self) -> dict:
        return {
            "name": _KVC,
            "weight": self.weight,
            "params": {
                "alpha": self.alpha,
                "load_threshold": self.load_threshold,
                "layer_weights": dict(self.layer_weights),
                "marginal": self.marginal,
                "token_load": self.token_load,
                "saved_scale_tokens": self.saved_scale_tokens,
                "kv_tokens": self.kv_tokens,
            },
        }


@dataclass(frozen=True)
class LeastInflightStrategyConfig:
    """verl's default: fewest in-flight requests, ties to the first-added server."""

    weight: float = 1.0
    collector_names: Tuple[str, ...] = ()

    name = _LEAST

    def native(self) -> dict:
        return {"name": _LEAST, "weight": self.weight}


@dataclass(frozen=True)
class KVEventEndpoint:
    """One KV-event publisher of a server (one per data-parallel rank)."""

    endpoint: str
    replay: Optional[str] = None
    topic: str = ""

    def native(self) -> dict:
        d: Dict[str, Any] = {"endpoint": self.endpoint}
        if self.replay:
            d["replay"] = self.replay
        if self.topic:
            d["topic"] = self.topic
        return d


@dataclass(frozen=True)
class CollectorConfig:
    """Settings shared by the collectors named in ``collector_names``."""

    names: Tuple[str, ...] = ()
    # Metrics pollers (vllm_metrics / vllm_polling / sglang_metrics).
    interval_ms: int = 0
    timeout_ms: int = 0
    max_bytes: int = 0
    backoff_max_ms: int = 0
    urls: Mapping[str, str] = field(default_factory=dict)
    # KV-event subscriber (vllm_zmq).
    endpoints: Mapping[str, Tuple[KVEventEndpoint, ...]] = field(default_factory=dict)
    topic: str = ""
    use_handle_endpoints: bool = True
    handle_timeout_ms: int = 5000
    replay_timeout_ms: int = 0
    idle_redial_ms: int = 0
    retry_ms: int = 0
    max_payload_bytes: int = 0
    # Health: consecutive scrape failures that mark a server unhealthy.
    unhealthy_after: int = 0


@dataclass(frozen=True)
class ServerOverride:
    block_size: int = 0
    capacity: int = 0
    events: Optional[bool] = None

    def native(self) -> dict:
        d: Dict[str, Any] = {}
        if self.block_size:
            d["block_size"] = self.block_size
        if self.capacity:
            d["capacity"] = self.capacity
        if self.events is not None:
            d["events"] = self.events
        return d


@dataclass(frozen=True)
class RouterConfig:
    """The whole balancer configuration (``router.type`` + ``router.config``)."""

    type: str = "default"
    strategies: Tuple[Any, ...] = ()
    sticky_max_size: Optional[int] = None
    load_threshold: Optional[float] = None
    sticky_overload: Optional[bool] = None
    block_size: Optional[int] = None
    model: str = ""
    speculate: Optional[bool] = None
    events_default: Optional[bool] = None
    max_prompt_tokens: Optional[int] = None
    max_procs: int = 0
    metrics_flavor: str = "vllm"
    log_level: str = "warn"
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    servers: Mapping[str, ServerOverride] = field(default_factory=dict)
    index: Mapping[str, int] = field(default_factory=dict)
    load: Mapping[str, int] = field(default_factory=dict)
    # Integration keys, read by kvc_router.verl_hook and ignored by the
    # balancer itself: how verl launches the rollout servers.
    kv_events: str = "off"
    kv_events_base_port: int = 0
    enable_server_metrics: bool = False

    @property
    def collector_names(self) -> Tuple[str, ...]:
        """Collectors to start (deduplicated; vllm_polling is vllm_metrics)."""
        if self.type != _KVC:
            return ()
        seen: List[str] = []
        for name in list(self.collector.names) + [n for s in self.strategies for n in s.collector_names]:
            canon = "vllm_metrics" if name == "vllm_polling" else name
            if canon not in seen:
                seen.append(canon)
        return tuple(seen)

    def native(self, sticky_default: int = 10000) -> dict:
        """The JSON object passed to kvr_router_new."""
        r: Dict[str, Any] = {
            "mode": self.type,
            "sticky_max_size": self.sticky_max_size if self.sticky_max_size is not None else sticky_default,
        }
        strategies = list(self.strategies)
        if self.type == "default" and not strategies:
            strategies = [LeastInflightStrategyConfig()]
        if strategies:
            r["strategies"] = [s.native() for s in strategies]
        for key in (
            "load_threshold",
            "sticky_overload",
            "block_size",
            "speculate",
            "events_default",
            "max_prompt_tokens",
        ):
            v = getattr(self, key)
            if v is not None:
                r[key] = v
        if self.model:
            r["model"] = self.model
        if self.servers:
            r["servers"] = {sid: o.native() for sid, o in self.servers.items()}
        if self.index:
            r["index"] = dict(self.index)
        load = dict(self.load)
        if self.collector.unhealthy_after and "unhealthy_after" not in load:
            load["unhealthy_after"] = self.collector.unhealthy_after
        if load:
            r["load"] = load
        return {
            "router": r,
            "collectors": {"collectors": self._native_collectors()},
            "max_procs": self.max_procs,
            "log_level": self.log_level,
        }

    def _native_collectors(self) -> List[dict]:
        c = self.collector
        out = []
        for name in self.collector_names:
            spec: Dict[str, Any] = {"name": name}
            if name in METRICS_COLLECTORS:
                for key in ("interval_ms", "timeout_ms", "max_bytes", "backoff_max_ms"):
                    if getattr(c, key):
                        spec[key] = getattr(c, key)
                if c.urls:
                    spec["urls"] = dict(c.urls)
            else:
                for key in ("replay_timeout_ms", "idle_redial_ms", "retry_ms", "max_payload_bytes"):
                    if getattr(c, key):
                        spec[key] = getattr(c, key)
                if c.endpoints:
                    spec["endpoints"] = {sid: [e.native() for e in eps] for sid, eps in c.endpoints.items()}
            out.append(spec)
        return out


#: Name used by upstream PR #6940 for the same object.
KVCAwareConfig = RouterConfig


# --------------------------------------------------------------------------
# Loading


def packaged_config_path(name: str) -> str:
    """Path of a packaged YAML config (``default`` or ``kvc_aware``)."""
    return os.path.join(_CONFIG_DIR, f"{name}.yaml")


def _read_yaml(path: str) -> Any:
    try:
        import yaml
    except ImportError as e:  # pragma: no cover - pyyaml is a dependency
        raise ConfigError("reading YAML configs needs pyyaml (pip install pyyaml)") from e
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"cannot read router config {path!r}: {e}", key="router_config") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"router config {path!r} is not valid YAML: {e}", key="router_config") from e


def _is_omegaconf(obj: Any) -> bool:
    mod = type(obj).__module__ or ""
    return mod.startswith("omegaconf") and type(obj).__name__ in ("DictConfig", "ListConfig")


def _plain(obj: Any) -> Any:
    if _is_omegaconf(obj):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(obj, resolve=True)
    return obj


def load_router_config(source: Any = None) -> RouterConfig:
    """Parses any accepted configuration input into a :class:`RouterConfig`."""
    if isinstance(source, RouterConfig):
        return source
    if source is None:
        return load_router_config(packaged_config_path("default"))
    if isinstance(source, str) and source in ROUTER_TYPES:
        return load_router_config(packaged_config_path(source))
    if isinstance(source, os.PathLike) or (
        isinstance(source, str) and (source.endswith((".yaml", ".yml")) or os.path.isfile(source))
    ):
        data = _read_yaml(os.fspath(source))
        if data is None:
            data = {}
        return _parse_any(data)
    if isinstance(source, str):
        raise ConfigError(
            f"router_config: {source!r} is neither a router type ({allowed_text(ROUTER_TYPES)}) nor a YAML file path",
            key="router_config",
            allowed=ROUTER_TYPES,
        )
    source = _plain(source)
    if not isinstance(source, Mapping):
        raise ConfigError(
            f"router_config must be a dict, DictConfig, YAML path or None, got {type(source).__name__}",
            key="router_config",
        )
    return _parse_any(source)


def _parse_any(data: Any) -> RouterConfig:
    data = _plain(data)
    if not isinstance(data, Mapping):
        raise ConfigError(f"router config must be a mapping, got {type(data).__name__}", key="router_config")
    if "router_class" in data:
        # verl >= 0.9.1 ``rollout.router_config_path``: the whole YAML reaches
        # the constructor; ``router_class`` only told verl which class to load.
        data = {k: v for k, v in data.items() if k != "router_class"}
        if not data:
            return load_router_config(packaged_config_path(_KVC))
    if "router" in data:
        extra = sorted(set(data) - {"router"})
        if extra:
            raise ConfigError(
                f"unknown key {extra[0]!r} next to 'router' (allowed: 'router')", key=extra[0], allowed=("router",)
            )
        return _parse_block(_plain(data["router"]), "router")
    if "type" in data or (data and set(data) <= {"config"}):
        return _parse_block(data, "")
    return _parse_inner(data, "", _KVC)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _parse_block(block: Any, prefix: str) -> RouterConfig:
    where = prefix or "router_config"
    if block is None:
        block = {}
    if not isinstance(block, Mapping):
        raise ConfigError(f"{where} must be a mapping, got {type(block).__name__}", key=where)
    _no_unknown(block, ("type", "config"), prefix)
    rtype = block.get("type", "default")
    if rtype not in ROUTER_TYPES:
        key = _join(prefix, "type")
        raise ConfigError(f"{key}: {rtype!r} (allowed: {allowed_text(ROUTER_TYPES)})", key=key, allowed=ROUTER_TYPES)
    inner = _plain(block.get("config"))
    if inner is None:
        return load_router_config(packaged_config_path(rtype))
    return _parse_inner(inner, _join(prefix, "config"), rtype)


_INNER_KEYS = (
    "strategies",
    "sticky_max_size",
    "load_threshold",
    "sticky_overload",
    "block_size",
    "model",
    "speculate",
    "events_default",
    "max_prompt_tokens",
    "max_procs",
    "metrics_flavor",
    "log_level",
    "collector",
    "servers",
    "index",
    "load",
    "kv_events",
    "kv_events_base_port",
    "enable_server_metrics",
)

#: ``kv_events`` values: ``auto`` gives every vLLM replica its own KV-event
#: publisher through verl's engine kwargs (kvc_router.verl_hook); ``off``
#: leaves the servers alone (approximate mode unless endpoints are listed).
KV_EVENTS_MODES = ("off", "auto")


def _parse_inner(cfg: Any, prefix: str, rtype: str) -> RouterConfig:
    if not isinstance(cfg, Mapping):
        key = prefix or "router_config"
        raise ConfigError(f"{key} must be a mapping, got {type(cfg).__name__}", key=key)
    _no_unknown(cfg, _INNER_KEYS, prefix)
    p = lambda k: _join(prefix, k)  # noqa: E731
    strategies = tuple(_parse_strategies(cfg.get("strategies"), p("strategies")))
    if rtype == _KVC and not strategies:
        key = p("strategies")
        raise ConfigError(
            f"{key}: a kvc_aware router needs at least one strategy (allowed _target_: "
            f"{allowed_text(sorted(STRATEGY_TARGETS))})",
            key=key,
            allowed=tuple(STRATEGY_TARGETS),
        )
    if rtype == "default" and any(s.name != _LEAST for s in strategies):
        key = p("strategies")
        raise ConfigError(
            f"{key}: type 'default' routes by least in-flight only; kvc_aware strategies need type 'kvc_aware'",
            key=key,
            allowed=("kvc_router.config.LeastInflightStrategyConfig",),
        )
    return RouterConfig(
        type=rtype,
        strategies=strategies,
        sticky_max_size=_opt_int(cfg, "sticky_max_size", prefix, lo=1),
        load_threshold=_opt_float(cfg, "load_threshold", prefix, lo=0.0, hi=1.0, lo_open=True),
        sticky_overload=_opt_bool(cfg, "sticky_overload", prefix),
        block_size=_opt_int(cfg, "block_size", prefix, lo=1, hi=65536),
        model=_opt_str(cfg, "model", prefix) or "",
        speculate=_opt_bool(cfg, "speculate", prefix),
        events_default=_opt_bool(cfg, "events_default", prefix),
        max_prompt_tokens=_opt_int(cfg, "max_prompt_tokens", prefix, lo=1, hi=2**31 - 1),
        max_procs=_opt_int(cfg, "max_procs", prefix, lo=0, hi=4096) or 0,
        metrics_flavor=_opt_choice(cfg, "metrics_flavor", prefix, METRICS_FLAVORS) or "vllm",
        log_level=_opt_choice(cfg, "log_level", prefix, LOG_LEVELS) or "warn",
        collector=_parse_collector(_plain(cfg.get("collector")), p("collector")),
        servers=_parse_servers(_plain(cfg.get("servers")), p("servers")),
        index=_parse_int_map(cfg.get("index"), p("index"), ("max_entries", "spec_ttl_ms", "approx_ttl_ms")),
        load=_parse_int_map(cfg.get("load"), p("load"), ("stale_after_ms", "max_num_seqs", "unhealthy_after")),
        kv_events=_parse_kv_events(cfg.get("kv_events"), p("kv_events")),
        kv_events_base_port=_opt_int(cfg, "kv_events_base_port", prefix, lo=0, hi=65535) or 0,
        enable_server_metrics=bool(_opt_bool(cfg, "enable_server_metrics", prefix)),
    )


def _parse_kv_events(value: Any, key: str) -> str:
    if value is None:
        return "off"
    if value is False:  # YAML `off` is the boolean false
        return "off"
    if value not in KV_EVENTS_MODES:
        raise ConfigError(
            f"{key}: {value!r} (allowed: {allowed_text(KV_EVENTS_MODES)})", key=key, allowed=KV_EVENTS_MODES
        )
    return value


def _parse_strategies(value: Any, key: str) -> List[Any]:
    value = _plain(value)
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key} must be a list of strategies, got {type(value).__name__}", key=key)
    return [_parse_strategy(_plain(s), f"{key}[{i}]") for i, s in enumerate(value)]


_KVC_KEYS = (
    "_target_",
    "name",
    "alpha",
    "load_threshold",
    "layer_weights",
    "collector_names",
    "weight",
    "marginal",
    "token_load",
    "saved_scale_tokens",
    "kv_tokens",
)
_LEAST_KEYS = ("_target_", "name", "collector_names", "weight")


def _parse_strategy(s: Any, prefix: str) -> Any:
    if not isinstance(s, Mapping):
        raise ConfigError(f"{prefix} must be a mapping, got {type(s).__name__}", key=prefix)
    name = None
    if "_target_" in s:
        target = s["_target_"]
        key = _join(prefix, "_target_")
        if not isinstance(target, str) or target not in STRATEGY_TARGETS:
            raise ConfigError(
                f"{key}: {target!r} is not an allowed strategy (allowed: {allowed_text(sorted(STRATEGY_TARGETS))})",
                key=key,
                allowed=tuple(sorted(STRATEGY_TARGETS)),
            )
        name = STRATEGY_TARGETS[target]
    if "name" in s:
        key = _join(prefix, "name")
        if s["name"] not in STRATEGY_NAMES:
            raise ConfigError(
                f"{key}: {s['name']!r} (allowed: {allowed_text(STRATEGY_NAMES)})", key=key, allowed=STRATEGY_NAMES
            )
        if name is not None and s["name"] != name:
            raise ConfigError(f"{key}: {s['name']!r} contradicts _target_ ({name!r})", key=key, allowed=(name,))
        name = s["name"]
    if name is None:
        raise ConfigError(
            f"{prefix}: a strategy needs '_target_' (allowed: {allowed_text(sorted(STRATEGY_TARGETS))}) "
            f"or 'name' (allowed: {allowed_text(STRATEGY_NAMES)})",
            key=prefix,
            allowed=tuple(sorted(STRATEGY_TARGETS)),
        )
    weight = _opt_float(s, "weight", prefix, lo=0.0, lo_open=True)
    collectors = _parse_collector_names(s.get("collector_names"), _join(prefix, "collector_names"))
    if name == _LEAST:
        _no_unknown(s, _LEAST_KEYS, prefix)
        return LeastInflightStrategyConfig(weight=1.0 if weight is None else weight, collector_names=collectors)
    _no_unknown(s, _KVC_KEYS, prefix)
    d = KVCAwareStrategyConfig()
    alpha = _opt_float(s, "alpha", prefix, lo=0.0, hi=1.0)
    thr = _opt_float(s, "load_threshold", prefix, lo=0.0, hi=1.0, lo_open=True)
    lw = _plain(s.get("layer_weights"))
    weights = dict(d.layer_weights)
    if lw is not None:
        key = _join(prefix, "layer_weights")
        if not isinstance(lw, Mapping):
            raise ConfigError(f"{key} must be a mapping of tier -> weight, got {type(lw).__name__}", key=key)
        weights = {}
        for tier, w in lw.items():
            if tier not in TIERS:
                raise ConfigError(
                    f"{key}.{tier}: unknown tier (allowed: {allowed_text(TIERS)})", key=f"{key}.{tier}", allowed=TIERS
                )
            weights[tier] = _float(w, f"{key}.{tier}", lo=0.0, hi=1.0)
    marginal = _opt_bool(s, "marginal", prefix)
    token_load = _opt_bool(s, "token_load", prefix)
    saved_scale = _opt_int(s, "saved_scale_tokens", prefix, lo=0)
    kv_tokens = _opt_int(s, "kv_tokens", prefix, lo=1)
    return KVCAwareStrategyConfig(
        alpha=d.alpha if alpha is None else alpha,
        load_threshold=d.load_threshold if thr is None else thr,
        layer_weights=weights,
        collector_names=collectors,
        weight=1.0 if weight is None else weight,
        marginal=d.marginal if marginal is None else marginal,
        token_load=d.token_load if token_load is None else token_load,
        saved_scale_tokens=d.saved_scale_tokens if saved_scale is None else saved_scale,
        kv_tokens=d.kv_tokens if kv_tokens is None else kv_tokens,
    )


def _parse_collector_names(value: Any, key: str) -> Tuple[str, ...]:
    value = _plain(value)
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key} must be a list of collector names, got {type(value).__name__}", key=key)
    for i, n in enumerate(value):
        if n not in COLLECTOR_NAMES:
            raise ConfigError(
                f"{key}[{i}]: {n!r} (allowed: {allowed_text(COLLECTOR_NAMES)})",
                key=f"{key}[{i}]",
                allowed=COLLECTOR_NAMES,
            )
    return tuple(value)


_COLLECTOR_KEYS = (
    "names",
    "interval_ms",
    "timeout_ms",
    "max_bytes",
    "backoff_max_ms",
    "urls",
    "endpoints",
    "topic",
    "use_handle_endpoints",
    "handle_timeout_ms",
    "replay_timeout_ms",
    "idle_redial_ms",
    "retry_ms",
    "max_payload_bytes",
    "unhealthy_after",
)


def _parse_collector(c: Any, prefix: str) -> CollectorConfig:
    if c is None:
        return CollectorConfig()
    if not isinstance(c, Mapping):
        raise ConfigError(f"{prefix} must be a mapping, got {type(c).__name__}", key=prefix)
    _no_unknown(c, _COLLECTOR_KEYS, prefix)
    ints = {}
    for k in ("interval_ms", "timeout_ms", "backoff_max_ms", "replay_timeout_ms", "idle_redial_ms", "retry_ms"):
        ints[k] = _opt_int(c, k, prefix, lo=0, hi=24 * 3600 * 1000) or 0
    for k in ("max_bytes", "max_payload_bytes"):
        ints[k] = _opt_int(c, k, prefix, lo=0, hi=2**31 - 1) or 0
    handle_timeout = _opt_int(c, "handle_timeout_ms", prefix, lo=1, hi=3600 * 1000)
    urls = _plain(c.get("urls")) or {}
    if not isinstance(urls, Mapping):
        raise ConfigError(f"{_join(prefix, 'urls')} must be a mapping of server id -> URL", key=_join(prefix, "urls"))
    for sid, u in urls.items():
        k = f"{_join(prefix, 'urls')}[{sid!r}]"
        if not isinstance(u, str) or not u.startswith(("http://", "https://")):
            raise ConfigError(f"{k}: {u!r} is not an http(s) URL", key=k, allowed=("http://...", "https://..."))
    topic = _opt_str(c, "topic", prefix) or ""
    return CollectorConfig(
        names=_parse_collector_names(c.get("names"), _join(prefix, "names")),
        urls=dict(urls),
        endpoints=_parse_endpoints(_plain(c.get("endpoints")), _join(prefix, "endpoints"), topic),
        topic=topic,
        use_handle_endpoints=_opt_bool(c, "use_handle_endpoints", prefix) is not False,
        handle_timeout_ms=5000 if handle_timeout is None else handle_timeout,
        unhealthy_after=_opt_int(c, "unhealthy_after", prefix, lo=0, hi=1_000_000) or 0,
        **ints,
    )


def parse_endpoint(value: Any, key: str, topic: str = "") -> KVEventEndpoint:
    """One endpoint from a string or a mapping {endpoint, replay, topic}."""
    value = _plain(value)
    if isinstance(value, str):
        return KVEventEndpoint(endpoint=normalise_endpoint(value, key), topic=topic)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be an endpoint string or mapping, got {type(value).__name__}", key=key)
    _no_unknown(value, ("endpoint", "replay", "replay_endpoint", "topic"), key)
    if "endpoint" not in value:
        raise ConfigError(f"{key}: missing 'endpoint'", key=_join(key, "endpoint"))
    replay = value.get("replay", value.get("replay_endpoint"))
    t = value.get("topic", topic)
    if t is None:
        t = ""
    if not isinstance(t, str):
        raise ConfigError(f"{_join(key, 'topic')} must be a string", key=_join(key, "topic"))
    return KVEventEndpoint(
        endpoint=normalise_endpoint(value["endpoint"], _join(key, "endpoint")),
        replay=None if replay in (None, "") else normalise_endpoint(replay, _join(key, "replay")),
        topic=t,
    )


def normalise_endpoint(value: Any, key: str) -> str:
    """``host:port`` becomes ``tcp://host:port``; tcp:// and ipc:// pass."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key} must be a non-empty string, got {value!r}", key=key)
    if "://" not in value:
        value = "tcp://" + value
    if not value.startswith(("tcp://", "ipc://")):
        raise ConfigError(f"{key}: {value!r} (allowed schemes: tcp://, ipc://)", key=key, allowed=("tcp", "ipc"))
    return value


def _parse_endpoints(value: Any, key: str, topic: str) -> Dict[str, Tuple[KVEventEndpoint, ...]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be a mapping of server id -> endpoints", key=key)
    out = {}
    for sid, eps in value.items():
        k = f"{key}[{sid!r}]"
        eps = _plain(eps)
        if not isinstance(eps, (list, tuple)):
            eps = [eps]
        out[str(sid)] = tuple(parse_endpoint(e, f"{k}[{i}]", topic) for i, e in enumerate(eps))
    return out


def _parse_servers(value: Any, key: str) -> Dict[str, ServerOverride]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be a mapping of server id -> settings", key=key)
    out = {}
    for sid, s in value.items():
        k = f"{key}[{sid!r}]"
        s = _plain(s)
        if not isinstance(s, Mapping):
            raise ConfigError(f"{k} must be a mapping", key=k)
        _no_unknown(s, ("block_size", "capacity", "events"), k)
        out[str(sid)] = ServerOverride(
            block_size=_opt_int(s, "block_size", k, lo=1, hi=65536) or 0,
            capacity=_opt_int(s, "capacity", k, lo=0, hi=2**31 - 1) or 0,
            events=_opt_bool(s, "events", k),
        )
    return out


def _parse_int_map(value: Any, key: str, keys: Tuple[str, ...]) -> Dict[str, int]:
    value = _plain(value)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be a mapping", key=key)
    _no_unknown(value, keys, key)
    return {k: _int(v, _join(key, k), lo=0, hi=2**31 - 1) for k, v in value.items()}


# --------------------------------------------------------------------------
# Scalar validation


def _no_unknown(m: Mapping, allowed: Tuple[str, ...], prefix: str) -> None:
    for k in m:
        if k not in allowed:
            key = _join(prefix, str(k))
            raise ConfigError(
                f"{key}: unknown key (allowed keys here: {allowed_text(allowed)})", key=key, allowed=allowed
            )


def _range_text(lo: Any, hi: Any, lo_open: bool = False) -> str:
    left = "(" if lo_open else "["
    return f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"


def _int(v: Any, key: str, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{key} must be an integer in {_range_text(lo, hi)}, got {v!r}", key=key, allowed=(lo, hi))
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ConfigError(f"{key} must be in {_range_text(lo, hi)}, got {v}", key=key, allowed=(lo, hi))
    return v


def _float(v: Any, key: str, lo: Optional[float] = None, hi: Optional[float] = None, lo_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(
            f"{key} must be a number in {_range_text(lo, hi, lo_open)}, got {v!r}", key=key, allowed=(lo, hi)
        )
    v = float(v)
    bad = math.isnan(v) or math.isinf(v)
    bad = bad or (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi)
    if bad:
        raise ConfigError(f"{key} must be in {_range_text(lo, hi, lo_open)}, got {v}", key=key, allowed=(lo, hi))
    return v


def _opt_int(m: Mapping, k: str, prefix: str, lo: Optional[int] = None, hi: Optional[int] = None) -> Optional[int]:
    v = m.get(k)
    return None if v is None else _int(v, _join(prefix, k), lo, hi)


def _opt_float(
    m: Mapping, k: str, prefix: str, lo: Optional[float] = None, hi: Optional[float] = None, lo_open: bool = False
) -> Optional[float]:
    v = m.get(k)
    return None if v is None else _float(v, _join(prefix, k), lo, hi, lo_open)


def _opt_bool(m: Mapping, k: str, prefix: str) -> Optional[bool]:
    v = m.get(k)
    if v is None:
        return None
    if not isinstance(v, bool):
        key = _join(prefix, k)
        raise ConfigError(f"{key} must be true or false, got {v!r}", key=key, allowed=(True, False))
    return v


def _opt_str(m: Mapping, k: str, prefix: str) -> Optional[str]:
    v = m.get(k)
    if v is None:
        return None
    if not isinstance(v, str):
        key = _join(prefix, k)
        raise ConfigError(f"{key} must be a string, got {v!r}", key=key)
    return v


def _opt_choice(m: Mapping, k: str, prefix: str, choices: Tuple[str, ...]) -> Optional[str]:
    v = m.get(k)
    if v is None:
        return None
    if v not in choices:
        key = _join(prefix, k)
        raise ConfigError(f"{key}: {v!r} (allowed: {allowed_text(choices)})", key=key, allowed=choices)
    return v


__all__ = [
    "ConfigError",
    "RouterConfig",
    "KVCAwareConfig",
    "KVCAwareStrategyConfig",
    "LeastInflightStrategyConfig",
    "CollectorConfig",
    "KVEventEndpoint",
    "ServerOverride",
    "STRATEGY_TARGETS",
    "COLLECTOR_NAMES",
    "load_router_config",
    "packaged_config_path",
    "KV_EVENTS_MODES",
    "parse_endpoint",
]
