"""testbed/scripts/render_results.py: tables rendered from the benchmarks' JSON
into marked blocks, with 95% CIs and "best" only without overlap."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Dict, Sequence, Tuple

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "testbed", "scripts", "render_results.py")


def _const(name: str) -> str:
    """A results folder the renderer names (RL_DEFAULTS, HELDOUT_NOW, ...), read from its source."""
    with open(SCRIPT, encoding="utf-8") as f:
        m = re.search(rf'^{name} = "([^"]+)"$', f.read(), re.M)
    assert m, name
    return m.group(1)


RL_DEFAULTS, HELDOUT_NOW = _const("RL_DEFAULTS"), _const("HELDOUT_NOW")


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "testbed"))
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env, timeout=120)


def _arena_run(w: str, p: str, seed: int, mk: float, hit: float) -> dict:
    return {"row": {"workload": w, "policy": p, "seed": seed, "hit_rate": hit, "ttft_p50_s": 0.01, "ttft_p99_s": 0.1,
                    "makespan_s": mk + 5, "imbalance": 1.1, "errors": 0},
            "details": {"engine_makespan_s": mk}}


def _docs(tmp) -> None:
    (tmp / "docs").mkdir()
    for name, block in (("docs/arena.md", "arena"), ("README.md", "headline"), ("docs/kvbench.md", "kvbench")):
        (tmp / name).write_text(f"# t\n\nintro\n\n<!-- BEGIN RENDERED: {block} -->\nold text\n"
                                f"<!-- END RENDERED: {block} -->\n\noutro\n")


def _rl_tree(tmp: pathlib.Path) -> pathlib.Path:
    """docs/arena.md and README.md with only the arena-rl blocks, and an
    empty results folder (returned) for the arena-rl JSON."""
    (tmp / "docs").mkdir()
    (tmp / "docs" / "arena.md").write_text(
        "# a\n\n<!-- BEGIN RENDERED: arena-rl -->\n<!-- END RENDERED: arena-rl -->\n")
    (tmp / "README.md").write_text(
        "# r\n\n<!-- BEGIN RENDERED: headline-rl -->\n<!-- END RENDERED: headline-rl -->\n")
    res = tmp / "results"
    res.mkdir()
    return res


def _grpo_and_agent_runs(extra: Sequence[Tuple[str, float]]) -> list:
    """grpo_rho05 and agent_task on seeds 351-353: verl_default and
    kvc_aware with and without the hold, plus ``extra`` (policy, step)."""
    base = (("verl_default", 60), ("kvc_aware", 59), ("verl_default+nohold", 50), ("kvc_aware+nohold", 49))
    return [_arena_run(w, p, seed, mk + j, 0.6) for seed, j in zip((351, 352, 353), (0.0, 0.5, -0.5))
            for w in ("grpo_rho05", "agent_task") for p, mk in (*base, *extra)]


def _render_arena(tmp_path, runs: list) -> str:
    """Renders an arena JSON of these runs (--speed 20, paced, non-streamed)
    into tmp_path's docs; returns docs/arena.md's text."""
    arena = tmp_path / "arena-details.json"
    arena.write_text(json.dumps({"config": {"speed": 20, "clock": "paced", "stream": False}, "runs": runs}))
    r = _run("--arena", str(arena), "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    return (tmp_path / "docs" / "arena.md").read_text()


def test_render_blocks_with_intervals(tmp_path):
    _docs(tmp_path)
    runs = []
    # grpo_sat: kvc_aware clearly faster (non-overlapping); long_agent: overlapping -> tie.
    for seed, j in zip((301, 302, 303), (0.0, 0.5, -0.5)):
        runs += [_arena_run("grpo_sat", "verl_default", seed, 50 + j, 0.5), _arena_run("grpo_sat", "kvc_aware", seed,
                                                                                         30 + j, 0.8),
                 _arena_run("grpo_sat", "sglang_router_cache_aware", seed, 40 + j, 0.8),
                 _arena_run("long_agent", "verl_default", seed, 100 + 10 * j, 0.9),
                 _arena_run("long_agent", "kvc_aware", seed, 101 - 10 * j, 0.9),
                 _arena_run("long_agent", "sglang_router_cache_aware", seed, 99 + 10 * j, 0.9)]
    arena = tmp_path / "arena-details.json"
    arena.write_text(json.dumps({"config": {"speed": 20, "clock": "paced", "stream": False}, "runs": runs}))
    stat = {"Mean": 10.0, "SD": 1.0, "N": 10, "CI95": 0.7}
    rows = [{"policy": "verl_default", "tuned": False, "hit_rate": stat, "ttft_p50_s": stat, "ttft_p99_s": stat,
             "makespan_s": stat, "makespan_over_verl": stat},
            {"policy": "sglang_cache_aware", "tuned": False, "hit_rate": stat, "ttft_p50_s": stat,
             "ttft_p99_s": stat, "makespan_s": stat, "makespan_over_verl": stat},
            {"policy": "sglang_cache_aware", "tuned": True, "params": {"balance_abs_threshold": 8}, "hit_rate": stat,
             "ttft_p50_s": stat, "ttft_p99_s": stat, "makespan_s": dict(stat, Mean=5.0), "makespan_over_verl": stat}]
    kv = tmp_path / "kvbench-grpo.json"
    kv.write_text(json.dumps({"workload": "grpo", "report_seeds": list(range(301, 311)), "tune_seeds": [101, 102],
                              "rows": rows, "kvc_frozen": {"commit": "abc"}}))
    r = _run("--arena", str(arena), "--kvbench", str(kv), "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    a = (tmp_path / "docs" / "arena.md").read_text()
    assert "old text" not in a and a.startswith("# t\n\nintro") and a.rstrip().endswith("outro")
    assert "30.0 ± 1.2" in a  # t(0.975, 2) = 4.303 x SD 0.5 / sqrt 3
    grpo = a.split("#### grpo_sat")[1].split("####")[0]
    # One rule: paired per-seed ratios; kvc_aware's losses line comes first and is always there.
    assert "step time shorter than verl_default, paired by seed" in grpo and "kvc_aware 0.600" in grpo
    assert "- kvc_aware loses (" in grpo and grpo.index("kvc_aware loses") < grpo.index("kvc_aware wins")
    assert "kvc_aware wins: step time vs verl_default" in grpo and "step time vs sglang_router_cache_aware" in grpo
    assert "- multiplicity: " in grpo and "best (" not in grpo
    long = a.split("#### long_agent")[1]
    assert "(tie with verl_default): kvc_aware" in long
    k = (tmp_path / "docs" / "kvbench.md").read_text()
    assert "| sglang_cache_aware | launcher defaults |" in k and "| sglang_cache_aware (tuned) |" in k
    assert "no per-seed values" in k and "best (" not in k
    h = (tmp_path / "README.md").read_text()
    assert "| grpo_sat |" in h and "| long_agent |" in h
    # --check: up to date now; stale after a hand edit.
    assert _run("--arena", str(arena), "--kvbench", str(kv), "--docs", str(tmp_path), "--check").returncode == 0
    (tmp_path / "README.md").write_text(h.replace("| grpo_sat |", "| grpo_sat (hand-edited) |"))
    assert _run("--arena", str(arena), "--kvbench", str(kv), "--docs", str(tmp_path), "--check").returncode == 1


def test_arena_paired_ratios_and_noise_floor(tmp_path):
    """Seeds that differ a lot in their work give wide per-policy intervals;
    the paired ratio (same seed) still separates a policy that is 10% faster
    on every seed, and one that matches verl_default is a tie. The repeated
    run is the noise floor, never a policy in the verdicts."""
    _docs(tmp_path)
    runs = []
    for seed, work in zip((306, 307, 308, 309, 310), (40.0, 60.0, 50.0, 70.0, 45.0)):
        runs += [_arena_run("grpo_sat", "verl_default", seed, work, 0.5),
                 _arena_run("grpo_sat", "kvc_aware", seed, work * (0.9 + 0.001 * (seed % 3)), 0.8),
                 _arena_run("grpo_sat", "sglang_router_cache_aware", seed, work * (1.0 + 0.02 * (seed % 2 - 0.5)), 0.8),
                 _arena_run("grpo_sat", "verl_default#repeat", seed, work * 1.02, 0.5)]
    arena = tmp_path / "arena-details.json"
    noise = [{"workload": "grpo_sat", "seed": s, "policy": "verl_default", "first_s": w, "second_s": w * 1.02,
              "rel_diff": 0.02 / 1.01} for s, w in zip((306, 307, 308, 309, 310), (40.0, 60.0, 50.0, 70.0, 45.0))]
    arena.write_text(json.dumps({"config": {"speed": 20, "clock": "paced", "stream": False}, "runs": runs,
                                 "noise_floor": noise}))
    r = _run("--arena", str(arena), "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    a = (tmp_path / "docs" / "arena.md").read_text()
    # Per-policy intervals overlap (the seeds' work spreads 40-70 s); paired by seed they separate.
    assert "shorter than verl_default, paired by seed" in a
    shorter = [ln for ln in a.splitlines() if "shorter than verl_default" in ln][0]
    assert "kvc_aware 0.901 ± 0.001" in shorter and "sglang" not in shorter
    tie = [ln for ln in a.splitlines() if "tie with verl_default" in ln][0]
    assert "sglang_router_cache_aware 0.998 ± 0.014" in tie and "repeat" not in tie
    assert "| verl_default, second run (noise floor) |" in a
    assert "differ by 2.0% on average (at most 2.0%)" in a
    verdict_lines = [ln for ln in a.splitlines() if ln.startswith("- ") and "noise floor" not in ln]
    assert not any("repeat" in ln for ln in verdict_lines), verdict_lines


def test_arena_nohold_rows_pair_within_their_arrival_model(tmp_path):
    """A +nohold row is divided by verl_default+nohold on the same seed, not
    by verl_default (whose hold makes it 20% slower here): kvc_aware+nohold
    equal to verl_default+nohold is a tie, though it is shorter than
    verl_default; the headline gets a no-hold row whose best peer is a
    +nohold row, and the hold rows never compete with +nohold ones."""
    _docs(tmp_path)
    runs = []
    for seed, work in zip((321, 322, 323, 324), (40.0, 60.0, 50.0, 70.0)):
        runs += [_arena_run("grpo_sat", "verl_default", seed, work * 1.2, 0.5),
                 _arena_run("grpo_sat", "verl_default+nohold", seed, work, 0.5),
                 _arena_run("grpo_sat", "kvc_aware", seed, work * 1.2 * (0.9 + 0.001 * (seed % 3)), 0.8),
                 _arena_run("grpo_sat", "kvc_aware+nohold", seed, work * (1.0 + 0.001 * (seed % 3)), 0.8),
                 _arena_run("grpo_sat", "dynamo_kv_router", seed, work * 1.3, 0.4),
                 _arena_run("grpo_sat", "dynamo_kv_router+nohold", seed, work * 0.95, 0.7)]
    a = _render_arena(tmp_path, runs)
    lines = a.splitlines()
    row = [ln for ln in lines if ln.startswith("| kvc_aware+nohold |")][0]
    assert "| 1.001 ± " in row, row
    assert [ln for ln in lines if ln.startswith("| verl_default+nohold |")][0].count("(÷ verl_default") == 1
    hold_short = [ln for ln in lines if ln.startswith("- step time shorter than verl_default,")][0]
    assert "kvc_aware 0.901" in hold_short and "nohold" not in hold_short
    tie = [ln for ln in lines if "(tie with verl_default+nohold)" in ln][0]
    assert "kvc_aware+nohold 1.001" in tie
    shorter = [ln for ln in lines if ln.startswith("- step time shorter than verl_default+nohold")][0]
    assert "dynamo_kv_router+nohold 0.950" in shorter
    assert any(ln.startswith("- kvc_aware+nohold loses (") and "dynamo_kv_router+nohold" in ln for ln in lines)
    hold_rules = [ln for ln in lines if ln.startswith("- kvc_aware wins: ")][0]
    assert "nohold" not in hold_rules
    assert "slower than 10 ms" not in a  # no decision here is slow
    h = (tmp_path / "README.md").read_text()
    nohold_row = [ln for ln in h.splitlines() if ln.startswith("| grpo_sat (no burst hold) |")][0]
    assert "dynamo_kv_router+nohold" in nohold_row and "(longer)" in nohold_row
    hold_row = [ln for ln in h.splitlines() if ln.startswith("| grpo_sat |")][0]
    assert "| kvc_aware" not in hold_row and "nohold" not in hold_row and "(shorter)" in hold_row


def test_slow_routing_decisions_are_named(tmp_path):
    """A router whose decisions take 127 ms of wall time at --speed 20 holds
    each request 2.5 simulated s before any engine sees it: the arena section
    and the headline name it (its engine-clock agent step time does not
    charge the delay); a 0.4 ms router is not named."""
    _docs(tmp_path)
    runs = []
    for seed in (321, 322):
        for p, mk, ms in (("verl_default", 34.0, 0.02), ("kvc_aware", 33.0, 0.1), ("dynamo_kv_router", 24.0, 127.4)):
            r = _arena_run("agent_scale", p, seed, mk + seed % 2, 0.7)
            r["details"]["router_overhead_ms"] = ms
            r["details"]["busy_makespan_s"] = {"verl_default": 40.0, "kvc_aware": 36.0, "dynamo_kv_router": 45.0}[p]
            runs.append(r)
    a = _render_arena(tmp_path, runs)
    line = [ln for ln in a.splitlines() if "slower than 10 ms" in ln][0]
    assert "dynamo_kv_router 127.4 ms (2.5 simulated s; busiest server's compute, kvc_aware ÷ it, paired: 0.800" in line
    assert "kvc_aware 0." not in line
    h = (tmp_path / "README.md").read_text()
    assert "- agent_scale: routing decisions slower than 10 ms" in h and "dynamo_kv_router 127.4 ms" in h


def test_agent_rows_whose_clients_wait_longer_are_not_comparable(tmp_path):
    """On an agent workload a row whose clients spend at least 1.2 x
    verl_default's time outside the engines (paired by seed, interval clear of
    1) is marked not comparable, in the arena section, the headline's caveat
    and kvc_aware's loss list; a row at verl_default's pace is not, and a GRPO
    step (its span charges a late turn) never is."""
    _docs(tmp_path)
    runs = []
    for w in ("agent_scale", "grpo_sat"):
        for seed in (321, 322, 323):
            for p, mk, outside in (("verl_default", 34.0, 100.0), ("kvc_aware", 34.5, 104.0),
                                   ("dynamo_kv_router", 27.0, 190.0)):
                r = _arena_run(w, p, seed, mk + seed % 3 * 0.1, 0.7)
                r["details"]["client_over_engine_s"] = outside + seed % 3
                runs.append(r)
    a = _render_arena(tmp_path, runs)
    flagged = [ln for ln in a.splitlines() if ln.startswith("- not comparable on the engine clock")]
    assert len(flagged) == 1 and "dynamo_kv_router 1.89" in flagged[0] and "kvc_aware" not in flagged[0], flagged
    h = (tmp_path / "README.md").read_text()
    loss = [ln for ln in h.splitlines() if ln.startswith("kvc_aware's step-time losses")][0]
    agent, grpo = loss.split("agent_scale: ")[1].split("; grpo_sat: ")
    assert "dynamo_kv_router" in agent and "(not comparable: its clients' time outside the engines 1.89" in agent
    assert "dynamo_kv_router" in grpo and "not comparable" not in grpo, loss
    assert "- agent_scale: not comparable on the engine clock" in h


def test_readme_rl_block_pairs_kvc_aware_with_verl_default(tmp_path):
    """README's RL block: kvc_aware's step time over verl_default's on the
    same seed, per setting, at the defaults (docs/results/RL_DEFAULTS/),
    without group_spread (rl-f591d2b/), before task_spread (rl-520d43c/)
    and with group_spread 0.1 ungated (docs/results/rl-*.json); "(shorter)"
    only where the interval is below 1; the recurring setting reads step 2."""
    _docs(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text() + "\n<!-- BEGIN RENDERED: rl -->\nold\n<!-- END RENDERED: rl -->\n")
    res = tmp_path / "docs" / "results"
    for d in (RL_DEFAULTS, "rl-f591d2b", "rl-520d43c"):
        (res / d).mkdir(parents=True)

    def rep(verl: float, kvc: float, admit: float, second: str = "kvc_aware+admit") -> dict:
        pol = {p: {"makespan_s": v, "ttft_p99_s": 1.0} for p, v in
               (("verl_default", verl), ("kvc_aware", kvc), (second, admit))}
        return {"policies": pol, "makespan_steps_s": {p: [0.0, v["makespan_s"]] for p, v in pol.items()}}

    for seed, w in ((341, 100.0), (342, 200.0), (343, 150.0)):
        (res / RL_DEFAULTS / f"rl-r0-{seed}.json").write_text(json.dumps(rep(w, 0.9 * w, 1.1 * w)))
        (res / "rl-f591d2b" / f"rl-r0-{seed}.json").write_text(json.dumps(rep(w, 0.97 * w, w)))
        (res / "rl-520d43c" / f"rl-r0-{seed}.json").write_text(json.dumps(rep(w, 0.95 * w, w)))
        (res / f"rl-r0-{seed}.json").write_text(json.dumps(rep(w, w, w)))
        (res / RL_DEFAULTS / f"rl-rec-{seed}.json").write_text(json.dumps(rep(w, 1.2 * w, w)))
    r = _run("--arena", str(tmp_path / "none.json"), "--kvbench", "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = readme.read_text().splitlines()
    r0 = [ln for ln in lines if ln.startswith("| first epoch, ρ 0 |")][0]
    assert r0 == ("| first epoch, ρ 0 | 341–343 | 0.900 ± 0.000 (shorter) | 1.100 ± 0.000 (longer) "
                  "| 0.970 ± 0.000 (shorter) | 0.950 ± 0.000 (shorter) | 1.000 ± 0.000 |"), r0
    rec = [ln for ln in lines if ln.startswith("| recurring prompts")][0]
    assert "| 1.200 ± 0.000 (longer) | 1.000 ± 0.000 | n/a | n/a | n/a |" in rec
    assert not any(ln.startswith("| first epoch, ρ 0.5") for ln in lines)
    assert "group_spread off (f591d2b)" in readme.read_text()
    # The same seeds re-run at today's defaults lead the table (kvc_aware with admission, the library
    # default, then the routing alone, kvc_aware+noadmit); the older freeze keeps its column.
    with open(SCRIPT, encoding="utf-8") as f:
        m = re.search(r'^RL_TODAY = \("([^"]+)", "([^"]+)"\)$', f.read(), re.M)
    assert m
    today, at = m.groups()
    (res / today).mkdir()
    for seed, w in ((341, 100.0), (342, 200.0), (343, 150.0)):
        (res / today / f"rl-r0-{seed}.json").write_text(json.dumps(rep(w, 0.8 * w, 0.85 * w, "kvc_aware+noadmit")))
    r = _run("--arena", str(tmp_path / "none.json"), "--kvbench", "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    text = readme.read_text()
    r0 = [ln for ln in text.splitlines() if ln.startswith("| first epoch, ρ 0 |")][0]
    assert r0.startswith("| first epoch, ρ 0 | 341–343 | 0.800 ± 0.000 (shorter) | 0.850 ± 0.000 (shorter) "
                         "| 0.900 ± 0.000 (shorter) | 0.970 ± 0.000 (shorter) |"), r0
    assert f"library defaults, admission on ({at})" in text and f"admission off ({at})" in text
    assert f"defaults at {RL_DEFAULTS[3:]}" in text
    assert f"`docs/results/{today}/`" in text


def test_arena_tuned_rows_merge_after_their_default(tmp_path):
    _docs(tmp_path)
    runs, truns = [], []
    for seed in (306, 307, 308):
        runs += [_arena_run("grpo_sat", "verl_default", seed, 50.0 + seed % 2, 0.5),
                 _arena_run("grpo_sat", "sglang_router_cache_aware", seed, 49.0 + seed % 2, 0.8),
                 _arena_run("grpo_sat", "kvc_aware", seed, 48.0 + seed % 2, 0.8)]
        truns.append(_arena_run("grpo_sat", "sglang_router_cache_aware@tuned", seed, 40.0 + seed % 2, 0.8))
    arena, tuned = tmp_path / "arena-details.json", tmp_path / "arena-tuned-details.json"
    arena.write_text(json.dumps({"config": {"speed": 20, "clock": "paced", "stream": False}, "runs": runs}))
    grid = [{"balance_abs_threshold": 64, "balance_rel_threshold": 1.5}, {"balance_abs_threshold": 8,
                                                                           "balance_rel_threshold": 1.1}]
    tuning = {"tune_seeds": [101, 102], "objective": "obj", "grid": {"sglang_router_cache_aware": grid,
                                                                    "dynamo_kv_router": [{"overlap_score_credit": 1}]},
              "chosen": {"sglang_router_cache_aware": {"grpo_sat": grid[1]},
                         "dynamo_kv_router": {"grpo_sat": {"overlap_score_credit": 1}}}}
    tuned.write_text(json.dumps({"config": {}, "runs": truns, "tuning": tuning}))
    r = _run("--arena", str(arena), "--arena-tuned", str(tuned), "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    a = (tmp_path / "docs" / "arena.md").read_text()
    rows = [ln.split("|")[1].strip() for ln in a.splitlines() if ln.startswith("| ") and "policy" not in ln]
    i = rows.index("sglang_router_cache_aware")
    assert rows[i + 1] == "sglang_router_cache_aware (tuned: balance_abs_threshold 8, balance_rel_threshold 1.1)"
    # the tuned peer beats kvc_aware on every seed here, and kvc_aware's losses line says so
    loses = next(ln for ln in a.splitlines() if ln.startswith("- kvc_aware loses"))
    assert "step time vs sglang_router_cache_aware@tuned" in loses, loses
    assert "launcher default kept by tuning on seeds 101, 102 (its row is the tuned row): dynamo_kv_router" in a
    h = (tmp_path / "README.md").read_text()
    assert "sglang_router_cache_aware@tuned" in h  # the headline's best peer counts tuned rows


def test_render_steptime_block(tmp_path):
    _docs(tmp_path)
    (tmp_path / "docs" / "step-time.md").write_text("# s\n\n<!-- BEGIN RENDERED: steptime -->\nold\n"
                                                   "<!-- END RENDERED: steptime -->\n")

    def st(m, ci=1.0):
        return {"Mean": m, "SD": 1.0, "N": 10, "CI95": ci}

    def row(policy, mk, share=0.0, tuned=False):
        return {"policy": policy, "tuned": tuned, "hit_rate": st(0.9, 0.01), "ttft_p50_s": st(1.0),
                "ttft_p99_s": st(2.0), "makespan_s": st(mk), "makespan_over_verl": st(mk / 100, 0.01),
                "makespan_bound_share": share,
                "per_seed": [{"seed": s, "makespan_s": mk + d, "ttft_p99_s": 2.0, "hit_rate": 0.9}
                             for s, d in ((311, 0.5), (312, -0.5))]}

    rows = [row("verl_default", 100), row("sglang_cache_aware", 95), row("sglang_cache_aware", 93, tuned=True),
            row("kvc_aware", 90, 0.5), row("kvc_aware+admit", 85, 0.75)]
    kv = tmp_path / "kvbench-grpo_sat.json"
    kv.write_text(json.dumps({"workload": "grpo_sat", "report_seeds": [311, 312], "tune_seeds": [101, 102],
                              "rows": rows, "makespan_lower_bound_s": st(80.0, 0.5),
                              "best_over_lower_bound": st(1.06, 0.01)}))
    (tmp_path / "docs" / "results").mkdir()
    (tmp_path / "docs" / "results" / "oracle-lpt-311.json").write_text(json.dumps(
        {"seed": 311, "fifo_verl_default": 100.0, "policies": {"verl_default": {"makespan_s": 90.0},
                                                               "kvc_aware": {"makespan_s": 80.0}}}))
    r = _run("--arena", str(tmp_path / "none.json"), "--kvbench", str(kv), "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    t = (tmp_path / "docs" / "step-time.md").read_text()
    line = next(x for x in t.splitlines() if x.startswith("| grpo_sat |"))
    # the best peer is the tuned SGLang row; kvc_aware against it, paired by seed, is shorter
    assert "sglang_cache_aware (tuned) 93.0 ± 1.0" in line and "50% / 75%" in line, line
    assert "80.0 ± 0.5 (1.06 ± 0.01)" in line and "kvc_aware ÷ sglang_cache_aware (tuned) 0.968" in line, line
    assert "(shorter)" in line, line
    assert "| 311 | 0.900 | 0.800 | n/a |" in t


def test_committed_results_name_no_machine_path():
    """`make docs-check` must pass from any clone: no committed result names
    an absolute path (the renderer prints the frozen configuration's path)."""
    import glob

    for p in glob.glob(os.path.join(REPO, "docs", "results", "**", "*.json"), recursive=True):
        with open(p, encoding="utf-8") as f:
            text = f.read()
        assert '": "/' not in text, f"{os.path.relpath(p, REPO)} names an absolute path"


def test_docs_check_from_another_directory(tmp_path):
    """The rendered documents are what the committed JSON renders to, checked
    from a copy of the repository's docs in another directory."""
    import shutil

    clone = tmp_path / "clone"
    shutil.copytree(os.path.join(REPO, "docs"), clone / "docs")
    shutil.copy(os.path.join(REPO, "README.md"), clone / "README.md")
    shutil.copytree(os.path.join(REPO, "testbed", "scripts"), clone / "testbed" / "scripts")
    shutil.copytree(os.path.join(REPO, "testbed", "kvc_harness"), clone / "testbed" / "kvc_harness",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(clone / "testbed"))
    r = subprocess.run([sys.executable, str(clone / "testbed" / "scripts" / "render_results.py"), "--check"],
                       cwd=str(clone), env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_arena_rl_renders_from_its_own_file(tmp_path):
    """`make arena-rl`'s JSON (arena-rl-details.json beside the arena's) fills
    docs/arena.md's arena-rl block and README's headline-rl block, with its
    own workloads only; the `make arena` blocks keep theirs."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "arena.md").write_text(
        "# a\n\n<!-- BEGIN RENDERED: arena -->\nx\n<!-- END RENDERED: arena -->\n\n"
        "<!-- BEGIN RENDERED: arena-rl -->\n<!-- END RENDERED: arena-rl -->\n")
    (tmp_path / "README.md").write_text(
        "# r\n\n<!-- BEGIN RENDERED: headline -->\nx\n<!-- END RENDERED: headline -->\n\n"
        "<!-- BEGIN RENDERED: headline-rl -->\n<!-- END RENDERED: headline-rl -->\n")
    res = tmp_path / "results"
    res.mkdir()
    plain, rl = [], []
    for seed, j in zip((351, 352, 353), (0.0, 0.5, -0.5)):
        plain += [_arena_run("grpo_sat", p, seed, mk + j, 0.6)
                  for p, mk in (("verl_default", 50), ("kvc_aware", 45), ("smg_cache_aware", 47))]
        rl += [_arena_run("grpo_rho08", p, seed, mk + j, 0.6)
               for p, mk in (("verl_default", 60), ("kvc_aware", 66), ("vllm_router_sticky_least_loaded", 58))]
    cfg = {"speed": 20, "clock": "paced", "stream": False}
    (res / "arena-details.json").write_text(json.dumps({"config": cfg, "runs": plain}))
    (res / "arena-rl-details.json").write_text(json.dumps({"config": cfg, "runs": rl}))
    r = _run("--arena", str(res / "arena-details.json"), "--kvbench", "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    a = (tmp_path / "docs" / "arena.md").read_text()
    block = a.split("<!-- BEGIN RENDERED: arena-rl -->")[1]
    assert "#### grpo_rho08" in block and "#### grpo_sat" not in block
    assert "arena-rl-details.json" in block
    assert "#### grpo_sat" in a.split("<!-- BEGIN RENDERED: arena-rl -->")[0]
    h = (tmp_path / "README.md").read_text()
    head_rl = h.split("<!-- BEGIN RENDERED: headline-rl -->")[1]
    assert "make arena-rl" in head_rl and "| grpo_rho08 |" in head_rl and "| grpo_sat |" not in head_rl
    assert "no burst hold" not in head_rl  # no +nohold rows in this file: the header does not promise them
    # Losses are a rendered line, not prose, verl_default included (66 against 60 and 58 on every seed).
    assert "step-time losses" in head_rl
    assert "grpo_rho08: verl_default 1.100 ± 0.002, vllm_router_sticky_least_loaded 1.1" in head_rl
    # kvc_aware's loss to the best peer on the same seeds is stated, not hidden.
    assert "vllm_router_sticky_least_loaded" in head_rl and "(longer)" in head_rl
    assert "| grpo_rho08 |" not in h.split("<!-- BEGIN RENDERED: headline-rl -->")[0]


def test_arena_rl_tuned_rows_merge_into_the_rl_blocks(tmp_path):
    """`make arena-rl-tuned`'s rows (arena-rl-tuned-details.json beside the
    arena-rl file) join the arena-rl tables after their launcher-default
    row, named with the chosen point, and README's headline-rl counts them
    when it picks the best peer; without the file neither block has them."""
    res = _rl_tree(tmp_path)
    rl, tuned = [], []
    for seed, j in zip((351, 352, 353), (0.0, 0.5, -0.5)):
        rl += [_arena_run("grpo_rho05", p, seed, mk + j, 0.6)
               for p, mk in (("verl_default", 60), ("kvc_aware", 59), ("smg_cache_aware", 62))]
        tuned.append(_arena_run("grpo_rho05", "smg_cache_aware@tuned", seed, 55 + j, 0.6))
    cfg = {"speed": 20, "clock": "paced", "stream": False}
    (res / "arena-rl-details.json").write_text(json.dumps({"config": cfg, "runs": rl}))
    r = _run("--arena", str(res / "arena-details.json"), "--kvbench", "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "@tuned" not in (tmp_path / "README.md").read_text()
    assert "smg_cache_aware 62.0" in (tmp_path / "README.md").read_text()
    grid = [{"balance_abs_threshold": 64, "balance_rel_threshold": 1.5},
            {"balance_abs_threshold": 2, "balance_rel_threshold": 1.05}]
    tuning = {"tune_seeds": [101, 102], "objective": "mean over tuning seeds of step time / verl_default",
              "grid": {"smg_cache_aware": grid}, "chosen": {"smg_cache_aware": {"grpo_rho05": grid[1]}}}
    (res / "arena-rl-tuned-details.json").write_text(json.dumps({"config": cfg, "runs": tuned, "tuning": tuning}))
    r = _run("--arena", str(res / "arena-details.json"), "--kvbench", "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    block = (tmp_path / "docs" / "arena.md").read_text().split("<!-- BEGIN RENDERED: arena-rl -->")[1]
    assert "`make arena-rl-tuned`, same seeds" in block and "arena-rl-tuned-details.json" in block
    rows = [ln.split("|")[1].strip() for ln in block.splitlines() if ln.startswith("| ") and "policy" not in ln]
    i = rows.index("smg_cache_aware")
    assert rows[i + 1] == "smg_cache_aware (tuned: balance_abs_threshold 2, balance_rel_threshold 1.05)"
    assert "(mean over tuning seeds of step time / verl_default): smg_cache_aware" in block
    head = (tmp_path / "README.md").read_text()
    assert "smg_cache_aware@tuned 55.0" in head  # the best peer, tuned
    assert "kvc_aware ÷ the router" in head and "smg_cache_aware@tuned 1.07" in head  # a loss, stated


def test_router_queue_tuned_without_the_hold_joins_its_nohold_row(tmp_path):
    """`make arena-rl-queue-tuned`'s rows (Dynamo's router queue, tuned and
    run without the hold) join the arena-rl block beside the queue's
    +nohold row, compared with verl_default+nohold, and the tuning lines say
    it was tuned without the hold; a second tuned file with another tuning
    rule is refused (one rule for every tuned row)."""
    res = _rl_tree(tmp_path)
    rl, tuned, qtuned = [], [], []
    for seed, j in zip((351, 352, 353), (0.0, 0.5, -0.5)):
        rl += [_arena_run("grpo_rho05", p, seed, mk + j, 0.6)
               for p, mk in (("verl_default", 60), ("kvc_aware", 59), ("smg_cache_aware", 62),
                             ("verl_default+nohold", 50), ("kvc_aware+nohold", 49),
                             ("dynamo_kv_router+queue+nohold", 80), ("smg_cache_aware+nohold", 52))]
        tuned.append(_arena_run("grpo_rho05", "smg_cache_aware@tuned", seed, 55 + j, 0.6))
        qtuned.append(_arena_run("grpo_rho05", "dynamo_kv_router+queue@tuned+nohold", seed, 40 + 2 * j, 0.7))
    cfg = {"speed": 20, "clock": "paced", "stream": False}
    objective = "mean over tuning seeds of step time / verl_default"
    grid = [{"balance_abs_threshold": 64, "balance_rel_threshold": 1.5},
            {"balance_abs_threshold": 2, "balance_rel_threshold": 1.05}]
    qgrid = [{"router_queue_threshold": 1.0}, {"router_queue_threshold": 0.5}]
    (res / "arena-rl-details.json").write_text(json.dumps({"config": cfg, "runs": rl}))
    (res / "arena-rl-tuned-details.json").write_text(json.dumps({"config": cfg, "runs": tuned, "tuning": {
        "tune_seeds": [101, 102], "objective": objective, "grid": {"smg_cache_aware": grid},
        "chosen": {"smg_cache_aware": {"grpo_rho05": grid[1]}}}}))
    qtuning = {"tune_seeds": [101, 102], "objective": objective, "hold": False,
               "grid": {"dynamo_kv_router+queue": qgrid},
               "chosen": {"dynamo_kv_router+queue": {"grpo_rho05": qgrid[1]}}}
    (res / "arena-rl-queue-tuned-details.json").write_text(
        json.dumps({"config": dict(cfg, nohold_only=True), "runs": qtuned, "tuning": qtuning}))
    r = _run("--arena", str(res / "arena-details.json"), "--kvbench", "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    block = (tmp_path / "docs" / "arena.md").read_text().split("<!-- BEGIN RENDERED: arena-rl -->")[1]
    assert "arena-rl-queue-tuned-details.json" in block and "make arena-rl-queue-tuned" in block
    rows = [ln.split("|")[1].strip() for ln in block.splitlines() if ln.startswith("| ") and "policy" not in ln]
    i = rows.index("dynamo_kv_router+queue+nohold †")  # † its TTFT is not compared
    assert rows[i + 1] == "dynamo_kv_router+queue (tuned: router_queue_threshold 0.5, no burst hold) †"
    assert rows[rows.index("smg_cache_aware") + 1].startswith("smg_cache_aware (tuned:")
    assert "dynamo_kv_router+queue (tuned without the hold, against verl_default+nohold)" in block
    # Paired with verl_default+nohold (50): 40/50 = 0.8, not 40/60.
    line = next(ln for ln in block.splitlines() if ln.startswith("| dynamo_kv_router+queue (tuned"))
    assert "0.800" in line, line
    head = (tmp_path / "README.md").read_text()
    assert "dynamo_kv_router+queue@tuned+nohold 40.0" in head  # the best peer without the hold
    qtuning["objective"] = "mean over tuning seeds of (step time / verl_default + TTFT p99 / verl_default) / 2"
    (res / "arena-rl-queue-tuned-details.json").write_text(
        json.dumps({"config": cfg, "runs": qtuned, "tuning": qtuning}))
    r = _run("--arena", str(res / "arena-details.json"), "--kvbench", "--docs", str(tmp_path))
    assert r.returncode != 0 and "tuned runs differ in objective" in r.stderr


def test_router_queue_agent_steps_are_not_compared_and_nohold_losses_are_listed(tmp_path):
    """An agent step sums engine latencies, which leave out a turn's wait in
    a router's queue: the router queue's shorter agent step is listed as a
    loss marked not comparable (arena block caveat and README), while its
    GRPO loss (the fleet's span, which includes the wait) stands unmarked;
    README lists the losses without the hold as it lists the held ones."""
    res = _rl_tree(tmp_path)
    rl = _grpo_and_agent_runs((("dynamo_kv_router+queue+nohold", 40),))
    (res / "arena-rl-details.json").write_text(json.dumps({"config": {"speed": 20}, "runs": rl}))
    r = _run("--arena", str(res / "arena-details.json"), "--kvbench", "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    head = (tmp_path / "README.md").read_text()
    line = next(ln for ln in head.splitlines() if "without the hold, kvc_aware+nohold ÷ each +nohold row" in ln)
    assert "grpo_rho05: dynamo_kv_router+queue+nohold 1.225" in line  # 49/40, a GRPO loss that counts
    agent = line.split("agent_task: ")[1]
    assert agent.startswith("dynamo_kv_router+queue+nohold 1.225") and agent.endswith(
        "(not comparable: its step leaves out the wait in the router's queue).")
    assert "with the hold): grpo_rho05: none; agent_task: none." in head
    block = (tmp_path / "docs" / "arena.md").read_text()
    grpo = block.split("#### grpo_rho05")[1].split("#### agent_task")[0]
    assert "not comparable on the engine clock: dynamo_kv_router+queue+nohold (†)" in block.split("#### agent_task")[1]
    assert "not comparable on the engine clock" not in grpo


def test_admission_rows_are_ours_not_a_peer(tmp_path):
    """kvc_aware+admit is a mode of ours: README's RL headline never picks it
    as the best peer nor lists it as a loss; its own line gives its paired
    step ratios (to verl_default+nohold, kvc_aware+nohold and the best peer),
    marked not comparable on an agent workload; its TTFT is never compared."""
    res = _rl_tree(tmp_path)
    rl = _grpo_and_agent_runs((("smg_cache_aware+nohold", 48), ("kvc_aware+admit+nohold", 40)))
    for run in rl:
        if run["row"]["policy"] == "kvc_aware+admit+nohold":
            run["details"]["ttft_with_acquire_p99_s"] = 0.15  # verl_default's TTFT p99 is 0.1
    (res / "arena-rl-details.json").write_text(json.dumps({"config": {"speed": 20}, "runs": rl}))
    r = _run("--arena", str(res / "arena-details.json"), "--kvbench", "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    head = (tmp_path / "README.md").read_text()
    rows = [ln for ln in head.splitlines() if ln.startswith("| grpo_rho05 (no burst hold)")]
    assert rows and "smg_cache_aware+nohold 48.0" in rows[0]  # the best peer, not our admission mode
    line = next(ln for ln in head.splitlines() if ln.startswith("kvc_aware+admit (kvc_aware with its"))
    assert "grpo_rho05: ÷ verl_default+nohold 0.800" in line and "÷ kvc_aware+nohold 0.816" in line
    assert "÷ the best peer by mean, smg_cache_aware+nohold, 0.833" in line
    assert "TTFT p99 with the wait in admission ÷ verl_default+nohold's (its in-process acquire takes " \
        "microseconds) 1.500" in line
    assert line.split("agent_task: ")[1].endswith("(not comparable: an agent step leaves out the wait in the router).")
    loss = next(ln for ln in head.splitlines() if "without the hold, kvc_aware+nohold ÷ each +nohold row" in ln)
    assert "admit" not in loss and "smg_cache_aware+nohold 1.02" in loss
    block = (tmp_path / "docs" / "arena.md").read_text()
    assert "| kvc_aware+admit+nohold † |" in block
    assert "- kvc_aware+admit+nohold loses" in block and "TTFT p99 vs" not in block.split(
        "- kvc_aware+admit+nohold loses")[1].split("\n- multiplicity")[0]


def test_arena_shape_tables_name_their_shape(tmp_path):
    """`make kvbench-arena-shape`'s block renders from its own folder and
    names the arena's shape in every title, never kvbench-rl's grpo_sat."""
    import shutil

    d = tmp_path / "docs" / "results" / "kvbench-arena-shape"
    d.mkdir(parents=True)
    src = os.path.join(REPO, "docs", "results", "kvbench-arena-shape")
    for name in sorted(n for n in os.listdir(src) if n.startswith("rl-r5-"))[:2]:
        shutil.copy(os.path.join(src, name), d / name)
    (tmp_path / "docs" / "rl-workloads.md").write_text(
        "# r\n\n<!-- BEGIN RENDERED: rl-arena-shape -->\nold\n<!-- END RENDERED: rl-arena-shape -->\n")
    (tmp_path / "README.md").write_text("# r\n")
    r = _run("--arena", str(tmp_path / "none.json"), "--kvbench", "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "docs" / "rl-workloads.md").read_text()
    titles = [ln for ln in text.splitlines() if ln.startswith("#### ")]
    assert len(titles) == 1 and "old" not in text
    assert titles[0].startswith("#### the arena's GRPO shape (128 prompts × 8") and "grpo_sat" not in titles[0]
    assert "up to 2,048" in titles[0], titles[0]
    assert "(2 fresh seeds, `docs/results/kvbench-arena-shape/rl-r5-*.json`)" in titles[0]
    assert "| kvc_aware+admit |" in text and "| dynamo_cost+queue |" in text


def _rl_block_renderer(tmp_path, block: str):
    """A docs/rl-workloads.md under TMP_PATH holding only BLOCK's markers, and
    a function that renders it from TMP_PATH's docs/results and returns the page."""
    doc = tmp_path / "docs" / "rl-workloads.md"
    doc.write_text(f"# r\n\n<!-- BEGIN RENDERED: {block} -->\nold\n<!-- END RENDERED: {block} -->\n")
    (tmp_path / "README.md").write_text("# r\n")

    def render() -> str:
        r = _run("--arena", str(tmp_path / "none.json"), "--kvbench", "--docs", str(tmp_path))
        assert r.returncode == 0, r.stderr
        return doc.read_text()

    return render


@pytest.mark.parametrize("block,folder,base", [
    ("rl-open-corr", "kvbench-demo-shape-open-corr-9c839a2", "kvbench-demo-shape-df6a711"),
    ("rl-open-ratio", "kvbench-demo-shape-open-ratio", "kvbench-demo-shape-df6a711"),
    ("rl-open-ratio-default", "kvbench-demo-shape", "kvbench-demo-shape-df6a711-471-480"),
])
def test_opening_blocks_pair_with_the_defaults_seed_by_seed(tmp_path, block, folder, base):
    """The group spread's openings on the demo's shape (rl-open-corr,
    rl-open-ratio, and rl-open-ratio-default, the freeze that made the open
    ratio a default) pair each run with the defaults before it on the same
    seeds: every setting's row is the mean of the per-seed ratios (step 2 on
    the recurring step), the open-corr run's first epochs (nothing measured
    before placement) are exact ties, and editing one run moves its row
    alone."""
    import shutil

    from kvc_harness.stats import mean_ci

    res = tmp_path / "docs" / "results"
    for sub in (base, folder):
        shutil.copytree(os.path.join(REPO, "docs", "results", sub), res / sub)
    render = _rl_block_renderer(tmp_path, block)

    def rows() -> list:
        return [ln for ln in render().splitlines() if ln.startswith(("| first epoch", "| recurring"))]

    first = rows()
    assert len(first) == 4, first
    for row, (prefix, step) in zip(first, (("rl-r0", None), ("rl-r5", None), ("rl-r8", None), ("rl-rec", 1))):
        ratios = []
        for f in sorted((res / folder).glob(f"{prefix}-*.json")):
            now, then = (json.loads(p.read_text()) for p in (f, res / base / f.name))
            mk = [r["policies"]["kvc_aware"]["makespan_s"] if step is None else r["makespan_steps_s"]["kvc_aware"][step]
                  for r in (now, then)]
            ratios.append(mk[0] / mk[1])
        assert row.split("|")[3].strip().startswith(mean_ci(ratios).fmt(3)), (row, ratios)
    if block == "rl-open-corr":
        assert all("| 1.000 ± 0.000 (a tie) | 1.000 ± 0.000 (a tie) | 1.000, 1.000 |" in ln for ln in first[:3])
    f = sorted((res / folder).glob("rl-rec-*.json"))[0]
    rep = json.loads(f.read_text())
    rep["makespan_steps_s"]["kvc_aware"][1] *= 2
    f.write_text(json.dumps(rep))
    assert rows()[3] != first[3] and rows()[:3] == first[:3]


def test_work_block_pairs_its_rows_seed_by_seed(tmp_path):
    """`make kvbench-work`'s block: one table per setting from its own folder,
    then each paired ratio computed seed by seed from the same files (a file
    edited to make the work term lose shows as "longer")."""
    import shutil

    d = tmp_path / "docs" / "results" / "kvbench-work"
    d.mkdir(parents=True)
    for name in ("rl-rec-391.json", "rl-rec-392.json"):
        shutil.copy(os.path.join(REPO, "docs", "results", "kvbench-work", name), d / name)
    render = _rl_block_renderer(tmp_path, "rl-work")
    text = render()
    titles = [ln for ln in text.splitlines() if ln.startswith("#### ")]
    assert len(titles) == 1 and "recurring prompts" in titles[0] and "old" not in text
    assert "(2 fresh seeds, `docs/results/kvbench-work/rl-rec-*.json`)" in titles[0]
    want = []
    for name in ("rl-rec-391.json", "rl-rec-392.json"):
        with open(d / name, encoding="utf-8") as f:
            steps = json.load(f)["makespan_steps_s"]
        want.append(steps["kvc_aware+work+lengths"][1] / steps["kvc_aware+lengths"][1])
    line = next(ln for ln in text.splitlines() if ln.startswith("- kvc_aware+work+lengths ÷ kvc_aware+lengths"))
    assert f"{sum(want) / 2:.3f} ±" in line
    # Make the work term lose by 30% on both seeds: the verdict follows the files.
    for name in ("rl-rec-391.json", "rl-rec-392.json"):
        with open(d / name, encoding="utf-8") as f:
            doc_json = json.load(f)
        base = doc_json["makespan_steps_s"]["kvc_aware+lengths"][1]
        doc_json["makespan_steps_s"]["kvc_aware+work+lengths"][1] = base * (1.3 if name.endswith("391.json") else 1.31)
        with open(d / name, "w", encoding="utf-8") as f:
            json.dump(doc_json, f)
    line = next(ln for ln in render().splitlines() if ln.startswith("- kvc_aware+work+lengths ÷ kvc_aware+lengths"))
    assert "1.305 ±" in line and line.endswith(", longer")


def test_targets_block_judges_each_target_from_its_runs(tmp_path):
    """Issue 26's targets block: each verdict is computed from the committed
    runs it names. Editing one run so kvc_aware's recurring step is 0.85 x
    verl_default's on every seed turns that row's verdict to met, and only it."""
    import shutil

    res = tmp_path / "docs" / "results"
    subs = ("rl-tuned", "rl-tuned-0c3bbe8", "rl-tuned-2f74939", "rl-tuned-agt-a485bc6", RL_DEFAULTS, "rl-a485bc6",
            "rl-520d43c", "kvbench-work", HELDOUT_NOW, "heldout-668a343", "heldout-583ebbd", "heldout-373c8bc",
            "heldout-8ef0422", "heldout-2f74939", "heldout-2c63719", "kvbench-demo-shape")
    for sub in subs:
        shutil.copytree(os.path.join(REPO, "docs", "results", sub), res / sub)
    for w in ("grpo", "agent"):
        shutil.copy(os.path.join(REPO, "docs", "results", f"kvbench-{w}.json"), res / f"kvbench-{w}.json")
    render = _rl_block_renderer(tmp_path, "rl-targets")

    def rows() -> list:
        return [ln for ln in render().splitlines() if ln.startswith("| ≤ 0.90 × verl_default")]

    before = rows()
    assert len(before) == 7 and all("**missed**" in ln for ln in before), before
    assert "the demo's shape" in before[6] and "`kvbench-demo-shape/`" in before[6], before[6]
    assert "`rl-tuned-0c3bbe8/`" in before[3] and "(511–520)" in before[3], before[3]
    assert "`rl-tuned-2f74939/`" in before[4] and "(521–530)" in before[4], before[4]
    assert "`rl-a485bc6/` (`make kvbench-rl`) (341–345)" in before[5], before[5]
    path = res / "kvbench-work"
    for f in sorted(path.glob("rl-rec-*.json")):
        rep = json.loads(f.read_text())
        steps = rep["makespan_steps_s"]
        steps["kvc_aware"][1] = 0.85 * steps["verl_default"][1]
        f.write_text(json.dumps(rep))
    after = rows()
    assert after[:2] == before[:2] and after[3:] == before[3:]
    assert "`kvbench-work/`" in after[2] and "| 0.850 ± 0.000 |" in after[2]
    assert after[2].endswith("| **met** (interval below) |")
    text = render()
    assert "| TTFT p99 no worse than verl_default's | agent |" in text
    # The same-seed rows against kvc_aware before issue 26 read today's re-run of those seeds.
    before26 = [ln for ln in text.splitlines() if ln.startswith("| TTFT p99 no worse than before issue 26")
                and "first epoch" in ln]
    assert len(before26) == 3 and all("`rl-520d43c/`, `rl-a485bc6/`" in ln for ln in before26), before26
    # The agent-only run (`make kvbench-rl-tuned-agent`) judges the agent peer targets and TTFT on its seeds.
    src = "`rl-tuned-agt-a485bc6/` (`make kvbench-rl-tuned-agent`) (541–550)"
    agt_only = [ln for ln in text.splitlines() if src in ln]
    assert any(ln.startswith("| ≤ vllm_router_sticky_least_loaded | agent, task difficulty ρ 0.6 |") for ln in agt_only)
    assert any(ln.startswith("| TTFT p99 no worse than verl_default's | agent |") for ln in agt_only), agt_only
    assert not any("first epoch" in ln or "recurring" in ln for ln in agt_only), agt_only
    assert "| ≥ 60% of the way to the true-length reference |" in text
    # On the demo's shape the way is measured against that run's own true-length reference, step 2.
    from kvc_harness.stats import mean_ci

    demo = {p: [] for p in ("kvc_aware+admit+lengths", "kvc_aware+admit+truelen")}
    for f in sorted((res / "kvbench-demo-shape").glob("rl-rec-*.json")):
        ms = json.loads(f.read_text())["makespan_steps_s"]
        for p in demo:
            demo[p].append(ms[p][1] / ms["verl_default"][1])
    opt, ref = mean_ci(demo["kvc_aware+admit+lengths"]), mean_ci(demo["kvc_aware+admit+truelen"])
    line = next(ln for ln in text.splitlines() if ln.startswith("| ≥ 60% of the way") and "**opt-in**" in ln
                and "the demo's shape" in ln)
    assert f"| {opt.fmt(3)} × verl_default; best reference kvc_aware+admit+truelen {ref.fmt(3)} |" in line, line
    assert line.endswith(f"{100 * (1 - opt.mean) / (1 - ref.mean):.0f}% of the way |"), line
    # Each tuned run judges the peer targets on its own seeds.
    for sub, seeds in (("rl-tuned", "371–375"), ("rl-tuned-0c3bbe8", "511–520"), ("rl-tuned-2f74939", "521–530")):
        assert any(ln.startswith("| ≤ vllm_router_sticky_least_loaded | first epoch, ρ 0.8 |")
                   and f"`{sub}/` (`make kvbench-rl-tuned`) ({seeds})" in ln for ln in text.splitlines()), sub
    # The room each setting leaves is read from the newest tuned run's own references.
    agt = res / "rl-tuned-2f74939" / "heldout-rl-agt.json"
    rep = json.loads(agt.read_text())
    line = next(ln for ln in text.splitlines() if ln.startswith("| agent, task difficulty ρ 0.6 |"))
    gain = rep["achievable_gain_over_verl"]
    assert line.startswith(f"| agent, task difficulty ρ 0.6 | {100 * gain['Mean']:.1f} ± {100 * gain['CI95']:.1f}% |")
    rep["achievable_gain_over_verl"].update({"Mean": 0.2, "CI95": 0.01})
    rep["best_over_lower_bound"].update({"Mean": 1.5, "CI95": 0.25})
    agt.write_text(json.dumps(rep))
    text = render()
    assert "| agent, task difficulty ρ 0.6 | 20.0 ± 1.0% | 1.500 ± 0.250 |" in text.splitlines()
    assert "in the same `rl-tuned-2f74939/` (`make kvbench-rl-tuned`) runs" in text
    # The held-out workloads present on both sides (grpo, agent here) are paired with kvc_aware's rows
    # before issue 26, and verl_default's rows are checked identical seed for seed.
    held = [ln for ln in text.splitlines() if ln.startswith("| `grpo` |") or ln.startswith("| `agent` |")]
    assert len(held) == 2 and all("| yes |" in ln for ln in held), held
    assert "held-out `grpo_sat`" not in text  # its published file was not copied: no row
    now = json.loads((res / HELDOUT_NOW / "kvbench-grpo.json").read_text())
    then = json.loads((res / "kvbench-grpo.json").read_text())
    kvc_now = {x["seed"]: x for r in now["rows"] if r["policy"] == "kvc_aware" for x in r["per_seed"]}
    kvc_then = {x["seed"]: x for r in then["rows"] if r["policy"] == "kvc_aware" for x in r["per_seed"]}
    assert kvc_now and kvc_now.keys() == kvc_then.keys()
    ratios = [kvc_now[k]["ttft_p99_s"] / kvc_then[k]["ttft_p99_s"] for k in kvc_now]
    line = next(ln for ln in text.splitlines() if "held-out `grpo`" in ln and ln.startswith("| TTFT p99"))
    assert f"| {sum(ratios) / len(ratios):.3f} ±" in line
    # The last columns pair today's rows with the 668a343 freeze's (before the within-prompt gate), the
    # 583ebbd freeze's (before the within-task gate), the 373c8bc freeze's (before the mean prompt), the
    # 8ef0422 freeze's (before admission's default), the 2f74939 freeze's (before its multi-turn gate) and
    # the 2c63719 freeze's (before session_move_tokens).
    cells = held[0].split(" | ")
    for d, at in (("heldout-668a343", -12), ("heldout-583ebbd", -10), ("heldout-373c8bc", -8),
                  ("heldout-8ef0422", -6), ("heldout-2f74939", -4), ("heldout-2c63719", -2)):
        earlier = json.loads((res / d / "kvbench-grpo.json").read_text())
        kvc_e = {x["seed"]: x for r in earlier["rows"] if r["policy"] == "kvc_aware" for x in r["per_seed"]}
        step = [kvc_now[k]["makespan_s"] / kvc_e[k]["makespan_s"] for k in kvc_now]
        assert cells[at].startswith(f"{sum(step) / len(step):.3f} ±"), (d, held[0])
    shutil.rmtree(res / "heldout-668a343")
    held = [ln for ln in render().splitlines() if ln.startswith("| `grpo` |")]
    assert "| yes | – | – | " in held[0] and not held[0].endswith("| – | – |"), held
    # A changed verl_default row on one side is caught.
    for r in now["rows"]:
        if r["policy"] == "verl_default":
            r["per_seed"][0]["makespan_s"] += 1.0
    (res / HELDOUT_NOW / "kvbench-grpo.json").write_text(json.dumps(now))
    held = [ln for ln in render().splitlines() if ln.startswith("| `grpo` |")]
    assert held and "| **no** |" in held[0], held
    # Without the newest tuned run its rows go and the room table reads the one before.
    shutil.rmtree(res / "rl-tuned-2f74939")
    text = render()
    assert "rl-tuned-2f74939/` (" not in text
    assert "in the same `rl-tuned-0c3bbe8/` (`make kvbench-rl-tuned`) runs" in text


def test_charge_demo_table_renders_from_the_demo_json(tmp_path):
    """The reverted candidate's demo table is rendered from the committed demo
    JSON: each row's ratio is kvc_aware's step ÷ default's in that file; a
    changed file changes the table, and a missing one leaves the block alone."""
    import shutil

    res = tmp_path / "docs" / "results"
    shutil.copytree(os.path.join(REPO, "docs", "results", "charge-candidate-demo"), res / "charge-candidate-demo")
    for name in ("demo.json", "demo-grpo_rho05.json", "demo-grpo_sat.json"):
        shutil.copy(os.path.join(REPO, "docs", "results", name), res / name)
    doc = tmp_path / "docs" / "rl-workloads.md"
    doc.write_text("# r\n\n<!-- BEGIN RENDERED: charge-demo -->\nold\n<!-- END RENDERED: charge-demo -->\n")
    # demo.json present: README's demo block is rendered from it too.
    (tmp_path / "README.md").write_text("# r\n\n<!-- BEGIN RENDERED: demo -->\n<!-- END RENDERED: demo -->\n")
    path = res / "charge-candidate-demo" / "shipped" / "demo-seed2.json"
    d = json.loads(path.read_text())
    by = {x["policy"]: x for x in d["sat"]["summaries"]}
    by["kvc_aware"]["step_time_s"] = by["default"]["step_time_s"] * 0.5
    path.write_text(json.dumps(d))
    r = _run("--arena", str(tmp_path / "none.json"), "--kvbench", "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in doc.read_text().splitlines() if ln.startswith("| `make demo")]
    assert len(rows) == 6 and "old" not in doc.read_text()
    assert rows[2].startswith("| `make demo --no-rollout` (grpo_rho05) | 2 | 0.500 | ")
    (res / "demo-grpo_rho05.json").unlink()
    doc.write_text("# r\n\n<!-- BEGIN RENDERED: charge-demo -->\nold\n<!-- END RENDERED: charge-demo -->\n")
    r = _run("--arena", str(tmp_path / "none.json"), "--kvbench", "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "old" in doc.read_text()


def test_rl_workloads_tables_render_from_the_results(tmp_path):
    """docs/rl-workloads.md's kvbench-rl tables are blocks rendered from the
    committed JSON: stale blocks are rewritten from docs/results/RL_DEFAULTS/
    (the defaults) and rl-f591d2b/ (group_spread off)."""
    import shutil

    for d in (RL_DEFAULTS, "rl-f591d2b"):
        (tmp_path / "docs" / "results" / d).mkdir(parents=True)
        shutil.copy(os.path.join(REPO, "docs", "results", d, "rl-agt-341.json"),
                    tmp_path / "docs" / "results" / d / "rl-agt-341.json")
    src = os.path.join(REPO, "docs", "results", RL_DEFAULTS, "rl-agt-341.json")
    (tmp_path / "docs" / "rl-workloads.md").write_text(
        "# r\n\n<!-- BEGIN RENDERED: rl-defaults -->\nold\n<!-- END RENDERED: rl-defaults -->\n"
        "\n<!-- BEGIN RENDERED: rl-gs-off -->\nold\n<!-- END RENDERED: rl-gs-off -->\n")
    (tmp_path / "README.md").write_text("# r\n")
    r = _run("--arena", str(tmp_path / "none.json"), "--kvbench", "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "docs" / "rl-workloads.md").read_text()
    assert "old" not in text and f"`docs/results/{RL_DEFAULTS}/rl-agt-*.json`" in text
    assert "`docs/results/rl-f591d2b/rl-agt-*.json`" in text
    with open(src, encoding="utf-8") as f:
        rep = json.load(f)
    mk = rep["policies"]["kvc_aware"]["makespan_s"] / rep["policies"]["verl_default"]["makespan_s"]
    assert f"| kvc_aware | {rep['policies']['kvc_aware']['makespan_s']:.1f} |" in text and f"{mk:.3f}" in text


def test_turn_gap_drop_is_computed_from_the_runs():
    """The turn-gap experiment's summary line (docs/arena.md) is the range of
    1 − step(with +10/+20 s) ÷ step(no wait), same policy and seed, computed
    here again from the committed runs."""
    path = os.pathsep.join([os.path.join(REPO, "testbed"), os.path.join(REPO, "testbed", "scripts")])
    env = dict(os.environ, PYTHONPATH=path)
    code = ("import json, render_results as r; "
            "print(json.dumps(r.render_turn_gap(r.os.path.join(r.REPO, 'docs', 'results', 'agent-turn-gap'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    text = json.loads(out.stdout)
    folder = os.path.join(REPO, "docs", "results", "agent-turn-gap")
    step = {}
    for stem in ("gap-0", "gap-10", "gap-20"):
        with open(os.path.join(folder, stem + ".json"), encoding="utf-8") as f:
            for run in json.load(f)["runs"]:
                step[(stem, run["row"]["policy"], run["row"]["seed"])] = run["details"]["engine_makespan_s"]
    cuts = [1 - v / step[("gap-0", p, s)] for (stem, p, s), v in step.items() if stem != "gap-0"]
    assert len(cuts) == 8
    assert f"was {100 * min(cuts):.0f}–{100 * max(cuts):.0f}% shorter" in text


def test_demo_on_other_seeds_renders_paired_ratios(tmp_path):
    """docs/demo.md's demo-seeds block: one row per seed's `make demo` JSON
    (each policy's step time over default's in the same run) and the mean ±
    95% CI of those ratios, "shorter" only where the interval is below 1."""
    (tmp_path / "docs" / "results" / "demo-seeds").mkdir(parents=True)
    (tmp_path / "docs" / "demo.md").write_text("# d\n\n<!-- BEGIN RENDERED: demo-seeds -->\nold\n"
                                               "<!-- END RENDERED: demo-seeds -->\n")
    (tmp_path / "README.md").write_text("# r\n")

    def summary(policy: str, step: float, hit: float) -> dict:
        return {"policy": policy, "step_time_s": step, "hit_rate": hit}

    for seed, (k, a) in zip((1, 2, 3), ((0.90, 1.02), (0.92, 0.97), (0.91, 1.04))):
        doc = {"commit": "abc1234", "seed": seed, "sat": {"summaries": [
            summary("default", 100.0 + seed, 0.74), summary("kvc_aware", k * (100.0 + seed), 0.86),
            summary("kvc_aware+admit", a * (100.0 + seed), 0.84)]}}
        (tmp_path / "docs" / "results" / "demo-seeds" / f"demo-seed{seed}.json").write_text(json.dumps(doc))
    # the README's demo block is rendered only from docs/results/demo.json: none here
    r = _run("--arena", str(tmp_path / "none.json"), "--kvbench", "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "docs" / "demo.md").read_text()
    assert "old" not in text and "seeds 1, 2, 3" in text
    assert "| 2 | 102.0 | 0.920 | 0.970 | 74.0% / 86.0% / 84.0% |" in text
    assert "| mean ± 95% CI | | 0.910 ± 0.025 (shorter) | 1.010 ± 0.090 (tie) | |" in text
    assert "| seeds shorter than default | | 3 of 3 | 1 of 3 | |" in text


def test_demo_doc_renders_earlier_headlines_and_the_shape_runs(tmp_path):
    """docs/demo.md's blocks besides the headline come from their own
    committed JSON, with no demo.json: the earlier headline's run and seeds
    (grpo_rho05), and kvbench's model of the demo's step, whose recurring
    table reads step 2 (a changed step-1 figure changes nothing, a changed
    step-2 figure changes the ratio)."""
    import shutil

    res = tmp_path / "docs" / "results"
    res.mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "docs", "results", "demo-grpo_rho05.json"), res / "demo-grpo_rho05.json")
    for sub in ("demo-seeds-grpo_rho05", "kvbench-demo-shape"):
        shutil.copytree(os.path.join(REPO, "docs", "results", sub), res / sub)
    blocks = ("demo-grpo-rho05", "demo-seeds-grpo-rho05", "demo-shape")
    page = "# d\n\n" + "".join(f"<!-- BEGIN RENDERED: {b} -->\nSTALE\n<!-- END RENDERED: {b} -->\n\n" for b in blocks)
    (tmp_path / "docs" / "demo.md").write_text(page)
    (tmp_path / "README.md").write_text("# r\n")
    rec = sorted((res / "kvbench-demo-shape").glob("rl-rec-*.json"))[0]
    d = json.loads(rec.read_text())
    steps = d["makespan_steps_s"]
    steps["kvc_aware"][0] *= 3  # step 1: not what the table reads
    steps["kvc_aware"][1] = steps["verl_default"][1] * 0.5  # step 2
    rec.write_text(json.dumps(d))
    r = _run("--arena", str(tmp_path / "none.json"), "--kvbench", "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "docs" / "demo.md").read_text()
    assert "STALE" not in text, text[:2000]
    assert "rendered from `docs/results/demo-grpo_rho05.json`" in text and "grpo_rho05 workload" in text
    assert "rendered from `docs/results/demo-seeds-grpo_rho05/`" in text
    assert "the demo's GRPO shape (128 prompts × 8, 4 engines × 64 slots" in text
    assert "`docs/results/kvbench-demo-shape/rl-rec-*.json`" in text
    from kvc_harness.stats import mean_ci

    ratios = []
    for path in sorted((res / "kvbench-demo-shape").glob("rl-rec-*.json")):
        ms = json.loads(path.read_text())["makespan_steps_s"]
        ratios.append(ms["kvc_aware"][1] / ms["verl_default"][1])
    row = next(ln for ln in text.split("recurring prompts")[1].splitlines() if ln.startswith("| kvc_aware |"))
    assert row.split("|")[3].strip() == mean_ci(ratios).fmt(3), row


def test_router_queue_rows_ttft_is_marked_and_never_compared(tmp_path):
    """A router queue's rows (Dynamo's +queue) have a TTFT that leaves out the
    wait in the router's queue: their row and the headline cell are marked †,
    the note says why, and no TTFT win or loss is counted against them (their
    step time still is)."""
    runs = []
    for seed, j in zip((351, 352, 353), (0.0, 0.5, -0.5)):
        for p, mk, ttft in (("verl_default", 60, 80.0), ("kvc_aware", 59, 81.0), ("dynamo_kv_router+queue", 70, 5.0)):
            r = _arena_run("grpo_rho0", p, seed, mk + j, 0.6)
            r["row"]["ttft_p99_s"] = ttft + j
            runs.append(r)
    _docs(tmp_path)
    text = _render_arena(tmp_path, runs)
    assert "| dynamo_kv_router+queue † |" in text
    assert "leave out the wait in that queue" in text
    assert "TTFT p99 vs dynamo_kv_router+queue" not in text
    assert "step time vs dynamo_kv_router+queue" in text  # its step time is still compared (kvc_aware wins it)


def test_cap_block_pairs_cap_and_no_cap_by_seed(tmp_path):
    """`make kvbench-cap`'s block: per correlation, kvc_aware at the defaults
    and the cap-4 run each over verl_default on the same seed, and cap ÷
    defaults, computed from the files; a correlation without both files has no row."""
    res = tmp_path / "docs" / "results" / "kvbench-cap"
    res.mkdir(parents=True)

    def pol(mk: float, ttft: float, hit: float) -> dict:
        return {"makespan_s": mk, "ttft_p99_s": ttft, "hit_rate": hit}

    for seed, verl in ((401, 100.0), (402, 200.0)):
        base = {"verl_default": pol(verl, 9.0, 0.5), "kvc_aware": pol(1.2 * verl, 4.0, 0.6)}
        (res / f"defaults-r5-{seed}.json").write_text(json.dumps({"policies": base}))
        (res / f"cap4-r5-{seed}.json").write_text(json.dumps({"policies": {"kvc_aware": pol(0.9 * verl, 2.0, 0.8)}}))
    (res / "defaults-r8-401.json").write_text(json.dumps({"policies": base}))  # no cap-4 run: no row
    render = _rl_block_renderer(tmp_path, "rl-cap")
    rows = [ln for ln in render().splitlines() if ln.startswith("| 0")]
    assert rows == ["| 0.5 | 401–402 | 1.200 ± 0.000 (longer) | 0.900 ± 0.000 (shorter) | 0.750 ± 0.000 (shorter) "
                    "| 0.500 ± 0.000 | 60.0 ± 0.0% → 80.0 ± 0.0% |"], rows


@pytest.mark.parametrize("block,folder,base,what", [
    ("rl-heldout-admit", "heldout-admit", "heldout-admit-234dd89", "the gate"),
    ("rl-heldout-admit-split", "heldout-admit-0c3bbe8", "heldout-admit-f0be7ad", "the split"),
])
def test_heldout_admit_block_pairs_now_and_before_the_gate(tmp_path, block, folder, base, what):
    """`make kvbench-heldout-admit`'s blocks (lengths.min_corr's gate, and
    admission's split in two): the opt-in order over verl_default and
    admission alone, the same row before the change (its own folder) and the
    change's effect, each paired seed by seed; a workload without the run
    from before has no row."""
    res = tmp_path / "docs" / "results"
    now, before = res / folder, res / base
    now.mkdir(parents=True)
    before.mkdir()

    def doc(rows: dict) -> str:
        return json.dumps({"rows": [
            {"policy": p, "tuned": False, "per_seed": [
                {"seed": sd, "makespan_s": mk * verl, "ttft_p99_s": 3.0 * mk * mk, "hit_rate": 0.8}
                for sd, verl in ((311, 100.0), (312, 200.0))]}
            for p, mk in rows.items()]})

    now_rows = {"verl_default": 1.0, "kvc_aware+admit": 0.9, "kvc_aware+admit+lengths": 0.9}
    (now / "kvbench-grpo_sat.json").write_text(doc(now_rows))
    (now / "kvbench-grpo.json").write_text(doc(now_rows))  # nothing from before: no row
    (before / "kvbench-grpo_sat.json").write_text(doc({"verl_default": 1.0, "kvc_aware+admit": 0.9,
                                                        "kvc_aware+admit+lengths": 1.2}))
    render = _rl_block_renderer(tmp_path, block)
    page = render()
    assert f"`docs/results/{folder}/`" in page and f"`docs/results/{base}/`" in page
    assert f"| before {what} ÷ verl_default | {what}'s effect (now ÷ before) |" in page
    rows = [ln for ln in page.splitlines() if ln.startswith("| `")]
    assert rows == ["| `grpo_sat` | 311–312 | 0.900 ± 0.000 (shorter) | 0.900 ± 0.000 (shorter) "
                    "| 1.000 ± 0.000 (a tie) | 1.200 ± 0.000 (longer) | 0.750 ± 0.000 (shorter) "
                    "| 0.810 ± 0.000 (lower) | 80.0 ± 0.0% / 80.0 ± 0.0% |"], rows


def test_admit_lengths_block_renders_longest_first_picks(tmp_path):
    """The arena's opt-in order block: each ratio paired by seed, and the
    longest-first picks are the mean of the row's recorded picks (0 where the
    gate never opened), not typed."""
    runs = []
    for seed, picks in ((351, 400), (352, 500)):
        for p, mk in (("verl_default", 100.0), ("verl_default#repeat", 101.0), ("kvc_aware", 100.0),
                      ("kvc_aware+admit", 95.0), ("kvc_aware+admit+lengths", 90.0)):
            r = _arena_run("grpo_rho05", p, seed, mk, 0.5)
            r["details"]["ttft_with_acquire_p99_s"] = 0.2 if "admit" in p else 0.1
            if "admit" in p:
                r["details"]["longest_first_picks"] = picks if p.endswith("lengths") else 0
            runs.append(r)
    res = tmp_path / "docs" / "results"
    res.mkdir(parents=True)
    (res / "arena-admit-lengths-details.json").write_text(json.dumps({"runs": runs}))
    render = _rl_block_renderer(tmp_path, "rl-admit-lengths")
    rows = [ln for ln in render().splitlines() if ln.startswith("| `")]
    assert rows == ["| `grpo_rho05` | 351–352 | 0.900 ± 0.000 (shorter) | 0.900 ± 0.000 (shorter) "
                    "| 0.947 ± 0.000 (shorter) | 2.000 ± 0.000 (higher) | 0.50 / 0.50 | 450 "
                    "| 1.010 ± 0.000 |"], rows


def test_admit_clock_block_reads_both_holds_of_the_same_runs(tmp_path):
    """docs/arena.md's block on admission's clock: per workload and order,
    TTFT p99 with the hold on the engines' clocks and as wall time x speed,
    each over verl_default's (whose acquire is its TTFT's), paired by seed,
    and the holds' p99s over each other; a run without the wall figures
    leaves the block as it was."""
    runs = []
    for seed in (351, 352):
        for p in ("verl_default", "kvc_aware+admit", "kvc_aware+admit+lengths"):
            r = _arena_run("grpo_rho08", p, seed, 100.0, 0.5)
            r["details"]["ttft_with_acquire_p99_s"] = 0.1 * seed / 351 if p == "verl_default" else 0.08 * seed / 351
            if p != "verl_default":
                r["details"]["ttft_with_acquire_wall_p99_s"] = 0.15
                r["details"]["admission_wait_s"] = {"p99": 0.05, "wall_p99": 0.1 if p.endswith("admit") else 0.125}
            runs.append(r)
    res = tmp_path / "docs" / "results"
    res.mkdir(parents=True)
    path = res / "arena-admit-lengths-details.json"
    path.write_text(json.dumps({"runs": runs}))
    arena = tmp_path / "docs" / "arena.md"
    page = "# a\n\n<!-- BEGIN RENDERED: arena-admit-clock -->\nold\n<!-- END RENDERED: arena-admit-clock -->\n"
    arena.write_text(page)
    render = _rl_block_renderer(tmp_path, "none")
    render()
    rows = [ln for ln in arena.read_text().splitlines() if ln.startswith("| `")]
    # Wall: 0.15 over verl_default's 0.1 x seed / 351 on each seed.
    wall = [0.15 / (0.1 * sd / 351) for sd in (351, 352)]
    wm = sum(wall) / 2
    wci = 12.706 * abs(wall[0] - wall[1]) / 2
    assert rows == [f"| `grpo_rho08` | kvc_aware+admit | 0.800 ± 0.000 (lower) | {wm:.3f} ± {wci:.3f} (higher) "
                    "| 2.00 ± 0.00 |",
                    f"| `grpo_rho08` | kvc_aware+admit+lengths | 0.800 ± 0.000 (lower) | {wm:.3f} ± {wci:.3f} (higher) "
                    "| 2.50 ± 0.00 |"], rows
    for r in runs:
        r["details"].pop("ttft_with_acquire_wall_p99_s", None)
        r["details"].get("admission_wait_s", {}).pop("wall_p99", None)
    path.write_text(json.dumps({"runs": runs}))
    arena.write_text(page)
    render()
    assert "\nold\n" in arena.read_text()


@pytest.mark.parametrize("block,folder,base", [
    ("rl-admit-spread", "admit-spread", "admit-spread-edcef9e"),
    ("rl-admit-split", "admit-split", "admit-split-f0be7ad"),
])
def test_admit_spread_block_pairs_now_and_before(tmp_path, block, folder, base):
    """`make kvbench-admit-spread`'s blocks (the spread once measured, and
    the split in two before): per RL setting, the defaults, admission alone
    and with lengths over verl_default now and before the change (its own
    folder), and the change's effect, each paired seed by seed; the
    recurring setting reads its second step; a setting without the run from
    before has no row."""
    res = tmp_path / "docs" / "results"
    now, before = res / folder, res / base
    now.mkdir(parents=True)
    before.mkdir()

    def doc(rows: dict, verl: float) -> str:
        return json.dumps({
            "policies": {p: {"makespan_s": mk * verl, "ttft_p99_s": 2.0 * mk} for p, mk in rows.items()},
            "makespan_steps_s": {p: [5.0 * mk * verl, mk * verl] for p, mk in rows.items()}})

    for seed, verl in ((421, 100.0), (422, 200.0)):
        rows = {"verl_default": 1.0, "kvc_aware": 1.0, "kvc_aware+admit": 0.9, "kvc_aware+admit+lengths": 0.8}
        (now / f"rl-r8-{seed}.json").write_text(doc(rows, verl))
        (now / f"rl-r5-{seed}.json").write_text(doc(rows, verl))  # nothing from before: no row
        (before / f"rl-r8-{seed}.json").write_text(doc({**rows, "kvc_aware+admit": 1.2}, verl))
        # The recurring run's first step is 5 x longer; its second decides.
        (now / f"rl-rec-{seed}.json").write_text(doc(rows, verl))
        (before / f"rl-rec-{seed}.json").write_text(doc(rows, verl))
    render = _rl_block_renderer(tmp_path, block)
    page = render()
    assert f"`docs/results/{folder}/`" in page and f"`docs/results/{base}/`" in page
    rows = [ln for ln in page.splitlines() if ln.startswith("| first") or ln.startswith("| recurring")]
    assert rows == [
        "| first epoch, ρ 0.8 | 421–422 | 1.000 ± 0.000 (a tie) | 0.900 ± 0.000 (shorter) | 1.200 ± 0.000 (longer) "
        "| 0.750 ± 0.000 (shorter) | 0.800 ± 0.000 (shorter) | 0.800 ± 0.000 (shorter) | 1.000 ± 0.000 (a tie) "
        "| 0.900 ± 0.000 (lower) |",
        "| recurring prompts, epoch 2 (ρ 0.6, epoch correlation 0.8) | 421–422 | 1.000 ± 0.000 (a tie) "
        "| 0.900 ± 0.000 (shorter) | 0.900 ± 0.000 (shorter) | 1.000 ± 0.000 (a tie) | 0.800 ± 0.000 (shorter) "
        "| 0.800 ± 0.000 (shorter) | 1.000 ± 0.000 (a tie) | 0.900 ± 0.000 (lower) |"], rows


def test_mean_prompt_block_pairs_now_and_before(tmp_path):
    """`make kvbench-mean-prompt`'s block: per setting, kvc_aware over
    verl_default now and before the change (its own folder), the change's
    effect on step time and TTFT p99, the hit rates and the worst seed, each
    from the same files; the held-out grpo shape also lists kvc_aware over
    each peer; a setting without the run from before has no row."""
    res = tmp_path / "docs" / "results"
    now, before = res / _const("MEAN_PROMPT"), res / "mean-prompt-662c078"
    now.mkdir(parents=True)
    before.mkdir()

    def doc(rows: dict, verl: float, hit: float) -> str:
        return json.dumps({
            "policies": {p: {"makespan_s": mk * verl, "ttft_p99_s": 2.0 * mk, "hit_rate": hit}
                         for p, mk in rows.items()},
            "makespan_steps_s": {p: [5.0 * mk * verl, mk * verl] for p, mk in rows.items()}})

    for seed, verl, worst in ((431, 100.0, 1.5), (432, 200.0, 1.1)):
        rows = {"verl_default": 1.0, "kvc_aware": 1.0, "sglang_cache_aware": 1.25}
        (now / f"grpo-r8-{seed}.json").write_text(doc(rows, verl, 0.6))
        (before / f"grpo-r8-{seed}.json").write_text(doc({**rows, "kvc_aware": worst}, verl, 0.75))
        (now / f"rl-r5-{seed}.json").write_text(doc(rows, verl, 0.6))  # nothing from before: no row
    render = _rl_block_renderer(tmp_path, "rl-mean-prompt")
    page = render()
    rows = [ln for ln in page.splitlines() if ln.startswith("| held-out") or ln.startswith("| first")]
    assert rows == [
        "| held-out `grpo` shape, ρ 0.8 | 431–432 | 1.000 ± 0.000 (a tie) | 1.300 ± 2.541 (a tie) "
        "| 0.788 ± 1.540 (a tie) | 0.788 ± 1.540 (a tie) | 75.0% → 60.0% | 1.500 → 1.000 |"], rows
    assert ("- held-out `grpo` shape, ρ 0.8: sglang_cache_aware ÷ verl_default 1.250 ± 0.000 (longer), "
            "kvc_aware ÷ sglang_cache_aware 0.800 ± 0.000 (shorter)") in page, page


def test_archived_freezes_name_every_parameter():
    """kvbench's and the arena's --kvc-frozen refuse a freeze that leaves a
    strategy parameter out (a rerun would run today's default for it, as
    group_spread_open_ratio, 1 since f0be7ad, once did), so every freeze kept
    under docs/results/ names every parameter today's freeze does, the ones
    added after it at their off value and listed."""
    import glob

    with open(os.path.join(REPO, "docs", "frozen-kvc-aware.json"), encoding="utf-8") as f:
        today = set(json.load(f)["strategy"])
    files = glob.glob(os.path.join(REPO, "docs", "results", "**", "frozen-kvc-aware*.json"), recursive=True)
    assert len(files) >= 10, files
    for path in files:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        missing = today - set(doc["strategy"])
        assert not missing, f"{path} does not name {sorted(missing)}"
        later = doc.get("added_later", {}).get("keys", [])
        assert all(doc["strategy"][k] == 0 for k in later), (path, later)


def test_arena_refreeze_block_pairs_the_rerun_with_the_rows_it_replaced(tmp_path):
    """docs/arena.md's arena-rl-refreeze block pairs kvc_aware's re-run
    arena-rl rows with the rows they replaced, seed by seed: each step cell
    is the mean of the per-seed ratios of the two committed files, and
    doubling one replaced row's step moves only its own workload's cell."""
    import shutil

    from kvc_harness.stats import mean_ci

    res = tmp_path / "docs" / "results"
    res.mkdir(parents=True)
    for name in ("arena-rl-details.json", "arena-rl-kvc-f591d2b-details.json"):
        shutil.copy(os.path.join(REPO, "docs", "results", name), res / name)
    def blocks(*names: str) -> str:
        return "".join(f"<!-- BEGIN RENDERED: {b} -->\nold\n<!-- END RENDERED: {b} -->\n" for b in names)

    (tmp_path / "docs" / "arena.md").write_text("# a\n\n" + blocks("arena-rl", "arena-rl-refreeze"))
    (tmp_path / "README.md").write_text("# r\n\n" + blocks("headline-rl"))

    def rows() -> dict:
        r = _run("--arena", str(res / "arena-details.json"), "--kvbench", "--docs", str(tmp_path))
        assert r.returncode == 0, r.stderr
        text = (tmp_path / "docs" / "arena.md").read_text()
        block = text[text.index("BEGIN RENDERED: arena-rl-refreeze"):]
        return {ln.split("|")[1].strip(): ln for ln in block.splitlines() if ln.startswith(("| grpo", "| agent"))}

    first = rows()
    assert set(first) == {"grpo_rho0", "grpo_rho05", "grpo_rho08", "grpo_recur", "agent_task"}, first
    now, before = (json.loads((res / n).read_text())["runs"]
                   for n in ("arena-rl-details.json", "arena-rl-kvc-f591d2b-details.json"))

    def step(runs: list, w: str, p: str) -> dict:
        return {r["row"]["seed"]: r["details"]["engine_makespan_s"] for r in runs
                if r["row"]["workload"] == w and r["row"]["policy"] == p}

    a, b = step(now, "grpo_rho05", "kvc_aware+nohold"), step(before, "grpo_rho05", "kvc_aware+nohold")
    want = mean_ci([a[s] / b[s] for s in sorted(a)]).fmt(3)
    assert first["grpo_rho05"].split("|")[4].strip().startswith(want), (first["grpo_rho05"], want)
    doc = json.loads((res / "arena-rl-kvc-f591d2b-details.json").read_text())
    for r in doc["runs"]:
        if r["row"]["workload"] == "grpo_rho08" and r["row"]["policy"] == "kvc_aware":
            r["details"]["engine_makespan_s"] *= 2
    (res / "arena-rl-kvc-f591d2b-details.json").write_text(json.dumps(doc))
    second = rows()
    assert second["grpo_rho08"] != first["grpo_rho08"]
    assert {w: ln for w, ln in second.items() if w != "grpo_rho08"} == \
        {w: ln for w, ln in first.items() if w != "grpo_rho08"}


def _arena_docs(tmp_path, files, blocks, readme_block):
    """A docs tree under TMP_PATH: the committed FILES copied into
    docs/results/, docs/arena.md holding BLOCKS and README.md README_BLOCK
    (placeholders). Returns the results folder and a function that renders
    the tree and returns the text of the last of BLOCKS."""
    import shutil

    res = tmp_path / "docs" / "results"
    res.mkdir(parents=True)
    for name in files:
        shutil.copy(os.path.join(REPO, "docs", "results", name), res / name)

    def placeholders(*names: str) -> str:
        return "".join(f"<!-- BEGIN RENDERED: {b} -->\nold\n<!-- END RENDERED: {b} -->\n" for b in names)

    (tmp_path / "docs" / "arena.md").write_text("# a\n\n" + placeholders(*blocks))
    (tmp_path / "README.md").write_text("# r\n\n" + placeholders(readme_block))

    def render() -> str:
        r = _run("--arena", str(res / "arena-details.json"), "--kvbench", "--docs", str(tmp_path))
        assert r.returncode == 0, r.stderr
        text = (tmp_path / "docs" / "arena.md").read_text()
        return text[text.index(f"BEGIN RENDERED: {blocks[-1]}"):text.index(f"END RENDERED: {blocks[-1]}")]

    return res, render


def test_arena_more_seeds_block_reads_both_seed_sets(tmp_path):
    """docs/arena.md's arena-rl-more-seeds block reads each ρ 0.8 pair on the
    published seeds, on the extension's and on the union: the ten-seed cell
    is the mean of the ten per-seed ratios of the two committed files, and
    doubling kvc_aware's steps in the extension moves its own row's
    extension and ten-seed cells only."""
    from kvc_harness.stats import mean_ci

    res, render = _arena_docs(tmp_path, ("arena-rl-details.json", "arena-rl-rho08-356-360-details.json"),
                              ("arena-rl", "arena-rl-more-seeds"), "headline-rl")

    def rows() -> dict:
        block = render()
        assert "(351–355)" in block and "(356–360," in block, block
        return {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:6]]
                for ln in block.splitlines() if ln.startswith("| kvc_aware")}

    first = rows()
    assert len(first) == 4, first

    def step(path, p: str) -> dict:
        return {r["row"]["seed"]: r["details"]["engine_makespan_s"] for r in json.loads(path.read_text())["runs"]
                if r["row"]["workload"] == "grpo_rho08" and r["row"]["policy"] == p}

    a, b = {}, {}
    for n in ("arena-rl-details.json", "arena-rl-rho08-356-360-details.json"):
        a.update(step(res / n, "kvc_aware+nohold"))
        b.update(step(res / n, "verl_default+nohold"))
    assert sorted(a) == list(range(351, 361)), sorted(a)
    want = mean_ci([a[s] / b[s] for s in sorted(a)]).fmt(3)
    assert first["kvc_aware+nohold ÷ verl_default+nohold"][2].startswith(want), first

    doc = json.loads((res / "arena-rl-rho08-356-360-details.json").read_text())
    for r in doc["runs"]:
        if r["row"]["policy"] == "kvc_aware":
            r["details"]["engine_makespan_s"] *= 2
    (res / "arena-rl-rho08-356-360-details.json").write_text(json.dumps(doc))
    second = rows()
    held = "kvc_aware ÷ verl_default"
    assert second[held][0] == first[held][0]
    assert second[held][1] != first[held][1] and second[held][2] != first[held][2]
    assert {k: v for k, v in second.items() if k != held} == {k: v for k, v in first.items() if k != held}


