"""The balancer configuration: verl's shapes in, the library's JSON out.

The library owns every default, every check and the ``_target_`` allow-list
of the routing configuration (``kvr_validate_config``, ``kvr_config_schema``;
docs/configuration.md). This module only accepts verl's shapes
(:func:`load_router_config`: ``None``, a router type, a YAML path, the whole
``{"router": {"type", "config"}}`` block, the ``{"type", "config"}`` block,
the inner ``config`` mapping, dicts or OmegaConf, or a :class:`RouterConfig`),
resolves ``_target_`` through the library's allow-list (nothing is imported),
checks the few keys only Python reads, and passes on what the user set.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Tuple

from . import _native
from .endpoints import KVEventEndpoint, _join, _plain, parse_endpoint
from .errors import ConfigError, NativeError, allowed_text
from .options import (
    _TOP_KEYS,
    CollectorConfig,
    KVCAwareConfig,
    KVCAwareStrategyConfig,
    LeastInflightStrategyConfig,
    MetricsConfig,
    RouterConfig,
    StrategyOptions,
    check_bool,
    check_choice,
    check_int,
    collector_names,
    no_unknown,
    parse_collector,
    parse_metrics,
)

ROUTER_TYPES = ("default", "kvc_aware")
METRICS_FLAVORS = ("vllm", "sglang")
#: ``kv_events``: ``auto`` gives every vLLM replica a KV-event publisher
#: (kvc_router.verl); ``off`` leaves the servers alone.
KV_EVENTS_MODES = ("off", "auto")
_ROUTER_KEYS = ("sticky_max_size", "load_threshold", "sticky_overload", "block_size", "model", "speculate",
                "events_default", "max_prompt_tokens", "servers", "index", "load", "admission",
                "session_moves")  # fmt: skip
_PY_KEYS = ("metrics_flavor", "kv_events", "kv_events_base_port", "enable_server_metrics", "metrics")
_INNER_KEYS = ("strategies", "collector", *_ROUTER_KEYS, *_TOP_KEYS, *_PY_KEYS)
_CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def __getattr__(name: str) -> Any:
    """``STRATEGY_TARGETS`` and ``COLLECTOR_NAMES`` come from the library."""
    if name == "STRATEGY_TARGETS":
        return dict(_native.config_schema()["targets"])
    if name == "COLLECTOR_NAMES":
        return _collectors()
    raise AttributeError(name)


def library_defaults(router_type: str = "default") -> dict:
    """The library's effective configuration for a router type: its defaults."""
    if router_type not in ROUTER_TYPES:
        raise ConfigError(f"router type {router_type!r} (allowed: {allowed_text(ROUTER_TYPES)})", key="type")
    return _native.validate_config({"router": {"mode": router_type}})


def packaged_config_path(name: str) -> str:
    """Path of a packaged YAML config (``default`` or ``kvc_aware``)."""
    return os.path.join(_CONFIG_DIR, f"{name}.yaml")


def _read_yaml(path: str) -> Any:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except RecursionError:
        raise ConfigError(
            f"router config {path!r} is nested too deeply to read (limit {MAX_CONFIG_DEPTH} levels)",
            key="router_config",
        ) from None
    except OSError as e:
        raise ConfigError(f"cannot read router config {path!r}: {e}", key="router_config") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"router config {path!r} is not valid YAML: {e}", key="router_config") from e


#: Deepest nesting accepted in a router config (real ones are < 8 deep).
MAX_CONFIG_DEPTH = 64


