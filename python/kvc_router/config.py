"""The balancer configuration: verl's shapes in, the library's JSON out.

The Go library owns every default and every check of the routing
configuration (``kvr_validate_config``). This module only

* accepts verl's shapes (:func:`load_router_config`): ``None`` (the packaged
  ``default`` mode, exactly verl's ``GlobalRequestLoadBalancer``), a router
  type name, a YAML path, a ``dict`` or OmegaConf ``DictConfig`` holding the
  whole ``{"router": {"type", "config"}}`` block, the ``{"type", "config"}``
  block or the inner ``config`` mapping (then the type is ``kvc_aware``), or a
  :class:`RouterConfig`;
* resolves strategy ``_target_`` strings through an allow-list
  (:data:`STRATEGY_TARGETS`; nothing is ever imported from a configuration);
* translates what the user set -- and nothing else -- into the library's JSON
  (:meth:`RouterConfig.native`), and checks the few keys only Python reads
  (``metrics_flavor``, ``kv_events*``, ``enable_server_metrics``, the
  collector's handle and endpoint settings);
* asks the library to validate, turning its error into a :class:`ConfigError`
  that names the key as the user wrote it.

:func:`library_defaults` reports the library's defaults (``configs/kvc_aware.yaml``
is checked against them by the tests).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple

from .errors import ConfigError, NativeError, allowed_text

ROUTER_TYPES = ("default", "kvc_aware")
COLLECTOR_NAMES = ("vllm_metrics", "vllm_polling", "sglang_metrics", "vllm_zmq")
METRICS_FLAVORS = ("vllm", "sglang")
#: ``kv_events`` values: ``auto`` gives every vLLM replica its own KV-event
#: publisher through verl's engine kwargs (kvc_router.verl); ``off``
#: leaves the servers alone (approximate mode unless endpoints are listed).
KV_EVENTS_MODES = ("off", "auto")

_KVC = "kvc_aware"
_LEAST = "least_inflight"


@dataclass(frozen=True)
class KVCAwareStrategyConfig:
    """The kvc_aware strategy, as verl PR #6940 names it (also its
    ``_target_``). Every field left ``None`` takes the library's default
    (:func:`library_defaults`); the library validates the values. Usable as a
    list entry of ``strategies`` or of :class:`RouterConfig`."""

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

    name: ClassVar[str] = _KVC
    target: ClassVar[str] = "kvc_router.config.KVCAwareStrategyConfig"

    def to_dict(self) -> Dict[str, Any]:
        """The mapping form with only the fields that were set."""
        out: Dict[str, Any] = {"_target_": self.target}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = dict(v) if isinstance(v, Mapping) else list(v) if isinstance(v, tuple) else v
        return out


@dataclass(frozen=True)
class LeastInflightStrategyConfig:
    """verl's default: fewest in-flight requests, ties to the first-added
    server."""

    weight: Optional[float] = None

    name: ClassVar[str] = _LEAST
    target: ClassVar[str] = "kvc_router.config.LeastInflightStrategyConfig"

    def to_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"_target_": self.target}
        if self.weight is not None:
            out["weight"] = self.weight
        return out


#: ``_target_`` strings accepted for strategies, mapped to native strategy names.
STRATEGY_TARGETS: Dict[str, str] = {
    # Upstream verl's llm_router config classes and their re-exports.
    "verl.workers.rollout.llm_router.config.strategy.KVCAwareStrategyConfig": _KVC,
    "verl.workers.rollout.llm_router.config.KVCAwareStrategyConfig": _KVC,
    "verl.workers.rollout.llm_router.KVCAwareStrategyConfig": _KVC,
    # This package.
    "kvc_router.config.KVCAwareStrategyConfig": _KVC,
    "kvc_router.KVCAwareStrategyConfig": _KVC,
    "kvc_router.config.LeastInflightStrategyConfig": _LEAST,
    "kvc_router.LeastInflightStrategyConfig": _LEAST,
}

# Keys of router.config by destination. The library validates the values of
# the first two groups (and everything nested in them).
_ROUTER_KEYS = (
    "sticky_max_size",
    "load_threshold",
    "sticky_overload",
    "block_size",
    "model",
    "speculate",
    "events_default",
    "max_prompt_tokens",
    "servers",
    "index",
    "load",
)
_TOP_KEYS = ("max_procs", "log_level")
_PY_KEYS = ("metrics_flavor", "kv_events", "kv_events_base_port", "enable_server_metrics")
_INNER_KEYS = ("strategies", "collector", *_ROUTER_KEYS, *_TOP_KEYS, *_PY_KEYS)
# Collector keys only Python reads; every other collector key goes to each
# native collector spec.
_PY_COLLECTOR_KEYS = ("names", "endpoints", "topic", "use_handle_endpoints", "handle_timeout_ms", "unhealthy_after")

_CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


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
    """``router.config.collector``: what the balancer reads itself, plus the
    library's collector keys exactly as the user set them (``native``)."""

    names: Tuple[str, ...] = ()
    endpoints: Mapping[str, Tuple[KVEventEndpoint, ...]] = field(default_factory=dict)
    topic: str = ""
    use_handle_endpoints: bool = True
    handle_timeout_ms: int = 5000
    unhealthy_after: Optional[int] = None
    native: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RouterConfig:
    """The whole balancer configuration (``router.type`` + ``router.config``).

    ``strategies`` are native strategy specs (``{"name", "weight"?, "params"?}``)
    and ``router`` the other library router keys, each holding only what the
    user set; ``prefix`` is where ``config`` sat in the user's input, so
    library errors name the key as written.
    """

    type: str = "default"
    strategies: Tuple[Mapping[str, Any], ...] = ()
    collector_names: Tuple[str, ...] = ()
    router: Mapping[str, Any] = field(default_factory=dict)
    max_procs: Optional[int] = None
    log_level: Optional[str] = None
    metrics_flavor: str = "vllm"
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    # Integration keys, read by kvc_router.verl: how verl launches the
    # rollout servers.
    kv_events: str = "off"
    kv_events_base_port: int = 0
    enable_server_metrics: bool = False
    prefix: str = field(default="", compare=False)
    # Which key named each strategy ("name" or "_target_"), for error keys.
    strategy_keys: Tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        # RouterConfig(strategies=(KVCAwareStrategyConfig(...),)) is built
        # directly by callers; turn such entries into native specs here.
        if not any(isinstance(s, (KVCAwareStrategyConfig, LeastInflightStrategyConfig)) for s in self.strategies):
            return
        specs, wanted, named_by = _parse_strategies(list(self.strategies), _join(self.prefix, "strategies"))
        names = list(self.collector_names)
        if self.type == _KVC:
            for n in wanted:
                canon = "vllm_metrics" if n == "vllm_polling" else n
                if canon not in names:
                    names.append(canon)
        object.__setattr__(self, "strategies", tuple(specs))
        object.__setattr__(self, "collector_names", tuple(names))
        object.__setattr__(self, "strategy_keys", tuple(named_by))

    @property
    def sticky_max_size(self) -> Optional[int]:
        return self.router.get("sticky_max_size")

    def native(self, sticky_default: Optional[int] = None) -> dict:
        """The JSON object for kvr_router_new: only what was set (the library
        fills in the rest); ``sticky_default`` (the balancer's
        ``max_cache_size``) applies when ``sticky_max_size`` is not set."""
        return self._native(sticky_default)[0]

    def _native(self, sticky_default: Optional[int], probe: bool = False) -> Tuple[dict, Dict[str, str]]:
        """The native document and the user key of every native key path that
        differs from the default mapping (see :func:`_user_key`). ``probe``
        validates collector keys even when no collector runs."""
        aliases: Dict[str, str] = {}
        r: Dict[str, Any] = {"mode": self.type, **self.router}
        if "sticky_max_size" not in r and sticky_default is not None:
            r["sticky_max_size"] = sticky_default
        if self.strategies:
            r["strategies"] = [dict(s) for s in self.strategies]
        for i, k in enumerate(self.strategy_keys):
            aliases[f"router.strategies[{i}].name"] = f"strategies[{i}].{k}"
        load = r.get("load", {})
        if self.collector.unhealthy_after is not None and isinstance(load, Mapping) and "unhealthy_after" not in load:
            r["load"] = {**load, "unhealthy_after": self.collector.unhealthy_after}
            aliases["router.load.unhealthy_after"] = "collector.unhealthy_after"
        doc: Dict[str, Any] = {"router": r}
        specs = self._collector_specs()
        if probe and not specs and self.collector.native:
            specs = [{"name": "vllm_metrics", **self.collector.native}]
        if specs:
            doc["collectors"] = {"collectors": specs}
        for key in _TOP_KEYS:
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key)
        return doc, aliases

    def _collector_specs(self) -> List[dict]:
        out = []
        for name in self.collector_names:
            spec: Dict[str, Any] = {"name": name, **self.collector.native}
            if name == "vllm_zmq" and self.collector.endpoints:
                spec["endpoints"] = {
                    sid: [e.native() for e in eps] for sid, eps in self.collector.endpoints.items()
                }
            out.append(spec)
        return out

    def validation_document(self) -> dict:
        """What :meth:`validate` sends the library: :meth:`native`, plus a
        probe collector spec carrying the collector keys when they are set but
        no collector runs, so a typo there is caught too."""
        return self._native(None, probe=True)[0]

    def validate(self) -> dict:
        """Has the library validate this configuration; returns the effective
        configuration (every default filled in). Raises :class:`ConfigError`
        naming the key as the user wrote it."""
        doc, aliases = self._native(None, probe=True)
        _check_finite(doc, self.prefix, aliases)
        from . import _native

        try:
            return _native.validate_config(doc)
        except ConfigError as e:
            raise _user_error(str(e), self.prefix, aliases) from None


