"""Renders docs/rl-workloads.md's measured tables from the committed kvbench
JSON (docs/results/rl-*.json): per setting, every row's step time as the mean
± 95% CI (Student's t) of its per-seed ratio to verl_default on the same
seed, TTFT p99 likewise. Usage: render_rl.py RESULTS_DIR > table.md"""

from __future__ import annotations

import glob
import json
import os
import sys
from typing import Dict, List

try:
    from kvc_harness.stats import mean_ci
except ModuleNotFoundError as e:
    if e.name != "kvc_harness":
        raise
    sys.exit("kvc_harness not found: run with PYTHONPATH=testbed (as `make kvbench-rl` does)")

SETTINGS = (
    ("rl-r0", "grpo_sat, first epoch, ρ 0 (independent lengths)", None),
    ("rl-r5", "grpo_sat, first epoch (no history), ρ 0.5", None),
    ("rl-r8", "grpo_sat, first epoch (no history), ρ 0.8", None),
    ("rl-r8p", "grpo_sat, first epoch, ρ 0.8: the peers RL teams deploy and llm-d", None),
    ("rl-rec", "grpo_sat, recurring prompts: step 2 = epoch 2, ρ 0.6, epoch correlation 0.8", 1),
    ("rl-agt", "agent, task difficulty ρ 0.6 (turn counts and lengths), tool latency bounded Pareto 1–60 s", None),
)


def rows(results: str, prefix: str, step) -> Dict[str, Dict[str, List[float]]]:
    """Per policy, its per-seed step time over verl_default's (and TTFT p99's,
    and the step time itself) in the files RESULTS/PREFIX-*.json."""
    out: Dict[str, Dict[str, List[float]]] = {}
    for path in sorted(glob.glob(os.path.join(results, f"{prefix}-*.json"))):
        with open(path, encoding="utf-8") as f:
            rep = json.load(f)
        def mk(p: str, rep: dict = rep) -> float:
            if step is None:
                return rep["policies"][p]["makespan_s"]
            return rep["makespan_steps_s"][p][step]

        base = mk("verl_default")
        base_ttft = rep["policies"]["verl_default"]["ttft_p99_s"]
        for p in rep["policies"]:
            r = out.setdefault(p, {"step": [], "ttft": [], "abs": [], "hit": [], "preempt": []})
            r["step"].append(mk(p) / base)
            r["ttft"].append(rep["policies"][p]["ttft_p99_s"] / base_ttft)
            r["abs"].append(mk(p))
            r["hit"].append(float(rep["policies"][p].get("hit_rate", float("nan"))))
            r["preempt"].append(float(rep["policies"][p].get("preemptions", float("nan"))))
    return out


def render(results: str, shown: str, shape: str = "", only: str = "", counters: bool = False) -> str:
    """Every setting with files in RESULTS as a table (ONLY: that prefix
    alone); SHOWN is the directory's name in the titles (repository-relative);
    SHAPE, when the runs are not kvbench-rl's grpo_sat, names theirs in each
    title. COUNTERS adds the engines' prefix-cache hit rate and preemptions
    (over the whole run: a recurring table's count both steps), which say
    what an order trades for its step."""
    out: List[str] = []
    for prefix, title, step in SETTINGS:
        if only and prefix != only:
            continue
        data = rows(results, prefix, step)
        if not data:
            continue
        n = len(next(iter(data.values()))["step"])
        if shape:
            title = title.replace("grpo_sat", shape, 1)
        head = "| row | step time (s) | step time / verl_default | TTFT p99 / verl_default |"
        rule = "|---|---:|---:|---:|"
        if counters:
            head += " hit rate, whole run | preemptions per run |"
            rule += "---:|---:|"
        out += [f"#### {title} ({n} fresh seeds, `{shown.rstrip('/')}/{prefix}-*.json`)", "", head, rule]
        for p, r in data.items():
            a, s, t = mean_ci(r["abs"]), mean_ci(r["step"]), mean_ci(r["ttft"])
            line = f"| {p} | {a.fmt(1)} | {s.fmt(3)} | {t.fmt(3)} |"
            if counters:
                h = mean_ci([x * 100 for x in r["hit"]])
                line += f" {h.fmt(1)}% | {sum(r['preempt']) / len(r['preempt']):.0f} |"
            out.append(line)
        out.append("")
    return "\n".join(out)


def main() -> None:
    print(render(sys.argv[1], sys.argv[1]))


if __name__ == "__main__":
    main()
