"""The typed balancer configuration (:class:`RouterConfig` and its parts),
its translation to the library's JSON with the library's errors mapped back
to the user's keys, and the checks of the keys only Python reads (the
library checks the rest). kvc_router.config builds it from verl's shapes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple

from . import _native
from .endpoints import KVEventEndpoint, _join, _plain, parse_endpoints
from .errors import ConfigError, allowed_text

_TOP_KEYS = ("max_procs", "log_level")
# Collector keys only Python reads; the others go to every native collector.
PY_COLLECTOR_KEYS = ("names", "endpoints", "topic", "use_handle_endpoints", "handle_timeout_ms", "unhealthy_after")


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
    left ``None`` takes the library's default (docs/configuration.md)."""

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

    name: ClassVar[str] = "kvc_aware"
    target: ClassVar[str] = "kvc_router.config.KVCAwareStrategyConfig"


@dataclass(frozen=True)
class LeastInflightStrategyConfig(StrategyOptions):
    """verl's default: fewest in-flight requests, ties to the first-added server."""

    weight: Optional[float] = None

    name: ClassVar[str] = "least_inflight"
    target: ClassVar[str] = "kvc_router.config.LeastInflightStrategyConfig"


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
class MetricsConfig:
    """``router.config.metrics``: the router's metrics in Ray's Prometheus
    export (:mod:`kvc_router.metrics`)."""

    #: None: on inside a Ray actor, off elsewhere; False turns it off.
    enabled: Optional[bool] = None
    #: Seconds between two snapshots of get_status().
    period_s: float = 5.0
    #: Distinct ``server`` label values; later servers share ``_other``.
    max_server_labels: int = 64


@dataclass(frozen=True)
class RouterConfig:
    """``router.type`` + ``router.config``: native strategy specs and router keys
    holding only what the user set; ``prefix`` is where ``config`` sat."""

    type: str = "default"
    strategies: Tuple[Mapping[str, Any], ...] = ()
    collector_names: Tuple[str, ...] = ()
    router: Mapping[str, Any] = field(default_factory=dict)
    max_procs: Optional[int] = None
    log_level: Optional[str] = None
    metrics_flavor: str = "vllm"
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    kv_events: str = "off"  # integration keys, read by kvc_router.verl
    kv_events_base_port: int = 0
    enable_server_metrics: bool = False
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    prefix: str = field(default="", compare=False)
    strategy_keys: Tuple[str, ...] = field(default=(), compare=False)  # "name" or "_target_", per strategy

    def __post_init__(self) -> None:
        if any(isinstance(s, StrategyOptions) for s in self.strategies):
            from .config import _names, _parse_strategies

            specs, wanted, keys = _parse_strategies(list(self.strategies), _join(self.prefix, "strategies"))
            object.__setattr__(self, "strategies", tuple(specs))
            extra = [n for n in _names(self.type, wanted) if n not in self.collector_names]
            object.__setattr__(self, "collector_names", (*self.collector_names, *extra))
            object.__setattr__(self, "strategy_keys", tuple(keys))

    @property
    def sticky_max_size(self) -> Optional[int]:
        return self.router.get("sticky_max_size")

    @property
    def admission_enabled(self) -> bool:
        """``admission.enabled`` in kvc_aware mode (router-side admission:
        kvc_router.admission; the default mode ignores it)."""
        adm = self.router.get("admission")
        return self.type == "kvc_aware" and isinstance(adm, Mapping) and adm.get("enabled") is True

    def native(self, sticky_default: Optional[int] = None) -> dict:
        """The kvr_router_new document: only what was set; ``sticky_default``
        (the balancer's ``max_cache_size``) applies when sticky_max_size is unset."""
        return self._native(sticky_default)[0]

    def _native(self, sticky_default: Optional[int], probe: bool = False) -> Tuple[dict, Dict[str, str]]:
        """The document and the user key of native keys the default mapping
        misses; ``probe`` sends collector keys even when no collector runs."""
        aliases = {f"router.strategies[{i}].name": f"strategies[{i}].{k}" for i, k in enumerate(self.strategy_keys)}
        r: Dict[str, Any] = {"mode": self.type, **self.router}
        if "sticky_max_size" not in r and sticky_default is not None:
            r["sticky_max_size"] = sticky_default
        if self.strategies:
            r["strategies"] = [dict(s) for s in self.strategies]
        load, ua = r.get("load", {}), self.collector.unhealthy_after
        if ua is not None and isinstance(load, Mapping) and "unhealthy_after" not in load:
            r["load"] = {**load, "unhealthy_after": ua}
            aliases["router.load.unhealthy_after"] = "collector.unhealthy_after"
        doc: Dict[str, Any] = {"router": r}
        specs = [{"name": n, **self.collector.native} for n in self.collector_names]
        for s in specs:
            if s["name"] == "vllm_zmq" and self.collector.endpoints:
                s["endpoints"] = {k: [e.native() for e in v] for k, v in self.collector.endpoints.items()}
        if probe and not specs and self.collector.native:
            specs = [{"name": "vllm_metrics", **self.collector.native}]
        if specs:
            doc["collectors"] = {"collectors": specs}
        doc.update({k: getattr(self, k) for k in _TOP_KEYS if getattr(self, k) is not None})
        return doc, aliases

    def validation_document(self) -> dict:
        """What :meth:`validate` sends: :meth:`native` plus a probe collector
        carrying collector keys set while no collector runs."""
        return self._native(None, probe=True)[0]

    def validate(self) -> dict:
        """The library's check; returns the effective configuration. Raises
        :class:`ConfigError` naming the key as the user wrote it."""
        doc, aliases = self._native(None, probe=True)
        _check_finite(doc, self.prefix, aliases)
        try:
            return _native.validate_config(doc)
        except ConfigError as e:
            if getattr(e, "reason", None) is None:
                key = self.prefix or "router_config"
                raise ConfigError(f"{key}: {e}", key=key) from None
            key = _join(self.prefix, _user_key(e.key or "", aliases))
            raise ConfigError(f"{key}: {e.reason}", key=key) from None


