"""The test harness itself (testbed/kvc_harness): the one percentile definition,
/metrics counter parsing, the reaper, ports, workloads, the HTTP client
against a real vllm-sim, and the rule that tests and scripts share code only
through the package (no sys.path edits, no imports across the two folders)."""

from __future__ import annotations

import json
import math
import os
import random
import re
import socket
import subprocess
import sys

import numpy as np
import pytest
from kvc_harness import HOST, REPO, client, procs, report, workloads
from kvc_harness.fleet import Sim, sim_binary

# ---------------------------------------------------------------------------
# report: one percentile definition


def test_percentile_is_numpy_linear_interpolation():
    rng = random.Random(3)
    for n in (1, 2, 3, 10, 101, 1000):
        xs = [rng.expovariate(1.0) for _ in range(n)]
        for p in (0, 1, 25, 50, 90, 99, 99.9, 100):
            assert report.percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)), rel=1e-12, abs=1e-15)
        assert report.percentiles(xs, 50, 99) == [report.percentile(xs, 50), report.percentile(xs, 99)]


def test_percentile_edges():
    assert report.percentile([4.0, 1.0, 3.0, 2.0], 0) == 1.0
    assert report.percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0
    assert report.percentile([1.0, 2.0], 50) == 1.5
    assert math.isnan(report.percentile([], 50))
    assert all(math.isnan(v) for v in report.percentiles([], 50, 99))
    for bad in (-1, 100.5, 990):
        with pytest.raises(ValueError, match="outside 0..100"):
            report.percentile([1.0], bad)


def test_format_rows_aligns_columns():
    out = report.format_rows(("name", "value"), [("a", "1.0"), ("longer", "10.25")], right=(1,))
    lines = out.splitlines()
    assert lines[0].split() == ["name", "value"]
    assert set(lines[1]) == {"-"}
    # The value column is right-aligned: every row ends at the same column.
    assert len({len(ln) for ln in (lines[0], lines[2], lines[3])}) == 1
    assert lines[2].startswith("a ") and lines[2].endswith("  1.0")


# ---------------------------------------------------------------------------
# client: the servers' own counters


def test_parse_counters_sums_engines_and_counts_a_renamed_counter_once():
    text = "\n".join(
        [
            "# HELP vllm:prefix_cache_queries_total x",
            'vllm:prefix_cache_queries_total{engine="0"} 100',
            'vllm:prefix_cache_queries_total{engine="1"} 50',
            # The same counter under the old spelling: not added twice.
            'vllm:prefix_cache_queries{engine="0"} 150',
            'vllm:prefix_cache_hits_total{engine="0"} 30',
            "vllm:num_preemptions_total 2",
            "vllm:time_to_first_token_seconds_sum 1.5",
            "vllm:time_to_first_token_seconds_count 3",
            'vllm:prompt_tokens_total{engine="0"} not-a-number',
            "unrelated_total 99",
            "",
        ]
    )
    c = client.parse_counters(text)
    assert c == {
        "queries": 150.0,
        "hits": 30.0,
        "ttft_sum": 1.5,
        "ttft_count": 3.0,
        "preemptions": 2.0,
        "prompt_tokens": 0.0,
    }


@pytest.fixture
def reaper():
    r = procs.Reaper()
    yield r
    r.close()


def test_client_against_vllm_sim(reaper):
    if not os.access(sim_binary(), os.X_OK):
        pytest.skip("no vllm-sim")
    sim = Sim(reaper).start()
    assert client.healthy(sim.url)
    assert client.served_model(sim.url)
    before = client.scrape(sim.url)
    prompt = workloads.seeded_prompt(1, 64)
    out = client.complete(sim.url, prompt, max_tokens=2)
    assert out["choices"]
    r = client.stream_completion(sim.url, client.served_model(sim.url), prompt, 3, seed=1)
    assert len(r["tokens"]) == 3 and 0 <= r["ttft"] <= r["e2e"]
    after = client.scrape(sim.url)
    assert after["queries"] - before["queries"] >= 2 * len(prompt)
    # The second request found the first one's blocks.
    assert after["hits"] > before["hits"]
    client.reset_prefix_caches({sim.id: sim.url})
    with pytest.raises(RuntimeError, match="HTTP 404"):
        client.request_json(sim.url + "/no/such/path")
    sim.kill()
    assert not client.healthy(sim.url)
    with pytest.raises(RuntimeError, match="not healthy"):
        client.wait_healthy({sim.id: sim.url}, timeout=0.3)