#: Name used by upstream verl for the same object.
KVCAwareConfig = RouterConfig


def library_defaults(router_type: str = "default") -> dict:
    """The library's effective configuration for a router type with nothing
    else set: the one place kvc-router's defaults are defined."""
    if router_type not in ROUTER_TYPES:
        raise ConfigError(f"router type {router_type!r} (allowed: {allowed_text(ROUTER_TYPES)})", key="type")
    from . import _native

    return _native.validate_config({"router": {"mode": router_type}})


# --------------------------------------------------------------------------
# Library errors -> the user's keys

# "<native key path>: <reason>", as kvr_validate_config words every error.
_NATIVE_ERROR = re.compile(r"^((?:router|collectors|max_procs|log_level|push)(?:\.\w+|\[[^\]]*\])*): (.*)$", re.S)
_STRATEGY_KEY = re.compile(r"^router\.strategies(\[\d+\])(?:\.params)?(.*)$")
_COLLECTOR_KEY = re.compile(r"^collectors\.collectors\[\d+\](.*)$")


def _user_key(native_key: str, aliases: Mapping[str, str]) -> str:
    """Maps a native key path onto router.config's keys (relative)."""
    if native_key in aliases:
        return aliases[native_key]
    m = _STRATEGY_KEY.match(native_key)
    if m:
        return f"strategies{m.group(1)}{m.group(2)}"
    m = _COLLECTOR_KEY.match(native_key)
    if m:
        return f"collector{m.group(1)}"
    if native_key == "router.mode":
        return "type"
    if native_key.startswith("router."):
        return native_key[len("router.") :]
    if native_key == "collectors":
        return "collector"
    return native_key


