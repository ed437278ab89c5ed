"""Shared fixtures: one real local Ray instance per test session."""

from __future__ import annotations

import os

import pytest

# Tests exercise the library shipped inside the package unless told otherwise.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KVC_NO_COLLECTORS = {
    "type": "kvc_aware",
    "config": {"strategies": [{"_target_": "kvc_router.config.KVCAwareStrategyConfig"}]},
}


@pytest.fixture(scope="session")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        namespace="kvc-router-tests",
    )
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def make_actor(ray_cluster):
    """Creates balancer actors exactly as verl does and kills them afterwards."""
    from kvc_router import KVCAwareBalancer

    actors = []

    def make(**kwargs):
        actor = ray_cluster.remote(KVCAwareBalancer).remote(**kwargs)
        actors.append(actor)
        return actor

    yield make
    for a in actors:
        ray_cluster.kill(a)