# ---------------------------------------------------------------------------
# procs


def test_free_ports_are_distinct_and_bindable():
    ports = procs.free_ports(5)
    assert len(set(ports)) == 5
    assert procs.ports_free(ports)
    s = socket.socket()
    try:
        s.bind((HOST, ports[0]))
        s.listen()
        assert not procs.ports_free(ports)
    finally:
        s.close()


def test_reaper_stops_process_groups_newest_first_and_survives_a_failing_stop():
    r = procs.Reaper()
    order = []
    # A shell with a grandchild: the whole process group must go.
    p = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300"], start_new_session=True)
    r.add_process(p)
    procs.wait_for(lambda: len(procs.descendants(p.pid)) >= 2, 10, "the shell's children")
    family = [p.pid, *procs.descendants(p.pid)]
    r.add(lambda: order.append("first"))

    def boom() -> None:
        order.append("boom")
        raise RuntimeError("a stop that fails")

    r.add(boom)
    r.add(lambda: order.append("last"))
    r.close()
    assert order == ["last", "boom", "first"]
    assert procs.wait_gone(family, timeout=10) == []
    r.close()  # a second close has nothing left to do
    assert order == ["last", "boom", "first"]


def test_wait_for_returns_the_value_or_names_what_timed_out():
    assert procs.wait_for(lambda: 7, 1, "seven") == 7
    with pytest.raises(AssertionError, match="waiting for nothing"):
        procs.wait_for(lambda: 0, 0.05, "nothing")


# ---------------------------------------------------------------------------
# workloads


def test_workloads_are_seeded_and_shaped():
    spec = workloads.WorkloadSpec(seed=5, steps=2, prompts=3, samples=4, tasks=2, agent_samples=2, turns=3)
    a, b = workloads.grpo_step(spec, 0), workloads.grpo_step(spec, 0)
    assert a == b and a != workloads.grpo_step(spec, 1)
    assert len(a) == 12 and len({r["rid"] for r in a}) == 12
    by_prompt = {}
    for r in a:
        by_prompt.setdefault(r["rid"].rsplit("-k", 1)[0], set()).add(tuple(r["prompt"]))
        assert 1 <= r["max_tokens"] <= spec.response_max
        assert all(workloads.TOKEN_LO <= t < workloads.TOKEN_HI for t in r["prompt"])
    # The samples of one prompt share it.
    assert len(by_prompt) == 3 and all(len(v) == 1 for v in by_prompt.values())
    trajs = workloads.agent_step(spec, 0)
    assert trajs == workloads.agent_step(spec, 0)
    assert len(trajs) == 4 and all(len(t["turns"]) == 3 for t in trajs)
    assert len({tuple(t["prompt"][: spec.system_tokens]) for t in trajs}) == 1
    assert workloads.seeded_prompt(1) == workloads.seeded_prompt(1) != workloads.seeded_prompt(2)
    ps = workloads.shared_prefix_prompts(3, random.Random(0), length=100, tail=10)
    assert all(len(p) == 100 and p[:90] == ps[0][:90] for p in ps) and ps[0][90:] != ps[1][90:]


# ---------------------------------------------------------------------------
# layout


def _py_files():
    for d in ("tests", *(os.path.join("testbed", x) for x in ("tests", "kvc_harness", "scripts"))):
        for f in sorted(os.listdir(os.path.join(REPO, d))):
            if f.endswith(".py"):
                yield os.path.join(d, f)


