"""``verl.workers.rollout.llm_router``: the import path of verl PR #6940.

Its documentation says ``from verl.workers.rollout.llm_router import
KVCAwareBalancer`` and its YAML names
``verl.workers.rollout.llm_router.config.strategy.KVCAwareStrategyConfig``.
No published verl ships that package, so the boot's finder serves these three
fixed module names from here, only while verl itself does not provide them.
Nothing named by a configuration is ever imported: the names are constants.
"""

from __future__ import annotations

from typing import Any, Dict

ROOT = "verl.workers.rollout.llm_router"
#: alias module -> {attribute: "kvc_router attribute"}; submodules are packages
#: too (``__path__ = []``), so only this finder can serve what is below them.
MODULES: Dict[str, Dict[str, str]] = {
    ROOT: {"KVCAwareBalancer": "KVCAwareBalancer", "KVCAwareStrategyConfig": "KVCAwareStrategyConfig"},
    ROOT + ".config": {"KVCAwareStrategyConfig": "KVCAwareStrategyConfig"},
    ROOT + ".config.strategy": {"KVCAwareStrategyConfig": "KVCAwareStrategyConfig"},
}


def populate(module: Any) -> None:
    """Fills an alias module with the same objects ``kvc_router`` exports."""
    import kvc_router

    names = MODULES[module.__name__]
    for attr, source in names.items():
        setattr(module, attr, getattr(kvc_router, source))
    module.__all__ = sorted(names)
    module.__doc__ = (
        f"Alias served by the kvc-router wheel: {', '.join(sorted(names))} from kvc_router "
        "(verl does not ship this package)."
    )