def _user_error(message: str, prefix: str, aliases: Mapping[str, str]) -> ConfigError:
    m = _NATIVE_ERROR.match(message)
    if not m:
        key = prefix or "router_config"
        return ConfigError(f"{key}: {message}", key=key)
    key = _join(prefix, _user_key(m.group(1), aliases))
    return ConfigError(f"{key}: {m.group(2)}", key=key)


def _check_finite(value: Any, prefix: str, aliases: Mapping[str, str], path: str = "") -> None:
    """JSON has no NaN or infinity: name the key instead of failing to encode.
    Iterative: the document passed _check_depth, but no walk here recurses."""
    stack = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            key = _join(prefix, _user_key(p, aliases))
            raise ConfigError(f"{key}: must be a finite number, got {v}", key=key)
        if isinstance(v, Mapping):
            stack.extend((x, f"{p}.{k}" if p else str(k)) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((x, f"{p}[{i}]") for i, x in enumerate(v))


#: Deepest nesting accepted in a router config (real ones are < 8 deep).
MAX_CONFIG_DEPTH = 64


def _check_depth(value: Any, key: str = "router_config") -> None:
    """Refuses a config nested deeper than MAX_CONFIG_DEPTH (or holding a
    cycle) with a ConfigError naming where, before anything recursive (JSON
    encoding, OmegaConf, the parsers) walks it. Iterative, so it cannot hit
    Python's recursion limit itself."""
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
    except RecursionError:
        raise ConfigError(
            f"router config {path!r} is nested too deeply to read (limit {MAX_CONFIG_DEPTH} levels)",
            key="router_config",
        ) from None
    except OSError as e:
        raise ConfigError(f"cannot read router config {path!r}: {e}", key="router_config") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"router config {path!r} is not valid YAML: {e}", key="router_config") from e


def _plain(obj: Any) -> Any:
    if isinstance(obj, (KVCAwareStrategyConfig, LeastInflightStrategyConfig)):
        return obj.to_dict()
    mod = type(obj).__module__ or ""
    if mod.startswith("omegaconf") and type(obj).__name__ in ("DictConfig", "ListConfig"):
        from omegaconf import OmegaConf

        try:
            return OmegaConf.to_container(obj, resolve=True)
        except RecursionError:
            raise ConfigError(
                f"router_config: nested too deeply to convert (limit {MAX_CONFIG_DEPTH} levels)", key="router_config"
            ) from None
    return obj


