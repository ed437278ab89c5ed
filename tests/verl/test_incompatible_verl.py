"""A verl the hook cannot patch: asking for kvc_aware fails at start-up with
the verl version and the patch named, instead of running verl's default
balancer. The incompatibility is made real in a child process: a finder placed
after kvc-router's moves ``LLMServerManager._init_global_load_balancer``
under another name right after verl's module executes (what a verl release
that renames it would look like to the hook)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from kvc_router.verl.patches import INIT_LB

CHILD = r"""
import asyncio, json, os, sys

class Renamer:
    NAME = "verl.workers.rollout.llm_server"

    def find_spec(self, name, path=None, target=None):
        if name != self.NAME:
            return None
        for f in sys.meta_path:
            if f is self or type(f).__name__ == "VerlImportWatcher":
                continue
            spec = f.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        real = spec.loader.exec_module

        def exec_module(module):
            real(module)
            cls = module.LLMServerManager
            cls._init_load_balancer_v2 = cls.__dict__["_init_global_load_balancer"]
            del cls._init_global_load_balancer

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(1, Renamer())  # after kvc-router's watcher (index 0)

import verl
from hydra import compose, initialize_config_dir
from kvc_router.verl import VerlIncompatibleError, results
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.rollout.llm_server import LLMServerManager

base = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=2"]
with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                           version_base=None):
    plain = compose("ppo_trainer", overrides=base)
    kvc = compose("ppo_trainer", overrides=base + ["+actor_rollout_ref.rollout.router.type=kvc_aware"])
out = {"results": {k: v[0] for k, v in results().items()}}
out["plain_converts"] = type(omega_conf_to_dataclass(plain.actor_rollout_ref.rollout)).__name__
try:
    omega_conf_to_dataclass(kvc.actor_rollout_ref.rollout)
    out["config_error"] = None
except VerlIncompatibleError as e:
    out["config_error"] = str(e)
class NoServers(LLMServerManager):
    rollout_replica_class = object  # never reached: the gate comes first

try:  # the manager refuses before launching any server
    asyncio.run(NoServers(kvc)._initialize_llm_servers())
    out["manager_error"] = None
except VerlIncompatibleError as e:
    out["manager_error"] = str(e)
print(json.dumps(out))
"""


def test_unpatchable_verl_fails_start_up_naming_version_and_patch(expected_verl):
    env = {k: v for k, v in os.environ.items() if k != "KVC_ROUTER_VERL_HOOK"}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["results"][INIT_LB] == "failed"
    assert got["plain_converts"] == "RolloutConfig"  # no router block: verl unmodified
    for key in ("config_error", "manager_error"):
        msg = got[key]
        assert msg and f"verl {expected_verl}" in msg and INIT_LB in msg, got
    assert "cannot apply" in out.stderr  # the warning at import time, before any config asked


UNSUPPORTED = "0.7.1"
OLD_CHILD = r"""
import json, os, verl
from hydra import compose, initialize_config_dir
from kvc_router.verl import VerlIncompatibleError, verl_version
from verl.utils.config import omega_conf_to_dataclass

with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                           version_base=None):
    kvc = compose("ppo_trainer", overrides=["actor_rollout_ref.rollout.name=vllm",
                                            "+actor_rollout_ref.rollout.router.type=kvc_aware"])
try:
    omega_conf_to_dataclass(kvc.actor_rollout_ref.rollout)
    err = None
except VerlIncompatibleError as e:
    err = str(e)
print(json.dumps({"version": verl_version(), "error": err}))
"""


def test_unsupported_release_refuses_kvc_aware_at_start_up():
    """verl 0.7.1 (published wheel, a --no-deps overlay from testbed/scripts/verl_venv.sh)."""
    import pytest

    overlay = os.path.join(sys.prefix, "verl-overlays", UNSUPPORTED)
    if not os.path.isdir(overlay):
        pytest.skip(f"no verl {UNSUPPORTED} overlay at {overlay} (testbed/scripts/verl_venv.sh makes it)")
    env = {k: v for k, v in os.environ.items() if k != "KVC_ROUTER_VERL_HOOK"}
    env["PYTHONPATH"] = overlay
    out = subprocess.run([sys.executable, "-c", OLD_CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["version"] == UNSUPPORTED
    assert f"verl {UNSUPPORTED} has no LLMServerManager" in got["error"] and "verl >= 0.8.0" in got["error"]
