"""``python -m kvc_router.verl status`` against the published verl releases:
on each supported release (the venv's own and the overlays, as
``make test-verl`` runs this directory once per release) it reports the
release, supported and tested, every patch applied by importing verl's real
modules, and READY (exit 0); on the published 0.7.1 (an overlay
scripts/verl_venv.sh installs) it says NOT SUPPORTED, why, and the upgrade."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

UNSUPPORTED = "0.7.1"


def _status(*args, pythonpath=None):
    env = {k: v for k, v in os.environ.items() if k != "KVC_ROUTER_VERL_HOOK"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-m", "kvc_router.verl", "status", *args], env=env, capture_output=True,
                         text=True, timeout=600)
    return out.returncode, out.stdout, out.stderr


def test_status_on_a_supported_release_is_ready(expected_verl):
    rc, out, err = _status("--json")
    rep = json.loads(out)
    assert rc == 0 and rep["ready"] is True, (rep["problems"], err[-2000:])
    v = rep["verl"]
    assert v["installed"] and v["version"] == expected_verl and v["supported"] and v["tested"], v
    assert rep["hook"]["pth_installed"] and rep["hook"]["watcher_active"], rep["hook"]
    states = {name: p["state"] for name, p in rep["patches"].items()}
    # The hook's essential patches applied to this release's real modules.
    for name in ("verl.utils.config.omega_conf_to_dataclass",
                 "verl.workers.rollout.llm_server.LLMServerManager._init_global_load_balancer",
                 "verl.workers.rollout.llm_server.LLMServerManager._initialize_llm_servers",
                 "verl.workers.rollout.llm_server.LLMServerClient._acquire_server"):
        assert states[name] == "applied", states
    # Prefill/decode replica modules import only with their engine installed;
    # this venv has neither engine, so those patches are reported, not failed.
    for name, engine in (("verl.workers.rollout.vllm_rollout.vllm_pd_replica.vLLMPDReplica._spawn_pd_server", "vllm"),
                         ("verl.workers.rollout.sglang_rollout.sglang_pd_replica.SGLangPDReplica._launch_one",
                          "sglang")):
        if name in states and rep["engines"][engine] is None:
            assert states[name] in ("engine absent", "module absent"), states
    assert all(s in ("applied", "module absent", "engine absent") for s in states.values()), states
    assert rep["ray"] and set(rep["engines"]) == {"vllm", "sglang"}
    rc, text, _ = _status()
    assert rc == 0 and f"verl: {expected_verl} at " in text and "supported (tested)" in text, text
    assert "will apply" in text and text.rstrip().splitlines()[-1].startswith("READY"), text


def test_status_on_the_published_0_7_1_is_not_supported():
    overlay = os.path.join(sys.prefix, "verl-overlays", UNSUPPORTED)
    if not os.path.isdir(overlay):
        pytest.skip(f"no verl {UNSUPPORTED} overlay at {overlay} (scripts/verl_venv.sh makes it)")
    rc, text, err = _status(pythonpath=overlay)
    assert rc == 1, err[-2000:]
    assert f"verl: {UNSUPPORTED} at {overlay}" in text and "NOT SUPPORTED" in text, text
    assert f"verl {UNSUPPORTED} has no LLMServerManager" in text
    assert "fix: upgrade verl: pip install verl==0.9.1" in text
    rc, out, _ = _status("--json", pythonpath=overlay)
    rep = json.loads(out)
    assert rep["verl"]["version"] == UNSUPPORTED and rep["verl"]["supported"] is False
    assert rep["patches"]["verl.workers.rollout.llm_server.LLMServerManager._init_global_load_balancer"]["state"] \
        == "module absent"
