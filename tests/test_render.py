"""scripts/render_results.py: tables rendered from the benchmarks' JSON
into marked blocks, with 95% CIs and "best" only without overlap."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "render_results.py")


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "tests"))
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
    assert "**kvc_aware** best (30.0 ± 1.2" in grpo
    long = a.split("#### long_agent")[1]
    assert "step time (engine clock) s: tie:" in long and "best (" not in long.split("step time")[-1].split("\n")[0]
    k = (tmp_path / "docs" / "kvbench.md").read_text()
    assert "| sglang_cache_aware | launcher defaults |" in k and "| sglang_cache_aware (tuned) |" in k
    assert "**sglang_cache_aware (tuned)** best (5.0 ± 0.7" in k
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
    # Per-policy intervals overlap (the seeds' work spreads 40-70 s): a tie.
    assert "step time (engine clock) s: tie:" in a
    assert "shorter than verl_default, paired by seed" in a
    shorter = [ln for ln in a.splitlines() if "shorter than verl_default" in ln][0]
    assert "kvc_aware 0.901 ± 0.001" in shorter and "sglang" not in shorter
    tie = [ln for ln in a.splitlines() if "tie with verl_default" in ln][0]
    assert "sglang_router_cache_aware 0.998 ± 0.014" in tie and "repeat" not in tie
    assert "| verl_default, second run (noise floor) |" in a
    assert "differ by 2.0% on average (at most 2.0%)" in a
    verdict_lines = [ln for ln in a.splitlines() if ln.startswith("- ") and "noise floor" not in ln]
    assert not any("repeat" in ln for ln in verdict_lines), verdict_lines


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
    assert "**sglang_router_cache_aware@tuned** best" in a  # the tuned peer wins here, and the table says so
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
                "makespan_bound_share": share}

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
    # the best peer is the tuned SGLang row; kvc_aware+admit's interval clears every other one
    assert "sglang_cache_aware (tuned) 93.0 ± 1.0" in line and "50% / 75%" in line, line
    assert "80.0 ± 0.5 (1.06 ± 0.01)" in line and "**kvc_aware+admit** best (85.0 ± 1.0" in line, line
    assert "| 311 | 0.900 | 0.800 | n/a |" in t