def _check_depth(value: Any, key: str = "router_config") -> None:
    """Refuses a config nested deeper than MAX_CONFIG_DEPTH (or holding a
    cycle) with a ConfigError naming where, before anything recursive (JSON
    encoding, the parsers) walks it. Iterative, so it cannot hit Python's
    recursion limit itself."""
    stack = [(value, key, 0)]
    while stack:
        v, p, depth = stack.pop()
        if isinstance(v, (Mapping, list, tuple)) and depth >= MAX_CONFIG_DEPTH:
            raise ConfigError(
                f"{p}: nested more than {MAX_CONFIG_DEPTH} levels deep (or a mapping that contains itself)", key=p
            )
        if isinstance(v, Mapping):
            stack.extend((x, f"{p}.{k}", depth + 1) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((x, f"{p}[{i}]", depth + 1) for i, x in enumerate(v))


def load_router_config(source: Any = None, validate: bool = True) -> RouterConfig:
    """Any accepted input as a :class:`RouterConfig`; with ``validate`` the
    library checks it too, so every error is a :class:`ConfigError` here."""
    cfg = _load(source)
    if validate:
        cfg.validate()
    return cfg


def _load(src: Any) -> RouterConfig:
    if isinstance(src, RouterConfig):
        return src
    if src is None or (isinstance(src, str) and src in ROUTER_TYPES):
        src = packaged_config_path(src or "default")
    if isinstance(src, os.PathLike) or (
        isinstance(src, str) and (src.endswith((".yaml", ".yml")) or os.path.isfile(src))
    ):
        data = _read_yaml(os.fspath(src))
        return _parse_any({} if data is None else data)
    if isinstance(src, str):
        raise ConfigError(f"router_config: {src!r} is neither a router type ({allowed_text(ROUTER_TYPES)}) "
                          "nor a YAML file path", key="router_config", allowed=ROUTER_TYPES)  # fmt: skip
    return _parse_any(src, "router_config must be a dict, DictConfig, YAML path or None")


def _parse_any(data: Any, what: str = "router config must be a mapping") -> RouterConfig:
    data = _plain(data)
    _check_depth(data)
    data = _strategy_dict(data)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{what}, got {type(data).__name__}", key="router_config")
    if "router_class" in data:  # verl >= 0.9.1 router_config_path: the whole YAML
        data = {k: v for k, v in data.items() if k != "router_class"}
        if not data:
            return _load("kvc_aware")
    if "router" in data:
        no_unknown(data, ("router",), "")
        return _parse_block(_plain(data["router"]), "router")
    if "type" in data or (data and set(data) <= {"config"}):
        return _parse_block(data, "")
    return _parse_inner(data, "", "kvc_aware")


def _parse_block(block: Any, prefix: str) -> RouterConfig:
    where = prefix or "router_config"
    block = {} if block is None else block
    if not isinstance(block, Mapping):
        raise ConfigError(f"{where} must be a mapping, got {type(block).__name__}", key=where)
    no_unknown(block, ("type", "config"), prefix)
    rtype = check_choice(block.get("type", "default"), _join(prefix, "type"), ROUTER_TYPES)
    inner = _plain(block.get("config"))
    return _load(rtype) if inner is None else _parse_inner(inner, _join(prefix, "config"), rtype)


def _names(rtype: str, names: List[str]) -> Tuple[str, ...]:
    """Collectors to run, vllm_polling as vllm_metrics, once each (none in
    the default mode: it reads no live state)."""
    out: List[str] = []
    for n in ("vllm_metrics" if n == "vllm_polling" else n for n in names):
        if rtype == "kvc_aware" and n not in out:
            out.append(n)
    return tuple(out)


def _parse_inner(cfg: Any, prefix: str, rtype: str) -> RouterConfig:
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{prefix or 'router_config'} must be a mapping, got {type(cfg).__name__}",
                          key=prefix or "router_config")  # fmt: skip
    no_unknown(cfg, _INNER_KEYS, prefix)
    p = lambda k: _join(prefix, k)  # noqa: E731
    strategies, wanted, keys = _parse_strategies(_plain(cfg.get("strategies")), p("strategies"))
    coll = parse_collector(_plain(cfg.get("collector")), p("collector"), _collectors())
    kv = cfg.get("kv_events")
    return RouterConfig(
        type=rtype, strategies=tuple(strategies), collector_names=_names(rtype, [*coll.names, *wanted]),
        router={k: _plain(cfg[k]) for k in _ROUTER_KEYS if cfg.get(k) is not None},
        max_procs=cfg.get("max_procs"), log_level=cfg.get("log_level"), collector=coll,
        metrics_flavor=check_choice(cfg.get("metrics_flavor"), p("metrics_flavor"), METRICS_FLAVORS) or "vllm",
        kv_events="off" if kv is None or kv is False else check_choice(kv, p("kv_events"), KV_EVENTS_MODES),
        kv_events_base_port=check_int(cfg.get("kv_events_base_port"), p("kv_events_base_port"), 0, 65535) or 0,
        enable_server_metrics=bool(check_bool(cfg.get("enable_server_metrics"), p("enable_server_metrics"))),
        metrics=parse_metrics(_plain(cfg.get("metrics")), p("metrics")),
        prefix=prefix, strategy_keys=tuple(keys),
    )  # fmt: skip


def _strategy_dict(s: Any) -> Any:
    return s.to_dict() if isinstance(s, StrategyOptions) else s


def _collectors() -> Tuple[str, ...]:
    return tuple(_native.config_schema()["collectors"])


def _parse_strategies(value: Any, key: str) -> Tuple[List[dict], List[str], List[str]]:
    """Native specs, the collectors they ask for, and the key naming each."""
    if value is None:
        return [], [], []
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key} must be a list of strategies, got {type(value).__name__}", key=key)
    specs, wanted, keys = [], [], []
    targets = dict(_native.config_schema()["targets"])
    allowed = tuple(sorted(targets))
    for i, s in enumerate(_plain(_strategy_dict(v)) for v in value):
        prefix = f"{key}[{i}]"
        if not isinstance(s, Mapping):
            raise ConfigError(f"{prefix} must be a mapping, got {type(s).__name__}", key=prefix)
        name, tkey = None, _join(prefix, "_target_")
        if "_target_" in s:
            if not isinstance(s["_target_"], str) or s["_target_"] not in targets:
                raise ConfigError(f"{tkey}: {s['_target_']!r} is not an allowed strategy (allowed: "
                                  f"{allowed_text(allowed)})", key=tkey, allowed=allowed)  # fmt: skip
            name = targets[s["_target_"]]
        if "name" in s and name is not None and s["name"] != name:
            nkey = _join(prefix, "name")
            raise ConfigError(f"{nkey}: {s['name']!r} contradicts _target_ ({name!r})", key=nkey, allowed=(name,))
        name = s.get("name", name)
        if name is None:
            raise ConfigError(f"{prefix}: a strategy needs '_target_' (allowed: {allowed_text(allowed)}) or 'name'",
                              key=prefix, allowed=allowed)  # fmt: skip
        spec: Dict[str, Any] = {"name": name, "weight": 1.0 if s.get("weight") is None else s["weight"]}
        params = {k: _plain(v) for k, v in s.items() if k not in ("_target_", "name", "weight", "collector_names")}
        if any(v is not None for v in params.values()):
            spec["params"] = {k: v for k, v in params.items() if v is not None}
        specs.append(spec)
        wanted.extend(collector_names(s.get("collector_names"), _join(prefix, "collector_names"), _collectors()))
        keys.append("name" if "name" in s else "_target_")
    return specs, wanted, keys


__all__ = ["ConfigError", "NativeError", "RouterConfig", "KVCAwareConfig", "KVCAwareStrategyConfig",
           "LeastInflightStrategyConfig", "CollectorConfig", "MetricsConfig", "KVEventEndpoint", "KV_EVENTS_MODES",
           "load_router_config", "library_defaults", "packaged_config_path", "parse_endpoint"]  # fmt: skip
