"""Which rollout config asks for kvc_aware, and which verl release is running.

Pure functions of the config (plus verl's own YAML path resolver when the
config points at a file); nothing here patches anything.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional, Tuple

logger = logging.getLogger("kvc_router.verl")

#: verl releases the hook is tested against (``make test-verl`` runs each).
TESTED_VERSIONS: Tuple[str, ...] = ("0.8.0", "0.9.0", "0.9.1")
#: Oldest release with ``verl.workers.rollout.llm_server`` (the balancer's home);
#: 0.7.x keeps a different, per-worker balancer the hook cannot replace.
MIN_VERSION: Tuple[int, int, int] = (0, 8, 0)
SUPPORTED_TEXT = "verl >= 0.8.0 (tested: " + ", ".join(TESTED_VERSIONS) + ")"


def verl_version() -> str:
    """The installed verl's version, or ``"unknown"``."""
    try:
        from importlib.metadata import version

        return version("verl")
    except Exception:  # noqa: BLE001 - a source checkout without metadata
        pass
    try:
        import verl

        return str(getattr(verl, "__version__", "unknown"))
    except Exception:  # noqa: BLE001
        return "unknown"


def version_tuple(text: str) -> Optional[Tuple[int, int, int]]:
    """``"0.9.1"`` -> (0, 9, 1); ``"0.10.0.dev0"`` -> (0, 10, 0); None if unparsable."""
    parts = []
    for piece in text.split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    if not parts:
        return None
    while len(parts) < 3:
        parts.append(0)
    return (parts[0], parts[1], parts[2])


def unsupported_reason(version: str) -> Optional[str]:
    """Why this verl release cannot run kvc_aware, or None if it can."""
    vt = version_tuple(version)
    if vt is not None and vt < MIN_VERSION:
        return (
            f"verl {version} has no LLMServerManager / GlobalRequestLoadBalancer in "
            f"verl.workers.rollout.llm_server; kvc-router supports {SUPPORTED_TEXT}"
        )
    return None


def is_tested(version: str) -> bool:
    return version in TESTED_VERSIONS


# --------------------------------------------------------------------------
# Reading the config


def plain(obj: Any) -> Any:
    """An OmegaConf node as plain containers; anything else unchanged."""
    mod = type(obj).__module__ or ""
    if mod.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(obj, resolve=True)
    return obj


def get(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg[key]`` / ``cfg.key`` for dicts, DictConfigs and dataclasses."""
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
    block = plain(get(rollout_config, "router"))
    if block is not None:
        if isinstance(block, str):
            block = {"type": block}
        if not isinstance(block, dict):
            raise TypeError(f"actor_rollout_ref.rollout.router must be a mapping, got {type(block).__name__}")
        rtype = block.get("type", "default")
        if rtype in (None, "default"):
            return None
        if rtype != "kvc_aware":
            from ..config import ROUTER_TYPES
            from ..errors import ConfigError

            raise ConfigError(
                f"actor_rollout_ref.rollout.router.type: {rtype!r} (allowed: {', '.join(map(repr, ROUTER_TYPES))})",
                key="router.type",
                allowed=ROUTER_TYPES,
            )
        return normalise_block(block)
    path = get(rollout_config, "router_config_path")
    if path:
        data = _read_router_yaml(path)
        if isinstance(data, dict) and names_us(data.get("router_class")):
            rest = {k: v for k, v in data.items() if k != "router_class"}
            if not rest:
                return normalise_block({"type": "kvc_aware"})
            if "router" in rest:
                rest = rest["router"]
            if "type" in rest or set(rest) <= {"config"}:
                return normalise_block(rest) if rest.get("type", "kvc_aware") == "kvc_aware" else None
            return normalise_block({"type": "kvc_aware", "config": rest})
    return None


def asks_for_router(rollout_config: Any) -> bool:
    """Cheap pre-check (no validation): does the config carry a ``router``
    block whose type is not ``default``?"""
    block = plain(get(rollout_config, "router"))
    if isinstance(block, str):
        return block not in ("", "default")
    if isinstance(block, dict):
        return block.get("type", "default") not in (None, "default")
    return False


def names_us(cls_name: Any) -> bool:
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


def normalise_block(block: dict) -> dict:
    """``{"type": "kvc_aware", "config": {...}}`` with the packaged defaults
    filled in when ``config`` is absent; validated here, in the driver."""
    from ..config import load_router_config, packaged_config_path

    inner = block.get("config")
    if inner is None:
        import yaml

        with open(packaged_config_path("kvc_aware"), encoding="utf-8") as f:
            inner = yaml.safe_load(f)["router"]["config"]
    out = {"type": "kvc_aware", "config": plain(inner)}
    load_router_config(out)  # ConfigError names the bad key
    return out