def test_no_sys_path_edits_and_no_imports_across_tests_and_scripts():
    edit = re.compile(r"\bsys\.path\.(insert|append|extend)\(|\bsys\.path\s*\+?=")
    cross = re.compile(
        r"^\s*(from|import)\s+(conftest|demo_lib|sim_harness|soak_lib|vllm_fixtures|bench_balancer|demo|soak|"
        r"overhead|chaos)\b",
        re.M,
    )
    # The one allowed edit: ai-dynamo-runtime is imported from the peers venv
    # (a third-party package in a second venv, not code of this repository).
    allowed = {os.path.join("testbed", "kvc_harness", "dynamo_route.py")}
    bad = []
    for rel in _py_files():
        with open(os.path.join(REPO, rel), encoding="utf-8") as f:
            src = f.read()
        if edit.search(src) and rel not in allowed:
            bad.append(f"{rel}: edits sys.path")
        m = cross.search(src)
        if m:
            bad.append(f"{rel}: imports {m.group(2)} (use kvc_harness)")
    assert not bad, bad


@pytest.mark.parametrize("script", ["demo.py", "soak.py", "overhead.py", "chaos.py", "arena.py", "actor_bench.py"])
def test_scripts_say_how_to_find_the_harness(script):
    path = os.path.join(REPO, "testbed", "scripts", script)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    bare = subprocess.run([sys.executable, path, "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert bare.returncode != 0
    assert "PYTHONPATH=testbed" in bare.stderr and "Traceback" not in bare.stderr
    ok = subprocess.run(
        [sys.executable, path, "--help"], capture_output=True, text=True, env=procs.harness_env(env), timeout=60
    )
    assert ok.returncode == 0, ok.stderr
    assert "usage:" in ok.stdout


def test_mean_ci_uses_students_t():
    from kvc_harness.report import mean_ci

    # sd of 1..4 is 1.291; t(0.975, 3) = 3.182 -> half-width 3.182 * 1.291 / 2 = 2.05.
    assert mean_ci([1.0, 2.0, 3.0, 4.0]) == [2.5, 2.1]
    assert mean_ci([5.0, 5.0, 5.0]) == [5.0, 0.0]
    m, h = mean_ci([7.0])
    assert m == 7.0 and h != h  # one sample: no interval (NaN)


def test_dynamo_router_process_reports_why_it_did_not_start():
    """The served Dynamo router under a Python without ai-dynamo-runtime: the
    child exits before READY, and the error carries the child's own reason
    (its log, read before the log is closed), not a bare timeout."""
    from kvc_harness.dynamo_route import DynamoRouterProcess

    if subprocess.run([sys.executable, "-c", "import dynamo._core"], capture_output=True).returncode == 0:
        pytest.skip("this Python has ai-dynamo-runtime: the failure path needs one without it")
    with pytest.raises(RuntimeError, match="did not start") as e:
        DynamoRouterProcess(sys.executable, [("s0", "tcp://127.0.0.1:1", "")], 16, 64, 4, 512, "m", timeout=60.0)
    assert "ai-dynamo-runtime is not installed" in str(e.value), str(e.value)[-600:]


def test_arena_merge_replaces_or_adds_only_the_named_rows():
    """arena_merge: the named policies' rows come from the new run, every
    other row stays, the note is appended to config.parts and the summary is
    recomputed; a run of another protocol, or one missing rows, is refused; a
    router the base never ran is added only on all of the base's pairs."""
    import copy
    import json

    from kvc_harness.arena_merge import merge

    with open(os.path.join(REPO, "docs", "results", "arena-rl-details.json"), encoding="utf-8") as f:
        base = json.load(f)
    new = copy.deepcopy(base)
    for r in new["runs"]:
        if r["row"]["policy"] == "smg_cache_aware":
            r["row"]["makespan_s"] = r["details"]["engine_makespan_s"] = 1.0
    merged = merge(base, new, ["smg_cache_aware"], "smg re-run")
    assert merged["config"]["parts"][-1] == "smg re-run"
    assert len(merged["runs"]) == len(base["runs"])
    for old, got in zip(base["runs"], merged["runs"]):
        if got["row"]["policy"] == "smg_cache_aware":
            assert got["details"]["engine_makespan_s"] == 1.0
        else:
            assert got == old
    smg = [s for s in merged["summary"] if s["policy"] == "smg_cache_aware"]
    assert smg and all(abs(s["makespan_s"]["mean"] - 1.0) < 1e-9 for s in smg), smg[:1]
    other = copy.deepcopy(new)
    other["config"]["speed"] = 5.0
    with pytest.raises(SystemExit, match="speed"):
        merge(base, other, ["smg_cache_aware"], "x")
    short = copy.deepcopy(new)
    short["runs"] = [r for r in short["runs"]
                     if not (r["row"]["policy"] == "smg_cache_aware" and r["row"]["seed"] == 351)]
    with pytest.raises(SystemExit, match="lacks"):
        merge(base, short, ["smg_cache_aware"], "x")
    # The frozen kvc_aware configuration may differ only when kvc_aware's rows are replaced.
    refrozen = copy.deepcopy(new)
    refrozen["config"]["kvc_frozen_commit"] = "0" * 40
    with pytest.raises(SystemExit, match="kvc_frozen_commit"):
        merge(base, refrozen, ["smg_cache_aware"], "x")
    assert merge(base, refrozen, ["kvc_aware"], "x")["config"]["kvc_frozen_commit"] == "0" * 40
    # A router the base never ran is added on exactly the base's (workload, seed) pairs.
    newcomer = copy.deepcopy(new)
    for r in newcomer["runs"]:
        if r["row"]["policy"] == "smg_cache_aware":
            r["row"]["policy"] = "smg_newcomer"
    added = merge(base, newcomer, ["smg_newcomer"], "added")
    assert len(added["runs"]) == len(base["runs"]) + sum(r["row"]["policy"] == "smg_cache_aware" for r in base["runs"])
    assert added["runs"][:len(base["runs"])] == base["runs"]
    assert {s["workload"] for s in added["summary"] if s["policy"] == "smg_newcomer"} == \
        {r["row"]["workload"] for r in base["runs"]}
    newcomer["runs"] = [r for r in newcomer["runs"]
                        if not (r["row"]["policy"] == "smg_newcomer" and r["row"]["seed"] == 352)]
    with pytest.raises(SystemExit, match="cannot be added"):
        merge(base, newcomer, ["smg_newcomer"], "x")
    with pytest.raises(SystemExit, match="cannot be added"):
        merge(base, new, ["no_such_router"], "x")
    # A run of only the rows without the hold (arena.py --nohold-only) adds
    # them: its hold keys and kvc_aware's frozen path may differ, not
    # kvc_aware's configuration, and no held row may come from it.
    held = copy.deepcopy(base)  # the published file has +nohold rows already
    held["runs"] = [r for r in held["runs"] if not r["row"]["policy"].endswith("+nohold")]
    nohold = copy.deepcopy(held)
    nohold["config"].update(both_holds=True, nohold_only=True, kvc_frozen="docs/results/elsewhere.json")
    nohold["runs"] = [copy.deepcopy(r) for r in held["runs"] if r["row"]["policy"] in ("verl_default", "kvc_aware")]
    for r in nohold["runs"]:
        r["row"]["policy"] += "+nohold"
    both = merge(held, nohold, ["verl_default+nohold", "kvc_aware+nohold"], "nohold")
    assert nohold["runs"] and len(both["runs"]) == len(held["runs"]) + len(nohold["runs"])
    assert both["config"]["kvc_frozen"] == "docs/results/elsewhere.json"
    assert not both["config"]["both_holds"] and "nohold_only" not in both["config"]
    assert {s["policy"] for s in both["summary"]} >= {"verl_default+nohold", "kvc_aware+nohold"}
    with pytest.raises(SystemExit, match="both_holds"):
        merge(held, nohold, ["verl_default"], "x")
    nohold["config"]["kvc_knobs"] = {**nohold["config"]["kvc_knobs"], "alpha": 0.9}
    with pytest.raises(SystemExit, match="kvc_knobs"):
        merge(held, nohold, ["verl_default+nohold", "kvc_aware+nohold"], "x")


def test_demo_step_with_correlated_lengths():
    """workloads.grpo_step with length_corr (the demo's --sat-workload
    grpo_rho05): the same lengths for every rho (stratified), a prompt's
    samples correlated (rho 0.8 groups differ far more than rho 0), in verl's
    order (8 workers' chunks interleaved)."""
    import statistics

    base = dict(seed=3, steps=1, prompts=32, samples=8, prompt_tokens=(16, 32), response_median=192,
                response_sigma=0.9, response_max=2048, tasks=0)
    steps = {rho: workloads.grpo_step(workloads.WorkloadSpec(**base, length_corr=rho), 0) for rho in (0.0, 0.8)}
    assert sorted(r["max_tokens"] for r in steps[0.0]) == sorted(r["max_tokens"] for r in steps[0.8])

    def spread_of_group_means(reqs):
        by = {}
        for r in reqs:
            by.setdefault(r["rid"].rsplit("-k", 1)[0], []).append(math.log(r["max_tokens"]))
        return statistics.pstdev([statistics.mean(v) for v in by.values()])

    assert spread_of_group_means(steps[0.8]) > 1.5 * spread_of_group_means(steps[0.0])
    # verl's order: 256 requests in 8 chunks of 32 (4 prompts each), interleaved.
    order = [r["rid"] for r in steps[0.8]]
    assert order[:2] == ["grpo-s0-p0-k0", "grpo-s0-p4-k0"] and order[8] == "grpo-s0-p0-k1"
    # Without length_corr: independent draws, shuffled (the earlier model).
    plain = workloads.grpo_step(workloads.WorkloadSpec(**base), 0)
    assert [r["rid"] for r in plain] != sorted(r["rid"] for r in plain)


# sha256 of a one-step first-epoch draw (seed 5, 64 prompts x 8, rho 0.5) as
# workloads.grpo_step made it before recurring prompts existed (8861425).
ONE_STEP_SHA256 = "89d72b1829b19e522c1cea0106fbb850b6e49717ea841fa451ad188c37327a93"


def test_demo_step_with_recurring_prompts():
    """workloads.grpo_step with dataset_prompts (the demo's grpo_recur): step 1
    of a dataset of one step's prompts is epoch 2, the same prompt tokens in
    a new order, each prompt's lengths close to its epoch-1 lengths
    (difficulty correlated 0.8 between epochs), the same multiset of lengths;
    without a dataset every step's prompts are fresh, and the one-step draw
    a seed made before datasets existed is unchanged."""
    import hashlib
    import statistics

    base = dict(seed=5, steps=2, prompts=64, samples=8, prompt_tokens=(16, 32), response_median=192,
                response_sigma=0.9, response_max=2048, tasks=0, length_corr=0.6)
    spec = workloads.WorkloadSpec(**base, dataset_prompts=64, epoch_corr=0.8)
    s0, s1 = workloads.grpo_step(spec, 0), workloads.grpo_step(spec, 1)
    assert s0 == workloads.grpo_step(spec, 0)  # seeded

    def group(reqs: list) -> dict:
        """prompt tokens -> its samples' log lengths"""
        out: dict = {}
        for r in reqs:
            out.setdefault(tuple(r["prompt"]), []).append(math.log(r["max_tokens"]))
        return out

    g0, g1 = group(s0), group(s1)
    assert set(g0) == set(g1) and len(g0) == 64  # every prompt returns in epoch 2
    assert [r["prompt"] for r in s0[:64]] != [r["prompt"] for r in s1[:64]]  # in a reshuffled order
    assert sorted(r["max_tokens"] for r in s0) == sorted(r["max_tokens"] for r in s1)
    m0 = [statistics.mean(g0[k]) for k in g0]
    m1 = [statistics.mean(g1[k]) for k in g0]
    assert statistics.correlation(m0, m1) > 0.5, statistics.correlation(m0, m1)
    # An independent epoch (epoch_corr 0) keeps the prompts, not their lengths.
    ind = workloads.WorkloadSpec(**base, dataset_prompts=64, epoch_corr=0.0)
    g0i, gi = group(workloads.grpo_step(ind, 0)), group(workloads.grpo_step(ind, 1))
    assert abs(statistics.correlation([statistics.mean(g0i[k]) for k in g0i],
                                      [statistics.mean(gi[k]) for k in g0i])) < 0.35
    # No dataset: fresh prompts each step.
    fresh = workloads.WorkloadSpec(**base)
    assert not set(group(workloads.grpo_step(fresh, 0))) & set(group(workloads.grpo_step(fresh, 1)))
    # The one-step first-epoch draw is the one committed demo runs hashed.
    one = workloads.grpo_step(workloads.WorkloadSpec(**dict(base, steps=1, length_corr=0.5)), 0)
    h = hashlib.sha256(json.dumps([[r["rid"], r["prompt"], r["max_tokens"], r["seed"]] for r in one]).encode())
    assert h.hexdigest() == ONE_STEP_SHA256, h.hexdigest()


def test_tune_peers_objectives_pick_by_their_own_rule(monkeypatch):
    """tune_peers' "step" objective picks the grid point with the shortest
    step over verl_default's whatever its TTFT; "step+ttft" (make
    arena-tuned's) weighs both; an unknown objective is refused. The runs
    are stand-ins: this checks the choice, test_arena the real routers."""
    from kvc_harness import arena

    # grid point -> (step time, TTFT p99) over verl_default's (1.0, 1.0)
    effect = {0: (1.00, 1.00), 1: (0.95, 1.30), 2: (0.98, 0.90), 3: (1.02, 0.95)}

    def fake_run(spec, policy, seed, cfg, log=print):
        step, p99 = (1.0, 1.0) if policy == "verl_default" else effect[int(policy.rpartition("grid")[2])]
        return {"row": {"ttft_p99_s": p99 * (1 + seed % 2), "errors": 0},
                "details": {"engine_makespan_s": 100.0 * step * (1 + seed % 2), "router_args": []}}

    monkeypatch.setattr(arena, "run_one", fake_run)
    spec = arena.WorkloadSpec(name="grpo_rho05", kind="grpo")
    grid = arena.TUNE_GRID["sglang_router_cache_aware"]
    cfg = arena.ArenaConfig()
    step = arena.tune_peers([spec], ["sglang_router_cache_aware"], [101, 102], cfg, log=lambda s: None,
                            objective="step")
    assert step["chosen"]["sglang_router_cache_aware"]["grpo_rho05"] == grid[1]
    assert step["objective"] == arena.TUNE_OBJECTIVES["step"]
    both = arena.tune_peers([spec], ["sglang_router_cache_aware"], [101, 102], cfg, log=lambda s: None)
    assert both["chosen"]["sglang_router_cache_aware"]["grpo_rho05"] == grid[2]  # (0.98 + 0.90) / 2 is lowest
    assert len(step["points"]) == len(both["points"]) == 2 * len(grid)
    with pytest.raises(ValueError, match="tuning objective 'ttft'"):
        arena.tune_peers([spec], ["sglang_router_cache_aware"], [101], cfg, objective="ttft")


def test_renderer_knows_the_arena_router_queues():
    """render_results.py keeps its own copy of the arena's router-queue rows
    (it imports no harness module that needs the library); the two agree."""
    import importlib.util

    from kvc_harness.arena import ROUTER_QUEUES

    path = os.path.join(REPO, "testbed", "scripts", "render_results.py")
    spec = importlib.util.spec_from_file_location("render_results_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert tuple(mod.ROUTER_QUEUE_ROWS) == tuple(ROUTER_QUEUES)
    assert mod.queues_in_router("dynamo_kv_router+queue+nohold")
    assert mod.queues_in_router("dynamo_kv_router+queue@tuned")
    assert not mod.queues_in_router("dynamo_kv_router+ttl+nohold")


@pytest.mark.parametrize(
    "policy, message",
    [
        ("kvc_aware+bogus", "unknown option"),
        ("kvc_aware+engine_queue", "add +admit"),
        ("kvc_aware+lengths+engine_queue", "add +admit"),
    ],
)
def test_satstep_policy_options_are_checked_before_anything_runs(policy: str, message: str) -> None:
    """A demo policy's options are checked before any actor or request: an
    unknown one, or an admission setting without admission, is an error."""
    from kvc_harness import satstep

    with pytest.raises(ValueError, match=re.escape(message)):
        satstep.run_policy(None, policy, [], [], "m")


def test_satstep_policy_config_tells_the_router_what_verls_hook_tells() -> None:
    """The demo's router is configured as verl's hook configures it: a GRPO
    rollout's ``response_length`` and ``turns: single`` are told, so the
    group spread's gates read the rollout the user runs; verl's own balancer
    gets no router configuration."""
    from kvc_harness import satstep

    cfg = satstep.policy_config("kvc_aware+admit+engine_queue", [], 64, response_tokens=2048)
    assert cfg is not None
    inner = cfg["config"]
    assert inner["turns"] == "single" and inner["response_tokens"] == 2048
    assert inner["admission"] == {"enabled": True, "engine_queue": 1} and "lengths" not in inner
    assert inner["load"] == {"max_num_seqs": 64}
    quiet = satstep.policy_config("kvc_aware+lengths", [])
    assert quiet is not None
    assert "turns" not in quiet["config"] and "response_tokens" not in quiet["config"]
    # Without +admit the row is the routing alone, whichever class runs it (admission's default is auto).
    assert quiet["config"]["lengths"] == {"enabled": True} and quiet["config"]["admission"] == {"enabled": False}
    assert satstep.policy_config("default", [], 64, response_tokens=2048) is None


def test_arena_load_frozen_refuses_a_freeze_that_leaves_parameters_out(tmp_path) -> None:
    """The arena's --kvc-frozen reads docs/frozen-kvc-aware.json whole, and
    refuses a file whose strategy leaves a parameter out (it would run
    today's default for it), naming the parameters."""
    from kvc_harness.arena import FROZEN_DEFAULT, load_frozen

    knobs, commit = load_frozen(FROZEN_DEFAULT)
    with open(FROZEN_DEFAULT, encoding="utf-8") as f:
        doc = json.load(f)
    assert knobs == doc["strategy"] and commit == doc["commit"]
    del doc["strategy"]["group_spread_open_ratio"], doc["strategy"]["work_weight"]
    path = tmp_path / "frozen.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="does not name group_spread_open_ratio, work_weight"):
        load_frozen(str(path))


def test_arena_runs_a_freezes_session_move_tokens(tmp_path) -> None:
    """The arena's kvc_aware rows run the session_move_tokens their freeze
    recorded, and 0 for a freeze from before the setting (it moved sessions
    by bound counts alone), so rerunning an old freeze runs its behaviour."""
    from kvc_harness.arena import FROZEN_DEFAULT, Server, frozen_router, user_router_config

    with open(FROZEN_DEFAULT, encoding="utf-8") as f:
        today = json.load(f)["library_defaults"]["router"]["session_move_tokens"]
    assert frozen_router(FROZEN_DEFAULT) == {"session_move_tokens": today} and today > 0
    old = os.path.join(REPO, "docs", "results", "frozen-kvc-aware-2c63719.json")
    assert frozen_router(old) == {"session_move_tokens": 0}
    servers = [Server(sid="127.0.0.1:1", url="http://127.0.0.1:1")]
    cfg = user_router_config(servers, 16, {}, "multi", 0, frozen_router(old))
    assert cfg["config"]["session_move_tokens"] == 0 and cfg["config"]["turns"] == "multi"
    assert "session_move_tokens" not in user_router_config(servers, 16, {})["config"]
