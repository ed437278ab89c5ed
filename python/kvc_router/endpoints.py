"""KV-event publisher endpoints reported by a server handle, parsed into
:class:`KVEventEndpoint` (configured ones are the library's to check)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from .errors import ConfigError


def _join(prefix: str, key: str) -> str:
    if not prefix or not key:
        return prefix or key
    return prefix + key if key.startswith("[") else f"{prefix}.{key}"


def _plain(obj: Any) -> Any:
    """OmegaConf containers as plain dicts and lists."""
    mod = type(obj).__module__ or ""
    if mod.startswith("omegaconf") and type(obj).__name__ in ("DictConfig", "ListConfig"):
        from omegaconf import OmegaConf

        try:
            return OmegaConf.to_container(obj, resolve=True)
        except RecursionError:
            raise ConfigError("router_config: nested too deeply to convert", key="router_config") from None
        except Exception:  # noqa: BLE001 - an interpolation elsewhere in a whole verl config
            return OmegaConf.to_container(obj, resolve=False)
    return obj


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


def normalise_endpoint(value: Any, key: str) -> str:
    """``host:port`` becomes ``tcp://host:port``; tcp:// and ipc:// pass."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key} must be a non-empty string, got {value!r}", key=key)
    if "://" not in value:
        value = "tcp://" + value
    if not value.startswith(("tcp://", "ipc://")):
        raise ConfigError(f"{key}: {value!r} (allowed schemes: tcp://, ipc://)", key=key, allowed=("tcp", "ipc"))
    return value


def parse_endpoint(value: Any, key: str, topic: str = "") -> KVEventEndpoint:
    """One endpoint from a string or a mapping {endpoint, replay, topic}."""
    value = _plain(value)
    if isinstance(value, str):
        return KVEventEndpoint(endpoint=normalise_endpoint(value, key), topic=topic)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be an endpoint string or mapping, got {type(value).__name__}", key=key)
    for k in value:
        if k not in ("endpoint", "replay", "replay_endpoint", "topic"):
            bad = _join(key, str(k))
            allowed = ("endpoint", "replay", "replay_endpoint", "topic")
            raise ConfigError(f"{bad}: unknown key (allowed keys here: {', '.join(map(repr, allowed))})", key=bad)
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
