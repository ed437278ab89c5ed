"""Shared fixtures: one real local Ray instance per test session.

Helpers live in the kvc_harness package (testbed/kvc_harness), which pytest
imports through ``pythonpath = ["testbed"]`` in pyproject.toml; tests import it,
never this file."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    pytest.importorskip("ray")
    from kvc_harness.procs import start_ray

    # A private cluster whose workers can import kvc_harness.
    ray = start_ray(num_cpus=4, namespace="kvc-router-tests")
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def make_actor(ray_cluster: Any) -> Iterator[Callable[..., Any]]:
    """Creates balancer actors exactly as verl does and kills them afterwards."""
    from kvc_router import KVCAwareBalancer

    actors = []

    def make(**kwargs: Any) -> Any:
        actor = ray_cluster.remote(KVCAwareBalancer).remote(**kwargs)
        actors.append(actor)
        return actor

    yield make
    for a in actors:
        ray_cluster.kill(a)
