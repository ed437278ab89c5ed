"""tests/verl: the published verl package around simulated vLLM servers.

Runs in the environment `make test-verl` builds (testbed/scripts/verl_venv.sh), once
per verl release the hook claims: the venv's own verl, then each other
release installed with ``pip install --no-deps --target`` into an overlay
directory that leads ``PYTHONPATH`` (torch and the rest are shared).
``KVC_VERL_EXPECT=<version>`` makes the session fail unless that verl is the
one imported. In any environment without verl (e.g. `make test`'s .venv)
these modules are not collected.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

if importlib.util.find_spec("verl") is None or importlib.util.find_spec("torch") is None:
    collect_ignore_glob = ["test_*.py"]


def pytest_report_header(config):
    if importlib.util.find_spec("verl") is None:
        return None
    from kvc_router.verl import verl_version

    return f"verl {verl_version()} (KVC_VERL_EXPECT={os.environ.get('KVC_VERL_EXPECT', '-')})"


@pytest.fixture(scope="session", autouse=True)
def expected_verl():
    """The verl under test is the one the Makefile asked for."""
    from kvc_router.verl import verl_version

    want = os.environ.get("KVC_VERL_EXPECT")
    got = verl_version()
    if want and got != want:
        pytest.fail(f"KVC_VERL_EXPECT={want} but verl {got} is imported (overlay not on PYTHONPATH?)")
    return got


@pytest.fixture(scope="session")
def verl_ray():
    import ray

    if not os.path.exists(os.path.join(REPO, "bin", "vllm-sim")):
        pytest.fail("bin/vllm-sim is missing: run `make build` first")
    ray.init(
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        namespace="kvc-router-verl-tests",
        # Workers see the same verl as the driver (an overlay leads PYTHONPATH).
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)}},
    )
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def compose():
    """verl's own ppo_trainer.yaml through Hydra, plus overrides."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    base = [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.data_parallel_size=1",
    ]

    def make(*overrides):
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return hydra_compose("ppo_trainer", overrides=base + list(overrides))

    return make
