"""kvc_harness: the one Python harness behind the tests, the demo, the soak,
the overhead table, the chaos run and the balancer benchmarks.

It is tooling, not product: it lives under ``tests/`` and is not shipped in the
wheel. pytest finds it through ``pythonpath = ["testbed"]`` (pyproject); the
Makefile runs the scripts with ``PYTHONPATH=testbed``. Ray workers find it because
:func:`kvc_harness.procs.start_ray` exports the same path before starting Ray.

Modules, one job each:

- ``procs``     child processes: one reaper, free ports, wait_for, die-with-parent, Ray start
- ``wire``      vLLM wire formats (/metrics text, KV-event batches) and a stand-in /metrics server
- ``client``    HTTP to vLLM-compatible servers: completions, streaming TTFT, /metrics counters
- ``fleet``     vllm-sim processes: one server (kill/restart) or a fleet; server descriptions
- ``balancer``  balancer configs for tests and runs, and readers of ``get_status()``
- ``workloads`` seeded GRPO and multi-turn agent workloads
- ``rollout``   the Ray rollout worker and one policy run through the balancer actor
- ``satstep``   one oversubscribed GRPO step through the balancer actor (the demo's headline)
- ``report``    the one percentile definition, summaries, tables, JSON and plots
- ``demo``, ``soak``, ``overhead``, ``chaos``: the runs behind ``make demo/soak/overhead/chaos``

Every module imports only the standard library at import time, so Ray workers
and the scripts' ``--help`` stay light; Ray, msgpack, matplotlib and kvc_router
are imported where used.
"""

from __future__ import annotations

import os

# The repository root (testbed/kvc_harness/__init__.py -> ../..).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The directory that holds this package: what PYTHONPATH must contain.
HARNESS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST = "127.0.0.1"

__all__ = ["HARNESS_ROOT", "HOST", "REPO"]
