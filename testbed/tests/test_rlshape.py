"""The arena's RL workload shape (issue 26) is kvbench's: the quantile
functions match the Go model's golden file, and the arena's shaped
workloads have the structure the model promises (same multiset every seed
and rho, within-group correlation near rho, recurring prompts, verl's
submission order, task difficulty in agents)."""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import replace
from typing import Dict, List

from kvc_harness import REPO
from kvc_harness.arena import build_steps, workload_specs
from kvc_harness.workloads import (
    Dataset,
    Shape,
    lognormal_quantile,
    pareto_quantile,
    rank_quantiles,
    turns_quantile,
    verl_order,
)

GOLDEN = os.path.join(REPO, "testbed", "bench", "testdata", "rlshape_golden.json")


def test_quantiles_match_the_go_model() -> None:
    with open(GOLDEN, encoding="utf-8") as f:
        g = json.load(f)
    r, t = g["response"], g["tool_latency"]
    for row in g["rows"]:
        q = row["q"]
        assert lognormal_quantile(q, r["median"], r["sigma"], r["min"], r["max"]) == row["response"], row
        assert lognormal_quantile(q, r["median"], r["sigma"], r["min"], r["max"], 0.1) == row["response_trunc_0_1"]
        assert turns_quantile(q, 4, 12) == row["turns_4_12"]
        assert math.isclose(pareto_quantile(q, t["min_s"], t["max_s"], t["alpha"]), row["tool_latency_s"],
                            rel_tol=1e-9)


def _icc(groups: List[List[int]]) -> float:
    """Within-group correlation of log length (see rlshape_test.go's withinCorr)."""
    n = len(groups[0])
    vals = [math.log(v) for g in groups for v in g]
    mu = sum(vals) / len(vals)
    tot = sum((v - mu) ** 2 for v in vals) / len(vals)
    means = [sum(math.log(v) for v in g) / n for g in groups]
    between = sum((m - mu) ** 2 for m in means) / len(means)
    return (between - tot / n) / (tot * (1 - 1 / n))


def _groups(jobs) -> List[List[int]]:
    by: Dict[str, List[int]] = {}
    for j in jobs:
        by.setdefault(j.rid.rsplit("-", 1)[0], []).append(j.turns[0].max_tokens)
    return list(by.values())


def test_grpo_rho_same_multiset_correlated_groups() -> None:
    specs = workload_specs()
    base = replace(specs["grpo_rho05"], prompts=256, samples=16)
    want = None
    for rho in (0.0, 0.5, 0.8):
        iccs = []
        for seed in (1, 2, 3):
            jobs = build_steps(replace(base, length_corr=rho), seed)[0].jobs
            lens = sorted(j.turns[0].max_tokens for j in jobs)
            want = want or lens
            assert lens == want, (rho, seed)  # stratified: the multiset never moves
            iccs.append(_icc(_groups(jobs)))
        assert abs(sum(iccs) / len(iccs) - rho) < 0.07, (rho, iccs)


def test_grpo_verl_order_keeps_siblings_together_per_worker() -> None:
    jobs = build_steps(workload_specs()["grpo_rho08"], 4)[0].jobs
    # 1,024 samples in 8 worker chunks of 128 (16 prompts x 8 samples each),
    # interleaved: position i*8 + w is worker w's i-th request.
    for w in range(8):
        mine = jobs[w::8]
        prompts = [j.rid.rsplit("-", 1)[0] for j in mine]
        assert len(set(prompts)) == 16
        for i in range(0, len(mine), 8):
            assert len(set(prompts[i:i + 8])) == 1  # a prompt's 8 samples back to back
    assert verl_order([[1, 2], [3, 4], [5, 6], [7, 8]], workers=2) == [1, 5, 2, 6, 3, 7, 4, 8]


def test_recurring_prompts_return_with_correlated_lengths() -> None:
    spec = workload_specs()["grpo_recur"]
    s1, s2 = build_steps(spec, 9)
    t1 = {j.text for j in s1.jobs}
    t2 = {j.text for j in s2.jobs}
    assert t1 == t2  # dataset == batch: every prompt returns in epoch 2
    mean1: Dict[str, float] = {}
    mean2: Dict[str, float] = {}
    for jobs, out in ((s1.jobs, mean1), (s2.jobs, mean2)):
        acc: Dict[str, List[float]] = {}
        for j in jobs:
            acc.setdefault(j.text, []).append(math.log(j.turns[0].max_tokens))
        out.update({k: sum(v) / len(v) for k, v in acc.items()})
    xs = [mean1[k] for k in mean1]
    ys = [mean2[k] for k in mean1]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    cov = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    r = cov / math.sqrt(sum((x - mx) ** 2 for x in xs) * sum((y - my) ** 2 for y in ys))
    assert r > 0.5, r  # a prompt's group length is predictable from last epoch's
    ds = Dataset("d", Shape(dataset_prompts=3000, epoch_corr=0.8), 100)
    a = [ds.difficulty(k, 1) for k in range(3000)]
    b = [ds.difficulty(k, 2) for k in range(3000)]
    r = sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    assert abs(r - 0.8) < 0.03


