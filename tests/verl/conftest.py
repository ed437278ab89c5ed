"""tests/verl: the published verl package around simulated vLLM servers.

Runs in the environment `make test-verl` builds (scripts/verl_venv.sh); in
any environment without verl (e.g. `make test`'s .venv) these modules are
not collected.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

if importlib.util.find_spec("verl") is None or importlib.util.find_spec("torch") is None:
    collect_ignore_glob = ["test_*.py"]

if HERE not in sys.path:
    sys.path.insert(0, HERE)


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
        runtime_env={"env_vars": {"PYTHONPATH": HERE}},
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
