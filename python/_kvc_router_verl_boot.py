"""Start-up half of kvc-router's verl integration (see kvc_router.verl_hook).

``kvc_router_verl.pth`` (installed next to this module in site-packages by the
kvc-router wheel) imports this module when the interpreter starts, in every
process of the environment: the driver, Ray's ``TaskRunner`` actor, agent-loop
worker actors, rollout-server actors. It only puts a finder on
``sys.meta_path`` that watches a handful of verl module names; nothing else is
imported (not kvc_router, not verl). When one of those modules has finished
executing, ``kvc_router.verl_hook.on_import(name, module)`` patches it.

``KVC_ROUTER_VERL_HOOK=0`` (also ``false``/``no``/``off``) in the environment
turns the whole mechanism off before anything is installed.
"""

from __future__ import annotations

import os
import sys
import threading

#: verl modules patched after they execute.
WATCHED = frozenset(
    {
        "verl.utils.config",
        "verl.workers.rollout.llm_server",
        "verl.workers.rollout.router",
        "verl.checkpoint_engine.base",
    }
)

_OFF = ("0", "false", "no", "off")


def disabled() -> bool:
    return os.environ.get("KVC_ROUTER_VERL_HOOK", "1").strip().lower() in _OFF


class _Loader:
    """Runs the real loader, then the patch. Everything else is delegated."""

    def __init__(self, loader, name):
        self._loader = loader
        self._name = name

    def __getattr__(self, attr):
        return getattr(self._loader, attr)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            from kvc_router import verl_hook
        except Exception as e:  # noqa: BLE001 - never break verl's import
            sys.stderr.write(f"kvc-router: verl hook unavailable ({e!r}); verl runs unmodified\n")
            return
        verl_hook.on_import(self._name, module)


class VerlImportWatcher:
    """A meta-path finder that only wraps the loaders of WATCHED modules."""

    _busy = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in WATCHED or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.on = False
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, fullname)
        return spec

    # importlib.invalidate_caches() calls this on every finder.
    def invalidate_caches(self):
        return None


def install() -> bool:
    """Idempotent; returns whether the watcher is (now) installed."""
    if disabled():
        return False
    if any(type(f).__name__ == "VerlImportWatcher" for f in sys.meta_path):
        return True
    sys.meta_path.insert(0, VerlImportWatcher())
    # A watched module imported before this ran (not the case at start-up)
    # is patched now.
    already = [n for n in WATCHED if n in sys.modules]
    if already:
        try:
            from kvc_router import verl_hook
        except Exception:  # noqa: BLE001
            return True
        for n in sorted(already):
            verl_hook.on_import(n, sys.modules[n])
    return True


try:
    install()
except Exception as _e:  # noqa: BLE001 - a .pth import must never stop start-up
    sys.stderr.write(f"kvc-router: could not install the verl import hook: {_e!r}\n")