def test_agent_task_difficulty_and_heavy_tailed_tools() -> None:
    spec = replace(workload_specs()["agent_task"], tasks=64, agent_samples=4)
    jobs = build_steps(spec, 2)[0].jobs
    tasks: Dict[str, List[int]] = {}
    for j in jobs:
        tasks.setdefault(j.rid.split("-")[0], []).append(len(j.turns))
    allv = [v for g in tasks.values() for v in g]
    mu = sum(allv) / len(allv)
    total = sum((v - mu) ** 2 for v in allv)
    within = sum((v - sum(g) / len(g)) ** 2 for g in tasks.values() for v in g)
    assert within < 0.5 * total, (within, total)
    lats = sorted(t.tool_latency_s for j in jobs for t in j.turns)
    assert 1.0 <= lats[0] and lats[-1] <= 60.0 and lats[len(lats) // 2] < 4.0 and lats[-1] > 20.0
    # The same multisets on another seed; different assignment.
    other = build_steps(spec, 3)[0].jobs
    assert sorted(len(j.turns) for j in other) == sorted(allv)
    assert sorted(t.max_tokens for j in other for t in j.turns) == sorted(t.max_tokens for j in jobs for t in j.turns)


def test_rank_quantiles_is_a_stratified_draw() -> None:
    rng = random.Random(1)
    lat = [rng.gauss(0, 1) for _ in range(100)]
    out = rank_quantiles(lat, lambda q: q)
    assert sorted(out) == [(i + 0.5) / 100 for i in range(100)]
    assert out[lat.index(max(lat))] == 0.995


def test_render_rl_pairs_seeds_against_verl_default(tmp_path) -> None:
    import subprocess
    import sys

    for seed, (verl, kvc) in enumerate(((100.0, 90.0), (200.0, 190.0)), start=1):
        rep = {"policies": {"verl_default": {"makespan_s": verl + 50, "ttft_p99_s": 2.0},
                            "kvc_aware": {"makespan_s": kvc + 40, "ttft_p99_s": 1.0}},
               "makespan_steps_s": {"verl_default": [50.0, verl], "kvc_aware": [40.0, kvc]}}
        (tmp_path / f"rl-rec-{seed}.json").write_text(json.dumps(rep))
    from kvc_harness import procs

    r = subprocess.run([sys.executable, os.path.join(REPO, "testbed", "scripts", "render_rl.py"), str(tmp_path)],
                       capture_output=True, text=True, timeout=60, check=True, env=procs.harness_env())
    # Step 2 only, paired per seed: 0.9 and 0.95 -> mean 0.925.
    assert "| kvc_aware | 140.0 ± " in r.stdout and "| 0.925 ± " in r.stdout and "| 0.500 ± 0.000 |" in r.stdout
    assert "(2 fresh seeds" in r.stdout


def test_render_rl_counters_are_the_runs_own(tmp_path) -> None:
    """With counters, each row also gives its hit rate (mean ± CI over the
    seeds, in %) and its mean preemptions per run, read from the same files;
    without, the table is unchanged."""
    import subprocess
    import sys

    def render(counters: bool) -> str:
        path = os.pathsep.join([os.path.join(REPO, "testbed"), os.path.join(REPO, "testbed", "scripts")])
        code = f"import render_rl; print(render_rl.render({str(tmp_path)!r}, 'x', counters={counters}))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, PYTHONPATH=path))
        assert out.returncode == 0, out.stderr
        return out.stdout

    for seed, (hit, pre) in enumerate(((0.5, 10), (0.7, 30)), start=1):
        rep = {"policies": {"verl_default": {"makespan_s": 100.0, "ttft_p99_s": 2.0, "hit_rate": 0.4,
                                             "preemptions": 5},
                            "kvc_aware": {"makespan_s": 90.0, "ttft_p99_s": 1.0, "hit_rate": hit,
                                          "preemptions": pre}}}
        (tmp_path / f"rl-r5-{seed}.json").write_text(json.dumps(rep))
    with_counters = render(True)
    assert "| hit rate, whole run | preemptions per run |" in with_counters
    row = next(ln for ln in with_counters.splitlines() if ln.startswith("| kvc_aware |"))
    assert row.endswith("| 60.0 ± 127.1% | 20 |"), row
    assert next(ln for ln in with_counters.splitlines() if ln.startswith("| verl_default |")).endswith(
        "| 40.0 ± 0.0% | 5 |")
    plain = render(False)
    assert "hit rate" not in plain and "| kvc_aware | 90.0 ± 0.0 | 0.900 ± 0.000 | 0.500 ± 0.000 |" in plain