def load_router_config(source: Any = None, validate: bool = True) -> RouterConfig:
    """Parses any accepted configuration input into a :class:`RouterConfig`;
    with ``validate`` (the default) the library checks it too, so every error
    surfaces here as a :class:`ConfigError` naming the key."""
    cfg = _load(source)
    if validate:
        cfg.validate()
    return cfg


def _load(source: Any) -> RouterConfig:
    if isinstance(source, RouterConfig):
        return source
    if source is None:
        return _load(packaged_config_path("default"))
    if isinstance(source, str) and source in ROUTER_TYPES:
        return _load(packaged_config_path(source))
    if isinstance(source, os.PathLike) or (
        isinstance(source, str) and (source.endswith((".yaml", ".yml")) or os.path.isfile(source))
    ):
        data = _read_yaml(os.fspath(source))
        return _parse_any({} if data is None else data)
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
    _check_depth(data)
    if not isinstance(data, Mapping):
        raise ConfigError(f"router config must be a mapping, got {type(data).__name__}", key="router_config")
    if "router_class" in data:
        # verl >= 0.9.1 ``rollout.router_config_path``: the whole YAML reaches
        # the constructor; ``router_class`` only told verl which class to load.
        data = {k: v for k, v in data.items() if k != "router_class"}
        if not data:
            return _load(packaged_config_path(_KVC))
    if "router" in data:
        _no_unknown(data, ("router",), "")
        return _parse_block(_plain(data["router"]), "router")
    if "type" in data or (data and set(data) <= {"config"}):
        return _parse_block(data, "")
    return _parse_inner(data, "", _KVC)


def _join(prefix: str, key: str) -> str:
    if not prefix:
        return key
    if not key:
        return prefix
    return prefix + key if key.startswith("[") else f"{prefix}.{key}"


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
        return _load(packaged_config_path(rtype))
    return _parse_inner(inner, _join(prefix, "config"), rtype)


def _set(m: Mapping, keys: Tuple[str, ...]) -> Dict[str, Any]:
    """The keys of ``keys`` that ``m`` sets (None = unset), OmegaConf-free."""
    return {k: _plain(m[k]) for k in keys if k in m and m[k] is not None}


def _parse_inner(cfg: Any, prefix: str, rtype: str) -> RouterConfig:
    if not isinstance(cfg, Mapping):
        key = prefix or "router_config"
        raise ConfigError(f"{key} must be a mapping, got {type(cfg).__name__}", key=key)
    _no_unknown(cfg, _INNER_KEYS, prefix)
    p = lambda k: _join(prefix, k)  # noqa: E731
    strategies, wanted, named_by = _parse_strategies(_plain(cfg.get("strategies")), p("strategies"))
    collector = _parse_collector(_plain(cfg.get("collector")), p("collector"))
    names: List[str] = []
    if rtype == _KVC:  # the default mode reads no live state
        for n in list(collector.names) + wanted:
            canon = "vllm_metrics" if n == "vllm_polling" else n
            if canon not in names:
                names.append(canon)
    top = _set(cfg, _TOP_KEYS)
    return RouterConfig(
        type=rtype,
        strategies=tuple(strategies),
        collector_names=tuple(names),
        router=_set(cfg, _ROUTER_KEYS),
        max_procs=top.get("max_procs"),
        log_level=top.get("log_level"),
        metrics_flavor=_choice(cfg.get("metrics_flavor"), p("metrics_flavor"), METRICS_FLAVORS) or "vllm",
        collector=collector,
        kv_events=_parse_kv_events(cfg.get("kv_events"), p("kv_events")),
        kv_events_base_port=_int(cfg.get("kv_events_base_port"), p("kv_events_base_port"), 0, 65535) or 0,
        enable_server_metrics=bool(_bool(cfg.get("enable_server_metrics"), p("enable_server_metrics"))),
        prefix=prefix,
        strategy_keys=tuple(named_by),
    )


def _parse_kv_events(value: Any, key: str) -> str:
    if value is None or value is False:  # YAML `off` is the boolean false
        return "off"
    return _choice(value, key, KV_EVENTS_MODES) or "off"