def test_arena_refreeze_block_parts_the_freeze_from_the_host(tmp_path):
    """docs/arena.md's arena-refreeze block pairs `make arena`'s re-run
    kvc_aware rows with the published rows they replaced and with the old
    freeze run again beside them: the re-run column is the mean of the
    per-seed ratios to the same-hour file, and without that file the column
    is gone."""
    from kvc_harness.stats import mean_ci

    files = ("arena-details.json", "arena-kvc-f591d2b-details.json", "arena-kvc-f591d2b-rerun-details.json")
    res, render = _arena_docs(tmp_path, files, ("arena", "arena-refreeze"), "headline")

    def rows() -> dict:
        block = render()
        return {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]]
                for ln in block.splitlines() if ln.startswith(("| grpo", "| agent", "| long"))}

    first = rows()
    assert set(first) == {"grpo_sat", "agent_scale", "long_agent"}, first
    assert all(len(c) == 6 for c in first.values()), first

    def step(name: str, w: str, p: str) -> dict:
        return {r["row"]["seed"]: r["details"]["engine_makespan_s"]
                for r in json.loads((res / name).read_text())["runs"]
                if r["row"]["workload"] == w and r["row"]["policy"] == p}

    now, again = step("arena-details.json", "long_agent", "kvc_aware"), \
        step("arena-kvc-f591d2b-rerun-details.json", "long_agent", "kvc_aware")
    assert sorted(now) == sorted(again) == list(range(321, 326))
    want = mean_ci([now[s] / again[s] for s in sorted(now)]).fmt(3)
    assert first["long_agent"][1].startswith(want), (first["long_agent"], want)
    (res / "arena-kvc-f591d2b-rerun-details.json").unlink()
    second = rows()
    assert all(len(c) == 4 for c in second.values()), second
    assert [c[0] for c in second.values()] == [c[0] for c in first.values()]


