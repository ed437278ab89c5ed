"""verl integration: ``router.type: kvc_aware`` under ``actor_rollout_ref.rollout``.

How it reaches verl
-------------------
The kvc-router wheel installs ``kvc_router_verl.pth`` into site-packages; the
interpreter runs it at start-up in every process of the environment (driver,
``TaskRunner``, agent-loop workers, rollout servers: Ray starts them all with
the same interpreter). It imports ``_kvc_router_verl_boot``, which only puts a
finder on ``sys.meta_path``. That finder

* patches verl's own modules in place when they finish executing
  (:mod:`.patches`), and
* serves ``verl.workers.rollout.llm_router`` (+ ``.config``,
  ``.config.strategy``), the import path of verl PR #6940, from
  :mod:`.alias` while verl does not ship that package itself.

``KVC_ROUTER_VERL_HOOK=0`` switches everything off.

Modules
-------
* :mod:`.detection`: which config asks for kvc_aware; verl version and the
  supported range.
* :mod:`.patches`: what is patched, the record of each patch, and the gate
  that fails start-up (naming the verl version and the patch) when kvc_aware
  is asked for but a patch could not apply.
* :mod:`.ports`: KV-event ports and per-replica vLLM settings (``kv_events: auto``).
* :mod:`.actor`: how the balancer actor is created (``ACTOR_OPTIONS``) and
  the balancers of this process (reset after each weight sync).
* :mod:`.alias`: the ``llm_router`` alias modules.
* :mod:`.pth`: the ``.pth`` file (``python -m kvc_router.verl status``).

Nothing here imports verl at module level (importing verl needs torch).
"""

from __future__ import annotations

from .actor import ACTOR_OPTIONS, registered_balancers, reset_balancers
from .detection import SUPPORTED_TEXT, TESTED_VERSIONS, router_block, verl_version
from .patches import VerlIncompatibleError, ensure_supported, on_import, results
from .pth import status

__all__ = [
    "ACTOR_OPTIONS",
    "SUPPORTED_TEXT",
    "TESTED_VERSIONS",
    "VerlIncompatibleError",
    "ensure_supported",
    "on_import",
    "registered_balancers",
    "reset_balancers",
    "results",
    "router_block",
    "status",
    "verl_version",
]
