"""Start-up half of kvc-router's verl integration (see kvc_router.verl).

``kvc_router_verl.pth`` (installed next to this module in site-packages by the
kvc-router wheel) imports this module when the interpreter starts, in every
process of the environment: the driver, Ray's ``TaskRunner`` actor, agent-loop
worker actors, rollout-server actors. It only puts one finder on
``sys.meta_path``; nothing else is imported (not kvc_router, not verl). The
finder handles two fixed sets of module names:

* ``WATCHED`` verl modules: when one has finished executing,
  ``kvc_router.verl.patches.on_import(name, module)`` patches it;
* ``ALIASES``: ``verl.workers.rollout.llm_router`` and two submodules (the
  import path of verl PR #6940), served from ``kvc_router.verl.alias`` only
  when no other finder provides them, i.e. while verl does not ship that
  package; once it does, verl's wins (one log line).

``KVC_ROUTER_VERL_HOOK=0`` (also ``false``/``no``/``off``) in the environment
turns the whole mechanism off before anything is installed.
"""

from __future__ import annotations

import importlib.machinery
import logging
import os
import sys
import threading

#: verl modules patched after they execute (kvc_router.verl.patches._TABLE).
WATCHED = frozenset(
    {
        "verl.utils.config",
        "verl.workers.rollout.llm_server",
        "verl.checkpoint_engine.base",
        "verl.workers.rollout.vllm_rollout.vllm_pd_replica",
        "verl.workers.rollout.sglang_rollout.sglang_pd_replica",
    }
)
ALIAS_ROOT = "verl.workers.rollout.llm_router"
#: Fixed alias names (kvc_router.verl.alias.MODULES); never taken from a config.
ALIASES = frozenset({ALIAS_ROOT, ALIAS_ROOT + ".config", ALIAS_ROOT + ".config.strategy"})
#: Set on alias modules, so their submodules are served only below our alias.
ALIAS_MARK = "__kvc_router_alias__"

_OFF = ("0", "false", "no", "off")
_logged: set[str] = set()


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
            from kvc_router.verl import patches
        except Exception as e:  # noqa: BLE001 - never break verl's import
            sys.stderr.write(f"kvc-router: verl hook unavailable ({e!r}); verl runs unmodified\n")
            return
        # Raises only VerlIncompatibleError, once a config asked for kvc_aware.
        patches.on_import(self._name, module)


class _AliasLoader:
    """Fills an alias module from kvc_router (imported only now)."""

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        from kvc_router.verl import alias

        setattr(module, ALIAS_MARK, True)
        alias.populate(module)


class VerlImportWatcher:
    """A meta-path finder for WATCHED and ALIASES names only."""

    _busy = threading.local()

    def _others(self, fullname, path, target):
        """The spec the rest of sys.meta_path gives, or None."""
        if getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    return spec
            return None
        finally:
            self._busy.on = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname in WATCHED:
            spec = self._others(fullname, path, target)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            spec.loader = _Loader(spec.loader, fullname)
            return spec
        if fullname in ALIASES and not getattr(self._busy, "on", False):
            return self._alias_spec(fullname, path, target)
        return None

    def _alias_spec(self, fullname, path, target):
        parent = fullname.rpartition(".")[0]
        if fullname != ALIAS_ROOT and not getattr(sys.modules.get(parent), ALIAS_MARK, False):
            return None  # below verl's own llm_router: verl's rules apply
        if fullname == ALIAS_ROOT:
            spec = self._others(fullname, path, target)
            if spec is not None:
                if fullname not in _logged:
                    _logged.add(fullname)
                    logging.getLogger("kvc_router.verl").warning(
                        "kvc-router: verl ships %s itself; using verl's, not kvc-router's alias", fullname
                    )
                return spec
        spec = importlib.machinery.ModuleSpec(fullname, _AliasLoader(), is_package=True)
        spec.submodule_search_locations = []
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
            from kvc_router.verl import patches
        except Exception:  # noqa: BLE001
            return True
        for n in sorted(already):
            patches.on_import(n, sys.modules[n])
    return True


try:
    install()
except Exception as _e:  # noqa: BLE001 - a .pth import must never stop start-up
    sys.stderr.write(f"kvc-router: could not install the verl import hook: {_e!r}\n")