def _parse_strategies(value: Any, key: str) -> Tuple[List[dict], List[str], List[str]]:
    """Native strategy specs, the collectors they ask for, and the key that
    named each ("name" or "_target_")."""
    if value is None:
        return [], [], []
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key} must be a list of strategies, got {type(value).__name__}", key=key)
    specs: List[dict] = []
    collectors: List[str] = []
    named_by: List[str] = []
    for i, s in enumerate(value):
        s = _plain(s)
        spec, names = _parse_strategy(s, f"{key}[{i}]")
        specs.append(spec)
        collectors.extend(names)
        named_by.append("name" if "name" in s else "_target_")
    return specs, collectors, named_by


def _parse_strategy(s: Any, prefix: str) -> Tuple[dict, Tuple[str, ...]]:
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
        if name is not None and s["name"] != name:
            raise ConfigError(f"{key}: {s['name']!r} contradicts _target_ ({name!r})", key=key, allowed=(name,))
        name = s["name"]
    if name is None:
        raise ConfigError(
            f"{prefix}: a strategy needs '_target_' (allowed: {allowed_text(sorted(STRATEGY_TARGETS))}) or 'name'",
            key=prefix,
            allowed=tuple(sorted(STRATEGY_TARGETS)),
        )
    spec: Dict[str, Any] = {"name": name, "weight": 1.0}
    if s.get("weight") is not None:
        spec["weight"] = s["weight"]
    params = {k: _plain(v) for k, v in s.items() if k not in ("_target_", "name", "weight", "collector_names")}
    params = {k: v for k, v in params.items() if v is not None}
    if params:
        spec["params"] = params
    return spec, _parse_collector_names(s.get("collector_names"), _join(prefix, "collector_names"))


def _parse_collector_names(value: Any, key: str) -> Tuple[str, ...]:
    value = _plain(value)
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key} must be a list of collector names, got {type(value).__name__}", key=key)
    for i, n in enumerate(value):
        _choice(n, f"{key}[{i}]", COLLECTOR_NAMES)
    return tuple(value)


def _parse_collector(c: Any, prefix: str) -> CollectorConfig:
    if c is None:
        return CollectorConfig()
    if not isinstance(c, Mapping):
        raise ConfigError(f"{prefix} must be a mapping, got {type(c).__name__}", key=prefix)
    topic = c.get("topic")
    if topic is not None and not isinstance(topic, str):
        key = _join(prefix, "topic")
        raise ConfigError(f"{key}: must be a string, got {topic!r}", key=key)
    timeout = _int(c.get("handle_timeout_ms"), _join(prefix, "handle_timeout_ms"), 1, 3600 * 1000)
    return CollectorConfig(
        names=_parse_collector_names(c.get("names"), _join(prefix, "names")),
        endpoints=_parse_endpoints(_plain(c.get("endpoints")), _join(prefix, "endpoints"), topic or ""),
        topic=topic or "",
        use_handle_endpoints=_bool(c.get("use_handle_endpoints"), _join(prefix, "use_handle_endpoints")) is not False,
        handle_timeout_ms=5000 if timeout is None else timeout,
        unhealthy_after=c.get("unhealthy_after"),  # the library checks it (as router.load.unhealthy_after)
        native={k: _plain(v) for k, v in c.items() if k not in _PY_COLLECTOR_KEYS and v is not None},
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


# --------------------------------------------------------------------------
# Checks of the keys only Python reads


def _no_unknown(m: Mapping, allowed: Tuple[str, ...], prefix: str) -> None:
    for k in m:
        if k not in allowed:
            key = _join(prefix, str(k))
            raise ConfigError(
                f"{key}: unknown key (allowed keys here: {allowed_text(allowed)})", key=key, allowed=allowed
            )


def _int(v: Any, key: str, lo: int, hi: int) -> Optional[int]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ConfigError(f"{key}: must be an integer in [{lo}, {hi}], got {v!r}", key=key, allowed=(lo, hi))
    return v


def _bool(v: Any, key: str) -> Optional[bool]:
    if v is not None and not isinstance(v, bool):
        raise ConfigError(f"{key}: must be true or false, got {v!r}", key=key, allowed=(True, False))
    return v


def _choice(v: Any, key: str, choices: Tuple[str, ...]) -> Optional[str]:
    if v is not None and v not in choices:
        raise ConfigError(f"{key}: {v!r} (allowed: {allowed_text(choices)})", key=key, allowed=choices)
    return v


__all__ = [
    "ConfigError",
    "NativeError",
    "RouterConfig",
    "KVCAwareConfig",
    "KVCAwareStrategyConfig",
    "LeastInflightStrategyConfig",
    "CollectorConfig",
    "KVEventEndpoint",
    "STRATEGY_TARGETS",
    "COLLECTOR_NAMES",
    "KV_EVENTS_MODES",
    "load_router_config",
    "library_defaults",
    "packaged_config_path",
    "parse_endpoint",
]