KVCAwareConfig = RouterConfig  # upstream verl's name


def _user_key(native: str, aliases: Mapping[str, str]) -> str:
    """A library key path (kvr_validate_config's) as router.config's key."""
    if native in aliases:
        return aliases[native]
    head, _, rest = native.partition(".")
    if head == "router" and rest.startswith("strategies["):
        i, _, tail = rest.partition("]")
        return i + "]" + (tail[len(".params") :] if tail.startswith(".params") else tail)
    if native.startswith("collectors.collectors["):
        return "collector" + native.split("]", 1)[1]
    return {"router.mode": "type", "collectors": "collector"}.get(
        native, rest if native.startswith("router.") else native
    )


def _check_finite(value: Any, prefix: str, aliases: Mapping[str, str], path: str = "") -> None:
    """JSON has no NaN or infinity: name the key instead of failing to encode.
    Iterative, so a deeply nested document cannot hit the recursion limit."""
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


def parse_collector(c: Any, prefix: str, names: Tuple[str, ...]) -> CollectorConfig:
    """``collector``; ``names`` are the library's collector names."""
    if c is None:
        return CollectorConfig()
    if not isinstance(c, Mapping):
        raise ConfigError(f"{prefix} must be a mapping, got {type(c).__name__}", key=prefix)
    topic = c.get("topic")
    if topic is not None and not isinstance(topic, str):
        key = _join(prefix, "topic")
        raise ConfigError(f"{key}: must be a string, got {topic!r}", key=key)
    timeout = check_int(c.get("handle_timeout_ms"), _join(prefix, "handle_timeout_ms"), 1, 3600 * 1000)
    return CollectorConfig(
        names=collector_names(c.get("names"), _join(prefix, "names"), names),
        endpoints=parse_endpoints(_plain(c.get("endpoints")), _join(prefix, "endpoints"), topic or ""),
        topic=topic or "",
        use_handle_endpoints=check_bool(c.get("use_handle_endpoints"), _join(prefix, "use_handle_endpoints"))
        is not False,
        handle_timeout_ms=5000 if timeout is None else timeout,
        unhealthy_after=c.get("unhealthy_after"),  # the library checks it (as router.load.unhealthy_after)
        native={k: _plain(v) for k, v in c.items() if k not in PY_COLLECTOR_KEYS and v is not None},
    )


def collector_names(value: Any, key: str, names: Tuple[str, ...]) -> Tuple[str, ...]:
    value = _plain(value)
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key} must be a list of collector names, got {type(value).__name__}", key=key)
    for i, n in enumerate(value):
        check_choice(n, f"{key}[{i}]", names)
    return tuple(value)


def parse_metrics(m: Any, prefix: str) -> MetricsConfig:
    if m is None:
        return MetricsConfig()
    if m is False:  # `metrics: off`
        return MetricsConfig(enabled=False)
    if not isinstance(m, Mapping):
        raise ConfigError(f"{prefix} must be a mapping, got {type(m).__name__}", key=prefix)
    no_unknown(m, ("enabled", "period_s", "max_server_labels"), prefix)
    period = m.get("period_s")
    pk = _join(prefix, "period_s")
    if period is not None and (
        isinstance(period, bool) or not isinstance(period, (int, float)) or not 0.05 <= period <= 3600
    ):
        raise ConfigError(f"{pk}: must be a number in [0.05, 3600], got {period!r}", key=pk, allowed=(0.05, 3600))
    labels = check_int(m.get("max_server_labels"), _join(prefix, "max_server_labels"), 1, 10000)
    return MetricsConfig(
        enabled=check_bool(m.get("enabled"), _join(prefix, "enabled")),
        period_s=5.0 if period is None else float(period),
        max_server_labels=64 if labels is None else labels,
    )


def no_unknown(m: Mapping, allowed: Tuple[str, ...], prefix: str) -> None:
    for k in m:
        if k not in allowed:
            key = _join(prefix, str(k))
            raise ConfigError(
                f"{key}: unknown key (allowed keys here: {allowed_text(allowed)})", key=key, allowed=allowed
            )


def check_int(v: Any, key: str, lo: int, hi: int) -> Optional[int]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ConfigError(f"{key}: must be an integer in [{lo}, {hi}], got {v!r}", key=key, allowed=(lo, hi))
    return v


def check_bool(v: Any, key: str) -> Optional[bool]:
    if v is not None and not isinstance(v, bool):
        raise ConfigError(f"{key}: must be true or false, got {v!r}", key=key, allowed=(True, False))
    return v


def check_choice(v: Any, key: str, choices: Tuple[str, ...]) -> Optional[str]:
    if v is not None and v not in choices:
        raise ConfigError(f"{key}: {v!r} (allowed: {allowed_text(choices)})", key=key, allowed=choices)
    return v
