"""A short arena on real processes: vllm-sim fleets, the real sglang-router
(cache_aware) from .venv-peers, and kvc-router's balancer, replaying a small
agent workload and a small Mooncake slice. Runs ``scripts/arena.py --short``
exactly as ``make arena-short`` does and checks its JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(REPO, ".venv-peers")
POLICIES = ["round_robin", "verl_default", "kvc_aware", "sglang_router_cache_aware"]
WORKLOADS = ["agent", "mooncake"]
KEYS = {"workload", "policy", "seed", "hit_rate", "ttft_p50_s", "ttft_p99_s", "makespan_s", "imbalance", "errors"}


def _peers_ready() -> str:
    """'' when .venv-peers has sglang-router, else why it could not be built."""
    if os.path.isfile(os.path.join(PEERS, ".stamp")):
        return ""
    r = subprocess.run(["bash", os.path.join(REPO, "scripts", "peers_venv.sh")], cwd=REPO, capture_output=True,
                       text=True, timeout=900)
    if r.returncode != 0:
        return f"scripts/peers_venv.sh failed (rc {r.returncode}): {(r.stderr or r.stdout)[-300:]}"
    return ""


@pytest.fixture(scope="module")
def arena(tmp_path_factory):
    why = _peers_ready()
    if why:
        pytest.skip(f".venv-peers cannot be built: {why}")
    out = tmp_path_factory.mktemp("arena")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests"), os.path.join(REPO, "scripts")]))
    cmd = [sys.executable, os.path.join(REPO, "scripts", "arena.py"), "--short", "--seeds", "1",
           "--workloads", ",".join(WORKLOADS), "--policies", ",".join(POLICIES), "--out", str(out)]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"arena failed (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    with open(out / "arena.json", encoding="utf-8") as f:
        data = json.load(f)
    return {"data": data, "stdout": r.stdout, "out": out}


def test_json_shape(arena):
    data = arena["data"]
    assert set(data) == {"results"}
    rows = data["results"]
    assert len(rows) == len(POLICIES) * len(WORKLOADS)
    assert {(r["workload"], r["policy"]) for r in rows} == {(w, p) for w in WORKLOADS for p in POLICIES}
    for r in rows:
        assert set(r) == KEYS
        assert isinstance(r["workload"], str) and isinstance(r["policy"], str) and isinstance(r["seed"], int)
        assert isinstance(r["errors"], int)
        for k in ("hit_rate", "ttft_p50_s", "ttft_p99_s", "makespan_s", "imbalance"):
            assert isinstance(r[k], float), (k, r)
        assert 0.0 <= r["hit_rate"] <= 1.0
        assert 0.0 < r["ttft_p50_s"] <= r["ttft_p99_s"]
        assert r["makespan_s"] > 0 and r["imbalance"] >= 1.0


def test_no_errors(arena):
    bad = [r for r in arena["data"]["results"] if r["errors"]]
    assert not bad, bad


def test_cache_aware_beats_round_robin(arena):
    """Server-measured prefix-cache hit rate (the fleet's own counters)."""
    rows = arena["data"]["results"]
    for w in WORKLOADS:
        by = {r["policy"]: r["hit_rate"] for r in rows if r["workload"] == w}
        for p in ("kvc_aware", "sglang_router_cache_aware"):
            assert by[p] > by["round_robin"], (w, by)


def test_outputs(arena):
    assert "arena:" in arena["stdout"] and "sglang_router_cache_aware" in arena["stdout"]
    details = json.loads((arena["out"] / "arena-details.json").read_text())
    runs = details["runs"]
    assert all(run["details"]["requests"] > 0 for run in runs)
    # The kvc_aware balancer really consumed the fleet's KV events.
    kvc = [run for run in runs if run["row"]["policy"] == "kvc_aware"]
    assert kvc and all(run["details"].get("event_stored_blocks", 0) > 0 for run in kvc)
    assert (arena["out"] / "arena.png").stat().st_size > 0