def test_change_effect_pairs_kvc_aware_with_the_freeze_before(tmp_path):
    """The agent-only run's folder holds kvc_aware at the freeze before on the
    same seeds (before-FREEZE.json): the line under its table is kvc_aware now
    ÷ then per seed, with the one rule's word, and says whether verl_default's
    rows match (they must: the same seeds and workload)."""
    path = os.pathsep.join([os.path.join(REPO, "testbed"), os.path.join(REPO, "testbed", "scripts")])
    env = dict(os.environ, PYTHONPATH=path)
    d = tmp_path / "rl-tuned-agt-x"
    d.mkdir()

    def line() -> str:
        code = ("import json, sys, render_results as r; "
                "print(json.dumps(r.render_change_effect(sys.argv[1], sys.argv[1] + '/heldout-rl-agt.json')))")
        out = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True, env=env,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def doc(kvc: Dict[int, float], verl: Dict[int, float]) -> str:
        def rows(name: str, by: Dict[int, float]) -> dict:
            return {"policy": name, "per_seed": [{"seed": s, "makespan_s": v, "ttft_p99_s": v / 100,
                                                  "hit_rate": 0.9} for s, v in by.items()]}
        return json.dumps({"rows": [rows("verl_default", verl), rows("kvc_aware", kvc)]})

    verl = {1: 100.0, 2: 200.0, 3: 300.0}
    (d / "heldout-rl-agt.json").write_text(doc({1: 90.0, 2: 180.0, 3: 273.0}, verl))
    (d / "before-abc1234.json").write_text(doc({1: 100.0, 2: 200.0, 3: 300.0}, verl))
    text = line()
    assert "at the abc1234 freeze" in text and "verl_default's rows identical" in text, text
    assert "step time 0.903 ± 0.014 (shorter)" in text, text
    (d / "before-abc1234.json").write_text(doc({1: 100.0, 2: 200.0, 3: 300.0}, {**verl, 3: 301.0}))
    assert "**not identical**" in line()
    (d / "before-abc1234.json").unlink()
    assert line() == ""
