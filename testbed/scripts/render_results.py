"""Renders the result tables of docs/arena.md, docs/kvbench.md and README.md
from the JSON the benchmarks wrote; no figure is copied by hand.

Each document holds generated blocks between markers

    <!-- BEGIN RENDERED: NAME -->
    ...
    <!-- END RENDERED: NAME -->

and this script rewrites what is between them (a block's markers stay where
the author put them). Blocks:

* ``arena`` (docs/arena.md): per workload, every policy's mean ± 95% CI
  (Student's t over seeds) and who wins each metric, from the arena's
  ``arena-details.json``;
* ``kvbench`` (docs/kvbench.md): the held-out tables (``kvbench --heldout
  --json``), launcher-default and tuned rows side by side;
* ``headline`` (README.md): step time per RL workload, kvc_aware against
  verl_default and the best peer, with hit rate and TTFT p99 beside it.

"best"/"better" is written only where the 95% intervals do not overlap;
otherwise the row says "tie" (testbed/kvc_harness/stats.py).

  PYTHONPATH=testbed python testbed/scripts/render_results.py \\
      --arena docs/results/arena-details.json --kvbench docs/results/kvbench-*.json
  ... --check   # exit 1 if a document is not what the JSON renders to
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

try:
    from kvc_harness.stats import MeanCI, mean_ci, verdict
except ModuleNotFoundError as e:
    if e.name != "kvc_harness":
        raise
    sys.exit("kvc_harness not found: run with PYTHONPATH=testbed")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BOUND = "prefill_free_bound"
REPEAT_SUFFIX = "#repeat"  # a policy run a second time on every seed: the noise floor
# A policy's row without the burst hold (arena --both-holds): compared only
# with rows of the same arrival model (verl_default+nohold, kvc_aware+nohold).
NOHOLD = "+nohold"


def base_for(p: str, present: Sequence[str], base: str = "verl_default") -> str:
    """The row a policy's paired ratio divides by: verl_default under the
    same arrival model (the hold or not); verl_default+nohold itself is
    compared with verl_default (what the hold changes)."""
    if p.endswith(NOHOLD) and p != base + NOHOLD and base + NOHOLD in present:
        return base + NOHOLD
    return base


def is_policy(name: str) -> bool:
    return name != BOUND and not name.endswith(REPEAT_SUFFIX)


def repo_path(p: str) -> str:
    """A path as the documents show it: repository-relative. Results store
    relative paths; an absolute one (older results) is taken relative to
    this checkout when inside it, else from its last ``docs/`` component
    on, so a clone elsewhere renders the same text."""
    if not os.path.isabs(p):
        return p
    rel = os.path.relpath(p, REPO)
    if not rel.startswith(".."):
        return rel
    i = p.rfind(os.sep + "docs" + os.sep)
    return p[i + 1:] if i >= 0 else os.path.basename(p)

BLOCK = re.compile(r"(<!-- BEGIN RENDERED: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- END RENDERED: (?P=name) -->)",
                   re.S)

# Arena metrics: (key, where, label, digits, lower is better)
ARENA_METRICS = (
    ("engine_makespan_s", "details", "step time (engine clock) s", 1, True),
    ("client_makespan_s", "details", "client makespan s", 1, True),
    # The busiest server's simulated compute over the step: set by routing and
    # batching alone, whatever delays requests before they reach an engine.
    ("busy_makespan_s", "details", "busiest server's compute s", 1, True),
    ("ttft_p99_s", "row", "TTFT p99 s", 3, True),
    ("ttft_p50_s", "row", "TTFT p50 s", 3, True),
    ("hit_rate", "row", "hit rate", 3, False),
    ("imbalance", "row", "imbalance", 2, True),
)
VERDICT_METRICS = ("engine_makespan_s", "ttft_p99_s", "hit_rate")
RL_WORKLOADS = ("grpo_sat", "agent_scale", "long_agent")
# `make arena-rl`'s workloads (issue 26's RL length structure, verl's arrival
# order): rendered from their own file into docs/arena.md's "arena-rl" block
# and README's "headline-rl" block.
ARENA_RL_WORKLOADS = ("grpo_rho0", "grpo_rho05", "grpo_rho08", "grpo_recur", "agent_task")


def replace_blocks(text: str, blocks: Dict[str, str], path: str) -> str:
    seen = set()

    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name not in blocks:
            return m.group(0)
        seen.add(name)
        return m.group(1) + blocks[name].rstrip("\n") + "\n" + m.group(4)

    out = BLOCK.sub(sub, text)
    missing = set(blocks) - seen
    if missing:
        raise SystemExit(f"{path}: no <!-- BEGIN RENDERED: {sorted(missing)[0]} --> block")
    return out


# ---------------------------------------------------------------------------
# Arena


def _metric(run: dict, m: str, src: str) -> float:
    """A run's metric; the clients' clock makespan is details.client_makespan_s
    (results written before issue 27 kept it in row.makespan_s)."""
    if m == "client_makespan_s" and m not in run["details"]:
        return run["row"].get("makespan_s", float("nan"))
    return run[src].get(m, float("nan"))


def pacing_lines(runs: List[dict], w: str) -> List[str]:
    late = [(r["row"]["policy"], r["row"]["seed"], r["details"]["pacing_late_max_s"]) for r in runs
            if r["row"]["workload"] == w and r["details"].get("pacing_fell_behind")]
    if not late:
        return []
    return ["- pacing fell behind the workload's schedule (a job submitted more than 1 simulated second late) in: "
            + ", ".join(f"{p} seed {s} ({x:.1f} s late)" for p, s, x in late)]


def arena_stats(runs: List[dict]) -> Tuple[List[str], Dict[str, List[str]], Dict[Tuple[str, str], Dict[str, MeanCI]],
                                           Dict[Tuple[str, str], List[int]]]:
    workloads: List[str] = []
    policies: Dict[str, List[str]] = {}
    groups: Dict[Tuple[str, str], List[dict]] = {}
    for r in runs:
        w, p = r["row"]["workload"], r["row"]["policy"]
        if w not in workloads:
            workloads.append(w)
        if p not in policies.setdefault(w, []):
            policies[w].append(p)
        groups.setdefault((w, p), []).append(r)
    stats = {k: {m: mean_ci([_metric(x, m, src) for x in rs]) for m, src, *_ in ARENA_METRICS}
             for k, rs in groups.items()}
    errors = {k: [x["row"]["errors"] for x in rs] for k, rs in groups.items()}
    return workloads, policies, stats, errors


def arena_verdicts(w: str, policies: Sequence[str], stats: Dict[Tuple[str, str], Dict[str, MeanCI]]) -> List[str]:
    lines = []
    for key, _src, label, digits, lower in ARENA_METRICS:
        if key not in VERDICT_METRICS:
            continue
        st = {p: stats[(w, p)][key] for p in policies if is_policy(p)}
        v = verdict(key, st, lower)
        if v is not None:
            lines.append(f"- {label}: {v.text(st, digits)}")
    return lines


# The one statistical rule (issue 27), for the arena and kvbench alike: a
# policy is compared with another by the ratio of their values on the same
# seed; "shorter"/"longer" (or "higher"/"lower") only where the 95% interval
# of the mean ratio (Student's t) excludes 1, else a tie.
PAIRED_METRICS = (("step", "step time", True), ("ttft_p99", "TTFT p99", True), ("hit", "hit rate", False))
# Routers that queue requests themselves: kvc_harness.arena.ROUTER_QUEUES,
# copied so the renderer needs no harness import (test_harness checks equal):
# the arena's TTFT starts at an engine's arrival, so their rows' TTFT leaves
# out the wait in the router's queue, where every other router's requests
# wait inside the engines. That TTFT is shown, marked, and never compared;
# kvc_aware+admit's wait is in the client's acquire, so its TTFT with the
# wait counted (ttft_with_acquire_p99_s) is compared in its own line.
ROUTER_QUEUE_ROWS = ("dynamo_kv_router+queue", "kvc_aware+admit", "kvc_aware+admit+lengths")
ADMIT = "kvc_aware+admit"  # our router-side admission: a mode of ours, never a peer
TTFT_NOT_COMPARED = ("† TTFT starts when a request reaches an engine; a router queue's rows (marked †) leave out "
                     "the wait in that queue, where every other router's requests wait inside the engines, so "
                     "that TTFT is not compared with any other row (kvc_aware+admit's TTFT with its wait counted "
                     "is, in README's kvc_aware+admit line)")


def queues_in_router(p: str) -> bool:
    base = p.partition("@")[0]
    return (base[: -len(NOHOLD)] if base.endswith(NOHOLD) else base) in ROUTER_QUEUE_ROWS


def paired(per_seed: Dict[Tuple[str, int], Dict[str, float]], a: str, b: str, m: str) -> Optional[MeanCI]:
    """Mean ± 95% CI over the seeds both ran of a's value over b's (b > 0)."""
    rs = [v[m] / per_seed[(b, seed)][m] for (p, seed), v in per_seed.items()
          if p == a and (b, seed) in per_seed and per_seed[(b, seed)][m] > 0 and not math.isnan(v[m])]
    return mean_ci(rs) if rs else None


def _clear(ci: MeanCI) -> int:
    """+1 if the ratio's interval is above 1, -1 if below, 0 otherwise (or one seed)."""
    if ci.n < 2 or math.isnan(ci.ci95):
        return 0
    return 1 if ci.lo > 1.0 else -1 if ci.hi < 1.0 else 0


def is_ours(p: str) -> bool:
    """kvc_aware and its modes (kvc_aware+admit: router-side admission)."""
    return p == "kvc_aware" or p.startswith(("kvc_aware+", "kvc_aware@"))


def rule_lines(per_seed: Dict[Tuple[str, int], Dict[str, float]], policies: Sequence[str],
               ours: str = "kvc_aware", base: str = "verl_default", versus_only: bool = False,
               skip_our_modes: bool = False) -> List[str]:
    """Every policy against verl_default, and ours against every other
    policy (not our other modes), on each metric, paired by seed; ours'
    losses first; then the multiplicity note. ``versus_only``: ours against
    the others only (a second mode of ours, after the first's lines)."""
    lines: List[str] = []
    n = 0
    losses, wins, ties = [], [], []
    if ours in policies:
        for p in policies:
            if p == ours or (skip_our_modes and is_ours(p)):
                continue
            for m, label, lower in PAIRED_METRICS:
                if m.startswith("ttft") and (queues_in_router(p) or queues_in_router(ours)):
                    continue
                ci = paired(per_seed, ours, p, m)
                if ci is None:
                    continue
                n += 1
                c = _clear(ci) * (1 if lower else -1)  # +1: ours worse
                cell = f"{label} vs {p} {ci.fmt(3)}"
                (losses if c > 0 else wins if c < 0 else ties).append(cell)
        lines.append(f"- {ours} loses (ratio {ours} ÷ other, paired by seed, interval clear of 1 on the wrong side): "
                     + (", ".join(losses) if losses else "none"))
        lines.append(f"- {ours} wins: " + (", ".join(wins) if wins else "none"))
        if ties:
            lines.append(f"- {ours} ties (interval includes 1): " + ", ".join(ties))
    for m, label, lower in PAIRED_METRICS[1:] if not versus_only else ():
        better, worse = [], []
        for p in policies:
            if p in (base, ours) or (m.startswith("ttft") and queues_in_router(p)):
                continue
            ci = paired(per_seed, p, base, m)
            if ci is None:
                continue
            n += 1
            c = _clear(ci) * (1 if lower else -1)
            if c:
                (worse if c > 0 else better).append(f"{p} {ci.fmt(3)}")
        if better or worse:
            lines.append(f"- {label} ÷ {base}'s, paired by seed: better " + (", ".join(better) or "none")
                         + "; worse " + (", ".join(worse) or "none"))
    if n:
        lines.append(f"- multiplicity: {n} paired comparisons on this workload, each at 95%; with no real "
                     f"difference about {0.05 * n:.1f} of them would clear 1 by chance, so one narrow clearance "
                     "alone is weak evidence")
    return lines


def arena_per_seed(runs: List[dict], w: str) -> Dict[Tuple[str, int], Dict[str, float]]:
    out: Dict[Tuple[str, int], Dict[str, float]] = {}
    for r in runs:
        if r["row"]["workload"] == w and is_policy(r["row"]["policy"]):
            # TTFT with the client's acquire (admission's hold) added.
            # verl_default's acquire is an in-process decision of
            # microseconds, so its engine TTFT stands in where older runs
            # lack the field; any other row without it is left out. The same
            # with admission's hold as wall time x speed is in runs since the
            # hold went onto the engines' clocks (verl_default's is the same
            # figure either way).
            verl = r["row"]["policy"].startswith("verl_default")
            acq = r["details"].get("ttft_with_acquire_p99_s", r["row"]["ttft_p99_s"] if verl else float("nan"))
            out[(r["row"]["policy"], r["row"]["seed"])] = {
                "step": r["details"].get("engine_makespan_s", float("nan")),
                "ttft_p99": r["row"]["ttft_p99_s"], "hit": r["row"]["hit_rate"], "ttft_acq_p99": acq,
                "ttft_acq_wall_p99": r["details"].get("ttft_with_acquire_wall_p99_s", acq if verl else float("nan"))}
    return out


def paired_ratios(runs: List[dict], w: str, base: str = "verl_default",
                  key: str = "engine_makespan_s") -> Dict[str, MeanCI]:
    """Per policy: mean ± 95% CI over seeds of its step time divided by
    ``base``'s on the same seed. Seeds differ in the work they hold; the
    ratio takes that out, so it is the comparison to read when a policy's
    own interval is wide."""
    by: Dict[Tuple[str, int], float] = {}
    for r in runs:
        if r["row"]["workload"] == w:
            by[(r["row"]["policy"], r["row"]["seed"])] = r["details"].get(key, float("nan"))
    out: Dict[str, MeanCI] = {}
    present = list(dict.fromkeys(p for p, _ in by))
    for p in present:
        b = base_for(p, present, base)
        ratios = [v / by[(b, seed)] for (pp, seed), v in by.items()
                  if pp == p and (b, seed) in by and by[(b, seed)] > 0]
        if ratios:
            out[p] = mean_ci(ratios)
    return out


def paired_lines(w: str, ratios: Dict[str, MeanCI], nohold: bool = False) -> List[str]:
    """The step-time verdicts against verl_default, for the rows of one
    arrival model (``nohold``: the +nohold rows against verl_default+nohold)."""
    shorter, longer, same = [], [], []
    base = "verl_default" + (NOHOLD if nohold else "")
    for p, ci in ratios.items():
        if not is_policy(p) or p in ("verl_default", base) or p.endswith(NOHOLD) != nohold:
            continue
        cell = f"{p} {ci.fmt(3)}"
        if ci.n < 2 or math.isnan(ci.ci95):
            same.append(cell + " (one seed, no interval)")
            continue
        (shorter if ci.hi < 1.0 else longer if ci.lo > 1.0 else same).append(cell)
    lines = []
    if shorter:
        lines.append(f"- step time shorter than {base}, paired by seed (the ratio's interval is below 1): "
                     + ", ".join(shorter))
    if longer:
        lines.append(f"- step time longer than {base}, paired by seed (the ratio's interval is above 1): "
                     + ", ".join(longer))
    if same:
        lines.append(f"- step time paired by seed, no interval clear of 1 (tie with {base}): " + ", ".join(same))
    return lines


def precision_line(w: str, policies: Sequence[str], stats: Dict[Tuple[str, str], Dict[str, MeanCI]]) -> List[str]:
    """Each policy's step-time interval as a share of its mean (issue 19's
    target: within ±5% over 5 seeds)."""
    cells = []
    for p in policies:
        if not is_policy(p):
            continue
        ci = stats[(w, p)]["engine_makespan_s"]
        if ci.n < 2 or math.isnan(ci.ci95) or not ci.mean:
            continue
        cells.append((100 * ci.ci95 / ci.mean, p))
    if not cells:
        return []
    within = sum(1 for pct, _ in cells if pct <= 5.0)
    return [f"- step time interval as a share of the mean: {within} of {len(cells)} policies within ±5% ("
            + ", ".join(f"{p} ±{pct:.1f}%" for pct, p in cells) + ")"]


# A decision slower than this (wall ms, mean over seeds) is named under the
# tables: it delays each request's arrival at the engine, which thins the
# engines' queues and which an agent workload's engine-clock step time (the
# sum of a trajectory's engine latencies) does not charge.
SLOW_DECISION_MS = 10.0


def overhead_lines(runs: List[dict], w: str, speed: float) -> List[str]:
    by: Dict[str, List[float]] = {}
    for r in runs:
        if r["row"]["workload"] == w and is_policy(r["row"]["policy"]):
            by.setdefault(r["row"]["policy"], []).append(r["details"].get("router_overhead_ms", 0.0))
    slow = [(p, sum(v) / len(v)) for p, v in by.items() if v and sum(v) / len(v) >= SLOW_DECISION_MS]
    if not slow:
        return []
    def busy_vs(p: str) -> str:
        """kvc_aware (same arrival model) ÷ p, the busiest server's compute, paired by seed."""
        ours = "kvc_aware" + (NOHOLD if p.endswith(NOHOLD) else "")
        b = {(r["row"]["policy"], r["row"]["seed"]): r["details"].get("busy_makespan_s", float("nan"))
             for r in runs if r["row"]["workload"] == w}
        rs = [v / b[(p, seed)] for (q, seed), v in b.items() if q == ours and b.get((p, seed), 0) > 0]
        if p == ours or not rs or any(math.isnan(x) for x in rs):
            return ""
        ci = mean_ci(rs)
        return f"; busiest server's compute, {ours} ÷ it, paired: {ci.fmt(3)}"

    cells = ", ".join(f"{p} {ms:.1f} ms ({ms * speed / 1000:.1f} simulated s{busy_vs(p)})" for p, ms in slow)
    return [f"- routing decisions slower than {SLOW_DECISION_MS:g} ms of wall time (mean over seeds; at --speed "
            f"{speed:g} each delays its request's arrival at an engine by the simulated time in brackets, which "
            "thins the engines' queues and which the engine-clock step time of an agent workload, a trajectory's "
            f"summed engine latencies, does not charge; compare these rows by the busiest server's compute and the "
            f"client clock): {cells}"]


# An agent step's engine-clock time sums each trajectory's engine latencies:
# the time between its turns (tools, the client, the router) is not in it. A
# router whose turns come back later therefore leaves the engines emptier and
# shortens that sum (docs/arena.md, "Agent steps and slow routers": the same
# extra wait between turns shortened verl_default's engine-clock step). A
# row whose clients spend this many times verl_default's time outside the
# engines (client makespan − engine-clock step), paired by seed with the
# interval clear of 1, is marked not comparable. A router that only balances
# worse makes the engines slower, which lengthens the engine clock too and
# does not count here.
SLOW_CLIENT_RATIO = 1.2


def slow_clients(runs: List[dict], w: str) -> Dict[str, MeanCI]:
    """Per policy on an agent workload (not grpo, whose step is the fleet's
    span and already charges a late turn): its clients' time outside the
    engines (client makespan − engine-clock step) ÷ verl_default's (same
    arrival model), paired by seed, where the mean is at least
    SLOW_CLIENT_RATIO and the interval clears 1."""
    if w.startswith("grpo"):
        return {}
    c = {(r["row"]["policy"], r["row"]["seed"]): r["details"].get("client_over_engine_s", float("nan"))
         for r in runs if r["row"]["workload"] == w}
    out: Dict[str, MeanCI] = {}
    for p in sorted({q for q, _ in c}):
        if not is_policy(p):
            continue
        base = "verl_default" + (NOHOLD if p.endswith(NOHOLD) else "")
        if p == base:
            continue
        rs = [v / c[(base, seed)] for (q, seed), v in c.items()
              if q == p and c.get((base, seed), 0) > 0 and not math.isnan(v)]
        if len(rs) < 2:
            continue
        ci = mean_ci(rs)
        if ci.mean >= SLOW_CLIENT_RATIO and _clear(ci) == 1:
            out[p] = ci
    return out


def slow_client_lines(runs: List[dict], w: str) -> List[str]:
    slow = slow_clients(runs, w)
    if not slow:
        return []
    cells = ", ".join(f"{p} {ci.fmt(2)}" for p, ci in slow.items())
    return [f"- not comparable on the engine clock: these rows' client time outside the engines (client makespan − "
            f"step time) ÷ verl_default's, paired by seed, is at least {SLOW_CLIENT_RATIO:g}: {cells}. Their turns "
            "came back later (a slower router or proxy, or a busier host while that row ran), "
            "so the engines ran emptier and each trajectory's summed engine latencies, this workload's step time, "
            "came out shorter; the same extra wait given to verl_default shortened its engine-clock step "
            "(docs/arena.md, \"Agent steps and slow routers\", measures by how much)"]


def queue_steps_not_comparable(runs: List[dict], w: str) -> List[str]:
    """A router queue's rows on an agent workload (not grpo, whose step is
    the fleet's span and includes any wait before an engine): the step sums
    each trajectory's engine latencies, which leave out the turns' wait in
    the router's queue, so it is not compared on the engine clock."""
    if w.startswith("grpo"):
        return []
    return sorted({r["row"]["policy"] for r in runs if r["row"]["workload"] == w
                   and is_policy(r["row"]["policy"]) and queues_in_router(r["row"]["policy"])})


def queue_step_lines(runs: List[dict], w: str) -> List[str]:
    rows = queue_steps_not_comparable(runs, w)
    if not rows:
        return []
    return [f"- not comparable on the engine clock: {', '.join(rows)} (†): an agent step sums each trajectory's "
            "engine latencies, which start when a turn reaches an engine and so leave out the turns' wait in the "
            "router's queue (every other router's turns wait inside the engines, where it counts); the client "
            "makespan column includes it"]


# docs/results/agent-turn-gap/: the experiment behind SLOW_CLIENT_RATIO, in
# the order its table lists it (file stem, what ran).
TURN_GAP_FILES = (("gap-0", "no extra wait"), ("gap-5", "+5 s before every later turn"),
                  ("gap-10", "+10 s before every later turn"), ("gap-20", "+20 s before every later turn"),
                  ("dynamo-streamed-to-client", "no extra wait; the proxy relayed the stream to the client"),
                  ("dynamo-buffered", "no extra wait; the proxy answered the client with one completion"))


def render_turn_gap(folder: str) -> Optional[str]:
    """docs/arena.md's table of the agent_task turn-gap experiment: every run
    of every file, its engine-clock step, client makespan, the time outside
    the engines and the busiest server's compute (simulated seconds)."""
    rows = []
    step: Dict[Tuple[str, str, int], float] = {}
    for stem, what in TURN_GAP_FILES:
        path = os.path.join(folder, stem + ".json")
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        for r in doc["runs"]:
            d = r["details"]
            step[(stem, r["row"]["policy"], r["row"]["seed"])] = d["engine_makespan_s"]
            rows.append(f"| `{stem}.json` | {what} | {r['row']['policy']} | {r['row']['seed']} | "
                        f"{d['engine_makespan_s']:.1f} | {d['client_makespan_s']:.1f} | "
                        f"{d['client_makespan_s'] - d['engine_makespan_s']:.1f} | {d['busy_makespan_s']:.1f} | "
                        f"{r['row']['hit_rate']:.3f} |")
    rel = os.path.relpath(folder, REPO)
    return "\n".join([f"Rendered from `{rel}/` (agent_task, tuning seeds 101 and 102, never reported; simulated "
                      "seconds):", "",
                      "| file | client between turns | policy | seed | step time (engine clock) | client makespan | "
                      "outside the engines | busiest server's compute | hit rate |",
                      "|---|---|---|---|---|---|---|---|---|", *rows, "", turn_gap_drop(step)])


def turn_gap_drop(step: Dict[Tuple[str, str, int], float]) -> str:
    """How much shorter the engine-clock step got with +10 and +20 s between
    turns than the same policy and seed with no wait (min-max over them)."""
    cuts = [1 - v / step[("gap-0", p, seed)] for (stem, p, seed), v in step.items()
            if stem in ("gap-10", "gap-20") and ("gap-0", p, seed) in step]
    if not cuts:
        return ""
    pols = sorted({p for (stem, p, _) in step if stem == "gap-0"})
    return (f"With +10 or +20 s between turns the engine-clock step of {' and '.join(pols)} was "
            f"{100 * min(cuts):.0f}–{100 * max(cuts):.0f}% shorter than the same policy's on the same seed "
            "with no wait.")


def noise_lines(doc: dict, w: str) -> List[str]:
    rows = [n for n in doc.get("noise_floor") or [] if n["workload"] == w]
    if not rows:
        return []
    diffs = [n["rel_diff"] for n in rows]
    per_seed = ", ".join(f"{n['seed']}: {n['first_s']:.1f} / {n['second_s']:.1f}" for n in rows)
    return [f"- noise floor ({rows[0]['policy']} run twice on every seed): the two step times differ by "
            f"{100 * sum(diffs) / len(diffs):.1f}% on average (at most {100 * max(diffs):.1f}%); per seed {per_seed} s"]


def merge_tuned(doc: dict, tuned: Optional[dict]) -> dict:
    """The arena's runs with `make arena-tuned`'s tuned peer rows ("PEER@tuned")
    added, each placed after its launcher-default row; the tuning record is
    kept under "tuning"."""
    if not tuned:
        return doc
    runs = list(doc["runs"])
    for r in tuned["runs"]:
        base = untuned(r["row"]["policy"])
        # After the base policy's first run: tables list policies in the order they first appear.
        at = min((i for i, x in enumerate(runs) if x["row"]["workload"] == r["row"]["workload"]
                  and untuned(x["row"]["policy"]) == base), default=len(runs) - 1)
        runs.insert(at + 1, r)
    return dict(doc, runs=runs, tuning=tuned.get("tuning"), tuned_config=tuned.get("config"))


def untuned(p: str) -> str:
    """The row a tuned row belongs beside: "PEER@tuned" -> "PEER",
    "PEER@tuned+nohold" -> "PEER+nohold"."""
    name, _, tag = p.partition("@")
    return name + (NOHOLD if tag.endswith(NOHOLD) else "")


def combine_tuned(parts: Sequence[dict]) -> Optional[dict]:
    """Several tuned runs of one arena file as one (`make arena-rl-tuned`
    and `make arena-rl-queue-tuned`, whose router queue is tuned without
    the hold): runs concatenated, tuning records merged. They must share
    tuning seeds and objective (one rule for every tuned row); a peer tuned
    without the hold is listed under "nohold_peers"."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    first = parts[0].get("tuning") or {}
    tuning: Dict[str, Any] = {"tune_seeds": first.get("tune_seeds"), "objective": first.get("objective"),
                              "grid": {}, "points": [], "chosen": {}, "nohold_peers": []}
    runs: List[dict] = []
    for part in parts:
        t = part.get("tuning") or {}
        for k in ("tune_seeds", "objective"):
            if t.get(k) != tuning[k]:
                raise ValueError(f"tuned runs differ in {k}: {t.get(k)!r} vs {tuning[k]!r}; one rule for every "
                                 "tuned row")
        clash = sorted(set(t.get("chosen") or {}) & set(tuning["chosen"]))
        if clash:
            raise ValueError(f"peers tuned in two files: {clash}")
        tuning["grid"].update(t.get("grid") or {})
        tuning["chosen"].update(t.get("chosen") or {})
        tuning["points"] += t.get("points") or []
        if t.get("hold") is False:
            tuning["nohold_peers"] += sorted(t.get("chosen") or {})
        runs += part["runs"]
    return dict(parts[0], runs=runs, tuning=tuning)


def display_name(p: str, w: str, doc: dict) -> str:
    if p == BOUND:
        return f"{p} (bound: free prefill)"
    if p.endswith(REPEAT_SUFFIX):
        return f"{p[: -len(REPEAT_SUFFIX)]}, second run (noise floor)"
    base, _, tag = p.partition("@")
    if tag in ("tuned", "tuned" + NOHOLD):
        params = ((doc.get("tuning") or {}).get("chosen") or {}).get(base, {}).get(w, {})
        knobs = ", ".join(f"{k} {v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else f"{k} {v}"
                          for k, v in sorted(params.items()))
        hold = ", no burst hold" if tag.endswith(NOHOLD) else ""
        return f"{base} (tuned: {knobs}{hold})" if knobs else f"{base} (tuned{hold})"
    return p


def tuning_lines(doc: dict, w: str) -> List[str]:
    t = doc.get("tuning")
    if not t:
        return []
    kept, moved = [], []
    for peer, per_w in sorted(t["chosen"].items()):
        if w not in per_w:
            continue
        name = peer + (" (tuned without the hold, against verl_default+nohold)"
                       if peer in (t.get("nohold_peers") or []) else "")
        if per_w[w] == t["grid"][peer][0]:
            kept.append(name)
        else:
            moved.append(name)
    seeds = ", ".join(map(str, t["tune_seeds"]))
    out = []
    if moved:
        out.append(f"- tuned peer rows: the grid point with the best objective on seeds {seeds} "
                   f"({t['objective']}): " + ", ".join(moved))
    if kept:
        out.append(f"- launcher default kept by tuning on seeds {seeds} (its row is the tuned row): " + ", ".join(kept))
    return out


def render_arena(doc: dict, source: str, tuned: Optional[dict] = None, tuned_source: str = "",
                 tuned_target: str = "make arena-tuned") -> str:
    doc = merge_tuned(doc, tuned)
    runs = doc["runs"]
    cfg = doc.get("config") or {}
    workloads, policies, stats, errors = arena_stats(runs)
    seeds = sorted({r["row"]["seed"] for r in runs})
    out = [f"Rendered by `testbed/scripts/render_results.py` from `{source}`: seeds {', '.join(map(str, seeds))}; "
           f"vllm-sim `--speed {cfg.get('speed')}`, `--clock {cfg.get('clock', 'wall')}`, "
           f"{'streamed' if cfg.get('stream', True) else 'non-streamed'} requests; kvc_aware's configuration: "
           f"`{repo_path(cfg['kvc_frozen']) if cfg.get('kvc_frozen') else 'library defaults'}`"
           + (f" at commit `{cfg['kvc_frozen_commit']}`" if cfg.get("kvc_frozen_commit") else "") + "."
           + (f" Tuned peer rows from `{tuned_source}` (`{tuned_target}`, same seeds)." if tuned else ""),
           "", "Every cell is the mean ± the 95% confidence interval of the mean over the seeds (Student's t); "
           "comparisons are paired by seed (ratios to the other policy on the same seed). "
           "Step time is the engine-clock makespan (grpo: last finish − first arrival over the fleet; agents: the "
           "longest trajectory's summed engine latencies); the client makespan adds the client's and proxies' time.",
           ""]
    for w in workloads:
        ps = policies[w]
        out.append(f"#### {w}")
        out.append("")
        ratios = paired_ratios(runs, w)
        hdr = ("| policy | " + " | ".join(label for _, _, label, *_ in ARENA_METRICS[:1])
               + " | step time ÷ verl_default (paired; a +nohold row ÷ verl_default+nohold) | "
               + " | ".join(label for _, _, label, *_ in ARENA_METRICS[1:]) + " | errors |")
        out += [hdr, "|" + "---|" * (len(ARENA_METRICS) + 3)]
        for p in ps:
            cells = [stats[(w, p)][m].fmt(d) for m, _s, _l, d, _lo in ARENA_METRICS]
            ratio = ratios[p].fmt(3) if p in ratios and p != "verl_default" else "1"
            if p == "verl_default" + NOHOLD and p in ratios:
                ratio += " (÷ verl_default: the hold's effect)"
            name = display_name(p, w, doc) + (" †" if queues_in_router(p) else "")
            out.append(f"| {name} | {cells[0]} | {ratio} | " + " | ".join(cells[1:]) + f" | {sum(errors[(w, p)])} |")
        out.append("")
        if any(queues_in_router(p) for p in ps):
            out.append(TTFT_NOT_COMPARED + ".")
            out.append("")
        out.append(f"Paired by seed on {w} (ratios' 95% intervals; \"shorter\"/\"longer\", wins and losses only "
                   "where the interval excludes 1):")
        out += paired_lines(w, ratios)
        per_seed = arena_per_seed(runs, w)
        out += rule_lines(per_seed, [p for p in ps if is_policy(p) and not p.endswith(NOHOLD)])
        if any(p.endswith(NOHOLD) for p in ps):
            out.append(f"Without the burst hold on {w} (every +nohold row against verl_default+nohold, the same "
                       "rule):")
            out += paired_lines(w, ratios, nohold=True)
            nohold_ps = [p for p in ps if is_policy(p) and p.endswith(NOHOLD)]
            out += rule_lines(per_seed, nohold_ps, ours="kvc_aware" + NOHOLD, base="verl_default" + NOHOLD,
                              skip_our_modes=True)
            if ADMIT + NOHOLD in nohold_ps:
                out += rule_lines(per_seed, nohold_ps, ours=ADMIT + NOHOLD, base="verl_default" + NOHOLD,
                                  versus_only=True, skip_our_modes=True)
        out += pacing_lines(runs, w)
        out += overhead_lines(runs, w, float(cfg.get("speed") or 1.0))
        out += slow_client_lines(runs, w)
        out += queue_step_lines(runs, w)
        out += precision_line(w, ps, stats)
        out += noise_lines(doc, w)
        out += tuning_lines(doc, w)
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# kvbench held-out


def _ci(s: dict) -> MeanCI:
    return MeanCI(float(s.get("Mean", float("nan"))), float(s.get("CI95", float("nan"))) if s.get("N", 0) > 1
                  else float("nan"), int(s.get("N", 0)), float(s.get("SD", float("nan"))))


def row_name(r: dict) -> str:
    if r.get("frozen_commit"):
        return f"{r['policy']} (frozen)"
    return f"{r['policy']} (tuned)" if r.get("tuned") else r["policy"]


def kvbench_per_seed(rows: List[dict]) -> Dict[Tuple[str, int], Dict[str, float]]:
    out: Dict[Tuple[str, int], Dict[str, float]] = {}
    for r in rows:
        for v in r.get("per_seed") or []:
            out[(row_name(r), v["seed"])] = {"step": v["makespan_s"], "ttft_p99": v["ttft_p99_s"], "hit": v["hit_rate"]}
    return out


def _kvc_row(rows: List[dict]) -> Optional[dict]:
    return next((r for r in rows if r["policy"] == "kvc_aware"), None)


# `make kvbench-rl-tuned`'s files (docs/results/RUN/heldout-rl-KEY.json), in report order.
RL_TUNED = ("r0", "r5", "r8", "rec", "agt")
# Its committed runs, oldest first, with kvc_aware's freeze: rl-tuned/ (the 668a343 freeze, seeds
# 371-375) and the same protocol at the 0c3bbe8 freeze on seeds 511-520. Each renders into the block
# named after its folder; the targets table reads every run present.
RL_TUNED_RUNS = (("rl-tuned", "668a343"), ("rl-tuned-0c3bbe8", "0c3bbe8"), ("rl-tuned-2f74939", "2f74939"))
# `make kvbench-rl-tuned-agent`'s runs (docs/results/RUN/heldout-rl-agt.json): the agent setting alone, at a
# freeze that changed only multi-turn placement (a485bc6, session_move_tokens); each renders into the block
# named after its folder, and the targets table's agent rows read it.
RL_TUNED_AGENT_RUNS = (("rl-tuned-agt-a485bc6", "a485bc6"),)


def kvbench_title(d: dict) -> str:
    """A held-out run's setting in words: its workload, and the RL shape
    (length correlation, recurring prompts, the reported steps, tools)
    when the run had one."""
    title = d["workload"]
    if d.get("arrival_spread_s"):
        title += f", arrivals spread over {d['arrival_spread_s']:g} s"
    if d.get("arrivals") == "verl":
        title += ", verl's arrival order"
    shape = d.get("shape") or {}
    if shape.get("dataset_prompts"):
        title += (f", recurring prompts (a {shape['dataset_prompts']}-prompt dataset, epoch correlation "
                  f"{shape.get('epoch_corr', 0):g})")
    if shape:
        title += f", ρ {shape.get('length_corr', 0):g}"
    if d.get("report_from_step"):
        title += f", step {d['report_from_step'] + 1} reported"
    if d.get("tool_pareto"):
        title += f", tools bounded Pareto {d['tool_pareto']}"
    return title


def render_kvbench(docs: List[Tuple[str, dict]]) -> str:
    out = ["Rendered by `testbed/scripts/render_results.py` from `kvbench --heldout --json` outputs. "
           "Each tunable peer has its launcher-default row and, below it, its row tuned on seeds 101–102 "
           "(one row when the tuning chose the launcher default); "
           "cells are mean ± 95% CI over the reported seeds (Student's t); comparisons are paired by seed.", ""]
    for path, d in docs:
        rows = d["rows"]
        frozen = d.get("kvc_frozen") or {}
        title = kvbench_title(d)
        out.append(f"#### {title} (`{os.path.relpath(path, REPO)}`)")
        out.append("")
        seeds = ", ".join(map(str, d["report_seeds"]))
        tuned_on = ", ".join(map(str, d["tune_seeds"]))
        goal = " for step time alone" if d.get("tune_objective") == "step" else ""
        out.append(f"Reported seeds {seeds}; tuned on {tuned_on}{goal}"
                   + (f"; kvc_aware frozen at `{frozen.get('commit')}`" if frozen.get("commit") else "") + ".")
        out.append("")
        out += ["| policy | knob | hit rate % | TTFT p50 s | TTFT p99 s | makespan s | makespan / verl_default |",
                "|---|---|---|---|---|---|---|"]
        for r in rows:
            knob = "launcher defaults"
            if r.get("frozen_commit"):
                knob = f"frozen at `{r['frozen_commit']}`"
            elif r.get("tuned"):
                knob = "`" + json.dumps(r.get("params"), separators=(",", ":")) + "`"
            elif r.get("default_is_tuned"):
                knob = "launcher defaults (also the tuning choice)"
            out.append(f"| {row_name(r)} | {knob} | {_ci(r['hit_rate']).fmt(1, 100)} | {_ci(r['ttft_p50_s']).fmt(3)} | "
                       f"{_ci(r['ttft_p99_s']).fmt(3)} | {_ci(r['makespan_s']).fmt(1)} | "
                       f"{_ci(r['makespan_over_verl']).fmt(3)} |")
        out.append("")
        out.append(f"Paired by seed on {title} (ratios' 95% intervals; wins and losses only where the interval "
                   "excludes 1):")
        ratios = {row_name(r): _ci(r["makespan_over_verl"]) for r in rows if r["policy"] != "verl_default"}
        out += paired_lines(title, ratios)
        per = kvbench_per_seed(rows)
        if per:
            kvc = _kvc_row(rows)
            out += rule_lines(per, [row_name(r) for r in rows], ours=row_name(kvc) if kvc else "kvc_aware")
        else:
            out.append("- this run's JSON has no per-seed values (written before they were recorded): only step "
                       "time against verl_default is paired")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# docs/step-time.md: step time on the RL-scale kvbench workloads

STEP_WORKLOADS = ("grpo_sat", "agent_scale", "agent_long", "agent_long_few")


def render_steptime(docs: List[Tuple[str, dict]], oracle: List[dict]) -> str:
    out = ["Held-out kvbench (`make kvbench-heldout`): mean ± 95% CI over the reported seeds; each peer at the better "
           "of its launcher-default and tuned rows (by mean makespan; both rows are in docs/kvbench.md); "
           "the step-time column pairs kvc_aware with the best peer by seed (\"shorter\"/\"longer\" only where the "
           "ratio's interval excludes 1). Bound share = the share of verl_default's gap "
           "to the lower bound closed; best / bound = how far the best policy stays above the bound.", "",
           "| workload | verl_default s | best peer s | kvc_aware s | kvc_aware+admit s | kvc_aware / verl | "
           "bound share kvc / +admit | lower bound s (best / bound) | TTFT p99 s kvc / +admit / best peer "
           "| step time |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    by_w = {d["workload"]: d for _, d in docs}
    for w in STEP_WORKLOADS:
        d = by_w.get(w)
        if d is None:
            continue
        ours = ("kvc_aware", "kvc_aware+admit")
        peer_rows = [r for r in d["rows"] if r["policy"] not in ours and r["policy"] != "verl_default"]
        if not peer_rows:
            continue
        best = min(peer_rows, key=lambda r: r["makespan_s"]["Mean"])
        kvc = next((r for r in d["rows"] if r["policy"] == "kvc_aware"), None)
        adm = next((r for r in d["rows"] if r["policy"] == "kvc_aware+admit"), None)
        verl = next((r for r in d["rows"] if r["policy"] == "verl_default"), None)
        if kvc is None or verl is None:
            continue
        vs = paired(kvbench_per_seed(d["rows"]), row_name(kvc), row_name(best), "step")
        step_cell = "n/a (no per-seed values)"
        if vs is not None:
            step_cell = f"kvc_aware ÷ {row_name(best)} {vs.fmt(3)}" + {1: " (longer)", -1: " (shorter)",
                                                                       0: " (tie)"}[_clear(vs)]
        lb = d.get("makespan_lower_bound_s") or {}
        loose = d.get("best_over_lower_bound") or {}
        share = f"{100 * kvc.get('makespan_bound_share', 0):.0f}%"
        if adm:
            share += f" / {100 * adm.get('makespan_bound_share', 0):.0f}%"
        out.append(f"| {w} | {_ci(verl['makespan_s']).fmt(1)} | {row_name(best)} {_ci(best['makespan_s']).fmt(1)} | "
                   f"{_ci(kvc['makespan_s']).fmt(1)} | {_ci(adm['makespan_s']).fmt(1) if adm else 'n/a'} | "
                   f"{_ci(kvc['makespan_over_verl']).fmt(3)} | {share} | "
                   f"{_ci(lb).fmt(1) if lb else 'n/a'} ({_ci(loose).fmt(2) if loose else 'n/a'}) | "
                   f"{_ci(kvc['ttft_p99_s']).fmt(2)} / {_ci(adm['ttft_p99_s']).fmt(2) if adm else 'n/a'} / "
                   f"{_ci(best['ttft_p99_s']).fmt(2)} | "
                   f"{step_cell} |")
    if oracle:
        out += ["", "Reference, not a policy: `kvbench --workload grpo_sat --oracle-longest-first` submits each "
                "step longest response first (true lengths, which no router sees) on the first reported seeds; "
                "makespan over verl_default's with the usual (FIFO) order on the same seed:", "",
                "| seeds | verl_default, longest first | kvc_aware, longest first | kvc_aware+admit, longest first |",
                "|---|---|---|---|"]
        cells = []
        for pol in ("verl_default", "kvc_aware", "kvc_aware+admit"):
            ratios = []
            for o in oracle:
                base = o.get("fifo_verl_default")
                if base and pol in o["policies"]:
                    ratios.append(o["policies"][pol]["makespan_s"] / base)
            cells.append(mean_ci(ratios).fmt(3))
        seeds = ", ".join(str(o["seed"]) for o in oracle)
        out.append(f"| {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# README headline


def render_headline(arena: Optional[dict], source: str, tuned: Optional[dict] = None,
                    shown: Sequence[str] = RL_WORKLOADS, target: str = "make arena") -> str:
    if arena is None:
        return "(no arena results rendered yet)"
    arena = merge_tuned(arena, tuned)
    workloads, policies, stats, _ = arena_stats(arena["runs"])
    nohold = any(p.endswith(NOHOLD) for ps in policies.values() for p in ps)
    out = [f"Step time on the RL workloads (`{target}`: real routers, vllm-sim fleets; rendered from `{source}`; "
           "mean ± 95% CI over seeds; ratios paired by seed, \"shorter\"/\"longer\" only where the ratio's "
           "interval excludes 1"
           + ("; a \"no burst hold\" row compares every router's run without the hold, verl_default's included"
              if nohold else "") + "):", "",
           "| workload | verl_default | kvc_aware | kvc_aware ÷ verl_default (paired by seed) | best peer (by mean) "
           "| hit rate kvc_aware / peer | TTFT p99 s kvc_aware / peer | kvc_aware ÷ best peer, step time (paired) |",
           "|---|---|---|---|---|---|---|---|"]
    for w, suffix in [(w, x) for x in ("", NOHOLD) for w in workloads]:
        if w not in shown:
            continue
        ps = [p for p in policies[w] if is_policy(p) and p.endswith(NOHOLD) == bool(suffix)]
        ours, verl = "kvc_aware" + suffix, "verl_default" + suffix
        peers = [p for p in ps if p not in (verl, "round_robin" + suffix) and not is_ours(p)]
        if ours not in ps or not peers:
            continue
        key = "engine_makespan_s"
        best_peer = min(peers, key=lambda p: stats[(w, p)][key].mean)
        vs = paired(arena_per_seed(arena["runs"], w), ours, best_peer, "step")
        verdict_cell = "n/a"
        if vs is not None:
            verdict_cell = vs.fmt(3) + {1: " (longer)", -1: " (shorter)", 0: " (tie)"}[_clear(vs)]
        base = stats[(w, verl)][key].fmt(1) if (w, verl) in stats else "n/a"
        k, b = stats[(w, ours)], stats[(w, best_peer)]
        ratio = paired_ratios(arena["runs"], w).get(ours)
        label = f"{w} (no burst hold)" if suffix else w
        dagger = " †" if queues_in_router(best_peer) else ""
        out.append(f"| {label} | {base} | {k[key].fmt(1)} | {ratio.fmt(3) if ratio else 'n/a'} | "
                   f"{best_peer} {b[key].fmt(1)} | "
                   f"{k['hit_rate'].fmt(3)} / {b['hit_rate'].fmt(3)} | "
                   f"{k['ttft_p99_s'].fmt(3)} / {b['ttft_p99_s'].fmt(3)}{dagger} | "
                   f"{verdict_cell} |")
    for suffix in ("", NOHOLD):
        losses = []
        ours = "kvc_aware" + suffix
        for w in workloads:
            if w not in shown or ours not in policies[w]:
                continue
            per_seed = arena_per_seed(arena["runs"], w)
            slow = slow_clients(arena["runs"], w)
            queued = queue_steps_not_comparable(arena["runs"], w)
            lost = []
            for p in policies[w]:
                if not is_policy(p) or p.endswith(NOHOLD) != bool(suffix) or is_ours(p) or p == "round_robin" + suffix:
                    continue
                vs = paired(per_seed, ours, p, "step")
                if vs is not None and _clear(vs) == 1:
                    why = ""
                    if p in slow:
                        why = (f" (not comparable: its clients' time outside the engines {slow[p].fmt(2)} × "
                               "verl_default's)")
                    elif p in queued:
                        why = " (not comparable: its step leaves out the wait in the router's queue)"
                    lost.append(f"{p} {vs.fmt(3)}{why}")
            losses.append(f"{w}: {', '.join(lost) if lost else 'none'}")
        if not losses:
            continue
        out += ["", "kvc_aware's step-time losses (kvc_aware ÷ the router, paired by seed, interval above 1; "
                + ("without the hold, kvc_aware+nohold ÷ each +nohold row" if suffix else "with the hold")
                + "): " + "; ".join(losses) + "."]
    admit = []
    for w in workloads:
        ps = [p for p in policies[w] if is_policy(p) and p.endswith(NOHOLD) and not is_ours(p)
              and p not in ("verl_default" + NOHOLD, "round_robin" + NOHOLD)]
        if w not in shown or ADMIT + NOHOLD not in policies[w] or not ps:
            continue
        per_seed = arena_per_seed(arena["runs"], w)
        best = min(ps, key=lambda p: stats[(w, p)]["engine_makespan_s"].mean)
        vs_verl = paired(per_seed, ADMIT + NOHOLD, "verl_default" + NOHOLD, "step")
        vs_best = paired(per_seed, ADMIT + NOHOLD, best, "step")
        vs_plain = paired(per_seed, ADMIT + NOHOLD, "kvc_aware" + NOHOLD, "step")
        ttft = paired(per_seed, ADMIT + NOHOLD, "verl_default" + NOHOLD, "ttft_acq_p99")
        cells = [f"÷ verl_default+nohold {vs_verl.fmt(3)}" if vs_verl else "",
                 f"÷ kvc_aware+nohold {vs_plain.fmt(3)}" if vs_plain else "",
                 f"÷ the best peer by mean, {best}, {vs_best.fmt(3)}" if vs_best else "",
                 f"TTFT p99 with the wait in admission ÷ verl_default+nohold's (its in-process acquire takes "
                 f"microseconds) {ttft.fmt(3)}" if ttft else ""]
        note = " (not comparable: an agent step leaves out the wait in the router)" if not w.startswith("grpo") else ""
        admit.append(f"{w}: " + ", ".join(c for c in cells if c) + note)
    if admit:
        out += ["", f"{ADMIT} (kvc_aware with its router-side admission, run without the hold only; step time, paired "
                "by seed): " + "; ".join(admit) + "."]
    speed = float((arena.get("config") or {}).get("speed") or 1.0)
    notes = [ln.replace("- routing", f"- {w}: routing", 1).replace("- not comparable", f"- {w}: not comparable", 1)
             for w in workloads if w in shown
             for ln in overhead_lines(arena["runs"], w, speed) + slow_client_lines(arena["runs"], w)
             + queue_step_lines(arena["runs"], w)]
    if any(queues_in_router(p) for ps in policies.values() for p in ps):
        notes.append("- " + TTFT_NOT_COMPARED)
    if notes:
        out += ["", "Caveat, from the same JSON:", *notes]
    return "\n".join(out)


# README's RL block: kvc_aware's paired step-time ratio to verl_default per
# setting of `make kvbench-rl`, at the library defaults (RL_DEFAULTS, the
# 373c8bc freeze: group_spread 0.1 behind its response-length gate and the
# measured-correlation gate, task_spread behind the within-task gate; every
# row identical to the 583ebbd, 81ebcf0, 8df1902 and 668a343 freezes',
# docs/results/rl-583ebbd/ (no within-task gate), rl-81ebcf0/ (a cap of 4
# servers, which 4 engines never reach), rl-8df1902/ and rl-668a343/ (no
# correlation gate)), without
# the group spread (RL_GS_OFF, the f591d2b freeze), at the defaults before
# task_spread (RL_PREV, the 520d43c freeze) and with group_spread 0.1 ungated
# (the 3965cf8 freeze, docs/results/rl-*.json).
RL_SETTINGS = (("rl-r0", "first epoch, ρ 0", None), ("rl-r5", "first epoch, ρ 0.5", None),
               ("rl-r8", "first epoch, ρ 0.8", None), ("rl-rec", "recurring prompts (epoch 2), ρ 0.6", 1),
               ("rl-agt", "agent (kvbench `agent`): task difficulty ρ 0.6, tools 1–60 s", None))
# docs/results/ subdirectories of `make kvbench-rl` runs: the library
# defaults, the defaults without group_spread, the defaults before
# task_spread, and task_spread 0.1 presumed multi-turn on every fresh router
# (the 41412f1 freeze).
RL_DEFAULTS = "rl-373c8bc"
# The same `make kvbench-rl` seeds (341-345) re-run at today's defaults (the a485bc6 freeze: the 2f74939
# freeze's routing and admission, on as verl's hook runs it since admission.enabled became auto, with
# session moves by in-flight context, which change the agent rows alone; its second kvc_aware row,
# kvc_aware+noadmit, is the routing alone; docs/results/rl-2f74939/ keeps the freeze before). Where
# the folder exists, README's RL table and the targets table's same-seed rows (against the 520d43c
# rows before issue 26) read it; the
# RL_DEFAULTS rows, and docs/results/rl-0c3bbe8/ (the 0c3bbe8 freeze), stay as their freezes' records.
RL_TODAY = ("rl-a485bc6", "a485bc6")
RL_GS_OFF = "rl-f591d2b"
RL_PREV = "rl-520d43c"
RL_TASK = "rl-41412f1"
# A candidate not kept: the token load counting a prompt its placed siblings
# share once (abcbba2; docs/rl-workloads.md says why it was reverted).
RL_CHARGE = "rl-abcbba2"
# kvbench on the arena's GRPO shape (`make kvbench-arena-shape`).
RL_ARENA_SHAPE = "kvbench-arena-shape"
RL_ARENA_SHAPE_TITLE = ("the arena's GRPO shape (128 prompts × 8, 4 engines × 16 slots, 3,072 KV blocks, responses "
                        "of median 192 up to 2,048)")


# kvbench's model of make demo's step (`make kvbench-demo-shape`), rendered into docs/demo.md.
DEMO_SHAPE = "kvbench-demo-shape"
# The freeze DEMO_SHAPE's runs record (kvc_frozen's commit).
DEMO_SHAPE_FREEZE = "f0be7ad"
DEMO_SHAPE_TITLE = ("the demo's GRPO shape (128 prompts × 8, 4 engines × 64 slots, 3,072 KV blocks, responses of "
                    "median 192)")


# Placement by predicted work and its true-length references (`make kvbench-work`).
RL_WORK = "kvbench-work"
# The held-out workloads at today's defaults on the published seeds
# (`make kvbench-heldout-defaults`), beside docs/results/kvbench-WORKLOAD.json
# (kvc_aware at the 520d43c freeze, before issue 26).
HELDOUT_NOW = "heldout-a485bc6"
# The same runs at earlier freezes, each gate's effect seed by seed: 668a343
# (before group_spread_min_corr) and 583ebbd (before task_spread_min_corr).
# The opt-in cap of 4 is in docs/results/heldout-81ebcf0/.
HELDOUT_EARLIER = (("heldout-668a343", "`group_spread_min_corr`"), ("heldout-583ebbd", "`task_spread_min_corr`"),
                   ("heldout-373c8bc", "`group_spread_min_ratio` read the rollout's mean prompt"),
                   ("heldout-8ef0422", "admission on by default (8ef0422's rows are 0c3bbe8's on these workloads)"),
                   ("heldout-2f74939", "`admission.enabled: auto` turned off for multi-turn rollouts"),
                   ("heldout-2c63719", "`session_move_tokens`"))
HELDOUT_WORKLOADS = ("grpo_sat", "agent_scale", "grpo", "grpo-spread", "agent", "agent_long", "agent_long_few",
                     "mooncake")
# (numerator, denominator) rows compared seed by seed under each table.
WORK_PAIRS = (("kvc_aware+work+lengths", "kvc_aware+lengths", "the work term, learnt lengths"),
              ("kvc_aware+work+truelen", "kvc_aware+work+lengths", "true lengths over learnt ones, same placement"),
              ("kvc_aware+admit+work+truelen", "kvc_aware+work+truelen", "admission's longest-first order on top"),
              ("longest_lane+truelen", "kvc_aware+work+truelen", "the longest isolated on one engine instead"),
              ("kvc_aware+admit+lengths", "kvc_aware", "admission ranked by learnt lengths (opt-in) over the defaults"),
              ("kvc_aware+admit+lengths", "kvc_aware+admit+truelen", "learnt lengths over true ones, same order"))


def render_work(docs_root: str) -> Optional[str]:
    """docs/rl-workloads.md's placement-by-predicted-work block: the tables of
    `make kvbench-work` (render_rl's), each followed by paired ratios of the
    rows that isolate the work term, the lengths it is given and the order."""
    from render_rl import SETTINGS
    from render_rl import render as render_rl_tables

    d = os.path.join(docs_root, "docs", "results", RL_WORK)
    if not glob.glob(os.path.join(d, "rl-*.json")):
        return None
    out = []
    for prefix, _, step in SETTINGS:
        if not glob.glob(os.path.join(d, f"{prefix}-*.json")):
            continue
        table = render_rl_tables(d, "docs/results/" + RL_WORK, only=prefix).rstrip("\n")
        runs = _kvb_runs(d, prefix, step)
        lines = []
        for a, b, what in WORK_PAIRS:
            ci = paired(runs, a, b, "step")
            if ci:
                verdict = {1: "longer", -1: "shorter", 0: "a tie"}[_clear(ci)]
                lines.append(f"- {a} ÷ {b} ({what}): {ci.fmt(3)}, {verdict}")
        out += [table, "", "Step time paired by seed:", *lines, ""]
    return "\n".join(out).rstrip("\n")


# kvc_aware+admit+lengths (admission and lengths on: the opt-in order that
# ranks every held request by its prompt's learnt length) in the arena, on
# the RL steps, without the burst hold (admission holds requests itself):
# docs/results/ARENA_ADMIT_LENGTHS, from the command in docs/rl-workloads.md.
ARENA_ADMIT_LENGTHS = "arena-admit-lengths-details.json"


def _paired_cell(per: Dict[Tuple[str, int], Dict[str, float]], a: str, b: str, m: str) -> str:
    """A's M over B's paired by seed, with the one rule's word (step time: shorter/longer;
    anything else: lower/higher), or a dash when they share no seed."""
    ci = paired(per, a, b, m)
    words = {1: "longer", -1: "shorter", 0: "a tie"} if m == "step" else {1: "higher", -1: "lower", 0: "a tie"}
    return f"{ci.fmt(3)} ({words[_clear(ci)]})" if ci else "–"


# kvc_aware's arena-rl rows before the f0be7ad re-run replaced them (the
# f591d2b freeze's), kept beside arena-rl-details.json for the pairing.
ARENA_RL_BEFORE = "arena-rl-kvc-f591d2b-details.json"
ARENA_RL_REFROZEN = ("kvc_aware", "kvc_aware+nohold", "kvc_aware+admit+nohold")
# The same for `make arena`'s kvc_aware rows (re-run at f0be7ad; the f591d2b
# rows kept beside arena-details.json).
ARENA_BEFORE = "arena-kvc-f591d2b-details.json"
# ... and the f591d2b freeze run again beside that re-run (host drift).
ARENA_BEFORE_RERUN = "arena-kvc-f591d2b-rerun-details.json"
ARENA_REFROZEN = ("kvc_aware", "kvc_aware+nohold")


def render_arena_refreeze(rl_doc: dict, before: dict, workloads: Sequence[str] = ARENA_RL_WORKLOADS,
                          now_file: str = "arena-rl-details.json", before_file: str = ARENA_RL_BEFORE,
                          policies: Sequence[str] = ARENA_RL_REFROZEN, rerun: Optional[dict] = None,
                          rerun_file: str = "") -> str:
    """docs/arena.md's block pairing kvc_aware's re-run arena rows (RL_DOC,
    from NOW_FILE) with the same rows before it (BEFORE, from BEFORE_FILE),
    seed by seed per workload: step time now over before, and the hit rate
    before and now. RERUN (from RERUN_FILE), the earlier freeze run again
    beside the re-run, adds now ÷ it: the freeze's own effect, without
    the host's drift between the two runs."""
    now_at, before_at = (d["config"]["kvc_frozen_commit"][:7] for d in (rl_doc, before))
    out = [f"kvc_aware's rows in `docs/results/{now_file}` (commit `{now_at}`'s freeze) over the same "
           f"rows at commit `{before_at}`'s "
           f"(`docs/results/{before_file}`), paired by seed, mean ± 95% CI; hit rate: mean over seeds, "
           "before → now."
           + (f" \"÷ {before_at} re-run\": over the `{before_at}` freeze run again beside the re-run, on the "
              f"same host in the same hour (`docs/results/{rerun_file}`)." if rerun is not None else ""), "",
           "| workload | " + " | ".join(f"{p}: step, now ÷ before"
                                        + (f" | ÷ {before_at} re-run" if rerun is not None else "")
                                        + " | hit rate" for p in policies) + " |",
           "|---|" + ("---|---|---|" if rerun is not None else "---|---|") * len(policies)]
    for w in workloads:
        now, then = arena_per_seed(rl_doc["runs"], w), arena_per_seed(before["runs"], w)
        again = arena_per_seed(rerun["runs"], w) if rerun is not None else {}
        per = {k: v for k, v in now.items() if k[0] in policies}
        per.update({(p + " before", seed): v for (p, seed), v in then.items() if p in policies})
        per.update({(p + " again", seed): v for (p, seed), v in again.items() if p in policies})
        cells = []
        for p in policies:
            hits = [[v["hit"] for (q, _), v in d.items() if q == p] for d in (then, now)]
            cells.append(_paired_cell(per, p, p + " before", "step"))
            if rerun is not None:
                cells.append(_paired_cell(per, p, p + " again", "step"))
            cells.append(" → ".join(f"{sum(h) / len(h):.1%}" if h else "–" for h in hits))
        out.append(f"| {w} | " + " | ".join(cells) + " |")
    return "\n".join(out)


# The arena-rl rho 0.8 step on five more fresh seeds (356-360: verl_default
# and kvc_aware with and without the hold, kvc_aware+admit without it, at
# the freeze of arena-rl-details.json), so the published five seeds' reading
# there can be checked on ten.
ARENA_RL_MORE_SEEDS = "arena-rl-rho08-356-360-details.json"
ARENA_RL_MORE_PAIRS = (("kvc_aware", "verl_default"), ("kvc_aware+nohold", "verl_default+nohold"),
                       ("kvc_aware+admit+nohold", "verl_default+nohold"),
                       ("kvc_aware+admit+nohold", "kvc_aware+nohold"))


def render_arena_more_seeds(rl_doc: dict, more: dict) -> str:
    """docs/arena.md's block reading the arena-rl ρ 0.8 pairs on the
    published seeds, on MORE's seeds and on both together: step time and
    TTFT p99 (admission's wait counted), paired by seed."""
    w = str(more["runs"][0]["row"]["workload"])
    at = {d["config"]["kvc_frozen_commit"][:7] for d in (rl_doc, more)}
    pub, ext = arena_per_seed(rl_doc["runs"], w), arena_per_seed(more["runs"], w)
    ranges = []
    for d in (pub, ext):
        seeds = sorted({sd for p, sd in d if p == ARENA_RL_MORE_PAIRS[0][0]})
        ranges.append(f"{seeds[0]}–{seeds[-1]}" if seeds else "–")
    both = {**pub, **ext}
    out = [f"The arena's `{w}` step (freeze `{'`, `'.join(sorted(at))}`) on the seeds "
           f"`docs/results/arena-rl-details.json` reports ({ranges[0]}), on five more never used before "
           f"({ranges[1]}, `docs/results/{ARENA_RL_MORE_SEEDS}`) and on all ten; paired by seed, mean ± 95% CI. "
           "TTFT p99 counts admission's wait.", "",
           f"| pair | step, {ranges[0]} | step, {ranges[1]} | step, all ten | TTFT p99, all ten |",
           "|---|---|---|---|---|"]
    for a, b in ARENA_RL_MORE_PAIRS:
        cells = [_paired_cell(d, a, b, "step") for d in (pub, ext, both)]
        cells.append(_paired_cell(both, a, b, "ttft_acq_p99"))
        out.append(f"| {a} ÷ {b} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def render_admit_lengths(docs_root: str) -> Optional[str]:
    """docs/rl-workloads.md's arena block for the opt-in longest-first order:
    per workload, its step time paired by seed with verl_default's, the
    defaults' and admission's without lengths, its TTFT p99 with the wait in
    admission counted, and verl_default's second run (the noise floor)."""
    path = os.path.join(docs_root, "docs", "results", ARENA_ADMIT_LENGTHS)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    runs = doc["runs"]
    at = str((doc.get("config") or {}).get("kvc_frozen_commit") or "")[:7]
    frozen = f"kvc_aware frozen at `{at}`" if at else "kvc_aware frozen as in every arena row"
    ours = OPT_IN_ORDER
    out = [f"Rendered from `docs/results/{ARENA_ADMIT_LENGTHS}` (the arena's Python path: "
           "`KVCAwareAdmissionBalancer` over vllm-sim HTTP servers, releases carrying request ids and output "
           f"counts as the verl hook sends them; no burst hold; {frozen}). Paired "
           "by seed, mean ± 95% CI; TTFT p99 counts the wait in admission (verl_default's acquire takes "
           "microseconds).", "",
           f"| workload | seeds | {ours} ÷ verl_default | ÷ kvc_aware | ÷ kvc_aware+admit "
           "| TTFT p99 with the wait ÷ verl_default's | hit rate, ours / verl_default's "
           "| longest-first picks per run, mean | verl_default's second run ÷ its first |",
           "|---|---|---|---|---|---|---|---|---|"]
    for w in dict.fromkeys(r["row"]["workload"] for r in runs):
        per = arena_per_seed(runs, w)
        rep = {r["row"]["seed"]: r["details"].get("engine_makespan_s", float("nan")) for r in runs
               if r["row"]["workload"] == w and r["row"]["policy"] == "verl_default" + REPEAT_SUFFIX}
        noise = mean_ci([v / per[("verl_default", sd)]["step"] for sd, v in rep.items()
                         if ("verl_default", sd) in per])
        seeds = sorted(sd for p, sd in per if p == ours)
        if not seeds:
            continue
        cells = [_paired_cell(per, ours, b, m) for b, m in (
            ("verl_default", "step"), ("kvc_aware", "step"), ("kvc_aware+admit", "step"),
            ("verl_default", "ttft_acq_p99"))]
        hit = (mean_ci([per[(ours, sd)]["hit"] for sd in seeds]),
               mean_ci([per[("verl_default", sd)]["hit"] for sd in seeds]))
        picks = [r["details"].get("longest_first_picks") for r in runs
                 if r["row"]["workload"] == w and r["row"]["policy"].partition("+nohold")[0] == ours]
        picks_cell = f"{sum(picks) / len(picks):.0f}" if picks and None not in picks else "–"
        out.append(f"| `{w}` | {seeds[0]}–{seeds[-1]} | " + " | ".join(cells)
                   + f" | {hit[0].mean:.2f} / {hit[1].mean:.2f} | {picks_cell} | {noise.fmt(3)} |")
    return "\n".join(out)


def render_admit_clock(docs_root: str) -> Optional[str]:
    """docs/arena.md's block on the clock admission's hold is read on: from
    the arena-admit-lengths run (verl_default in the same hour), per
    workload and admission order, TTFT p99 with the hold counted ÷
    verl_default's, the hold taken on the engines' clocks (what the tables
    report) and as wall time x speed (what they reported before), and the
    two holds' p99s over each other. None while the run lacks either."""
    path = os.path.join(docs_root, "docs", "results", ARENA_ADMIT_LENGTHS)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        runs = json.load(f)["runs"]
    admits = [r for r in runs if "admission_wait_s" in r["details"]]
    if not admits or any("wall_p99" not in r["details"]["admission_wait_s"] for r in admits):
        return None
    out = [f"Rendered from `docs/results/{ARENA_ADMIT_LENGTHS}` (each run records both): TTFT p99 with the wait "
           "in admission counted, ÷ verl_default's on the same seed (its acquire takes microseconds), mean ± 95% "
           "CI; the hold's p99 as wall time × speed over its p99 on the engines' clocks, mean over seeds.", "",
           "| workload | order | hold on the engines' clocks | hold as wall time × speed | hold p99, wall ÷ engines |",
           "|---|---|---|---|---|"]
    for w in dict.fromkeys(r["row"]["workload"] for r in runs):
        per = arena_per_seed(runs, w)
        for p in ("kvc_aware+admit", OPT_IN_ORDER):
            waits = [r["details"]["admission_wait_s"] for r in admits
                     if r["row"]["workload"] == w and r["row"]["policy"].partition(NOHOLD)[0] == p]
            if not waits:
                continue
            cells = [_paired_cell(per, p, "verl_default", m) for m in ("ttft_acq_p99", "ttft_acq_wall_p99")]
            stretch = mean_ci([x["wall_p99"] / x["p99"] for x in waits if x["p99"] > 0])
            out.append(f"| `{w}` | {p} | " + " | ".join(cells) + f" | {stretch.fmt(2)} |")
    return "\n".join(out)


# Admission's opt-in longest-first order on the held-out GRPO workloads
# (fresh prompts every step, independent lengths): `make
# kvbench-heldout-admit` at the commit that gated it on the measured
# correlation (lengths.min_corr), and the same command before the gate.
HELDOUT_ADMIT = "heldout-admit"
HELDOUT_ADMIT_BEFORE = ("heldout-admit-234dd89", "234dd89")
HELDOUT_ADMIT_WORKLOADS = ("grpo_sat", "grpo")
# Its grpo_sat command at the 0c3bbe8 freeze (admission splits a group in two
# until a correlation is measured) and at f0be7ad, before it.
HELDOUT_ADMIT_SPLIT = "heldout-admit-0c3bbe8"
HELDOUT_ADMIT_SPLIT_BEFORE = ("heldout-admit-f0be7ad", "f0be7ad")


def _now_and_before(folder: str, target: str, before: Tuple[str, str], what: str,
                    how: str = "kvc_aware frozen as in every kvbench row, admission and lengths on as named") -> str:
    """The opening of a block that pairs `make TARGET`'s runs in FOLDER with
    the same command at an earlier commit (BEFORE: its folder and commit)."""
    before_dir, before_commit = before
    return (f"Rendered from `docs/results/{folder}/` (`make {target}`) and the same command at "
            f"`{before_commit}`, before {what} (`docs/results/{before_dir}/`); {how}; ")


def _paired_settings(res: str, folder: str, before_dir: str,
                     settings: Sequence[Tuple[str, str, Optional[int]]]) -> Iterator[Tuple[str, str, PerSeed, PerSeed]]:
    """Each (prefix, label, step) setting run both in FOLDER and BEFORE_DIR:
    its prefix, label, the runs now, and now's runs with before's beside them
    as "ROW before"."""
    for prefix, label, step in settings:
        now = _kvb_runs(os.path.join(res, folder), prefix, step)
        then = _kvb_runs(os.path.join(res, before_dir), prefix, step)
        if now and then:
            per = dict(now)
            per.update({(p + " before", sd): v for (p, sd), v in then.items()})
            yield prefix, label, now, per


def render_heldout_admit(docs_root: str, folder: str = HELDOUT_ADMIT,
                         before: Tuple[str, str] = HELDOUT_ADMIT_BEFORE, what: str = "the gate") -> Optional[str]:
    """docs/rl-workloads.md's block for the opt-in order on the held-out GRPO
    workloads (FOLDER): admission alone and with lengths over verl_default,
    the two over each other, the same row before WHAT (BEFORE: its folder and
    commit; lengths.min_corr's gate by default), and WHAT's own effect (now
    over before), paired by seed."""
    res = os.path.join(docs_root, "docs", "results")
    before_dir, _ = before
    ours = OPT_IN_ORDER
    out = [_now_and_before(folder, "kvbench-heldout-admit", before, what)
           + "paired by seed, mean ± 95% CI.", "",
           f"| workload | seeds | kvc_aware+admit ÷ verl_default | {ours} ÷ verl_default | ÷ kvc_aware+admit "
           f"| before {what} ÷ verl_default | {what}'s effect (now ÷ before) | TTFT p99 ÷ verl_default "
           "| hit rate, ours / admission's |", "|---|---|---|---|---|---|---|---|---|"]
    rows = 0
    for w in HELDOUT_ADMIT_WORKLOADS:
        now_p = os.path.join(res, folder, f"kvbench-{w}.json")
        then_p = os.path.join(res, before_dir, f"kvbench-{w}.json")
        if not (os.path.isfile(now_p) and os.path.isfile(then_p)):
            continue
        now, then = _heldout_runs(now_p), _heldout_runs(then_p)
        per = dict(now)
        per.update({("before", sd): v for (p, sd), v in then.items() if p == ours})
        seeds = sorted(sd for p, sd in now if p == ours)
        cells = [_paired_cell(per, a, b, m) for a, b, m in (
            ("kvc_aware+admit", "verl_default", "step"), (ours, "verl_default", "step"),
            (ours, "kvc_aware+admit", "step"), ("before", "verl_default", "step"),
            (ours, "before", "step"), (ours, "verl_default", "ttft_p99"))]
        hit = (mean_ci([now[(ours, sd)]["hit"] for sd in seeds]),
               mean_ci([now[("kvc_aware+admit", sd)]["hit"] for sd in seeds]))
        out.append(f"| `{w}` | {seeds[0]}–{seeds[-1]} | " + " | ".join(cells)
                   + f" | {hit[0].fmt(1, 100)}% / {hit[1].fmt(1, 100)}% |")
        rows += 1
    return "\n".join(out) if rows else None


# Admission's group spread (kvc_aware's group_spread read by admission once a
# step's samples are measured alike): `make kvbench-admit-spread` at the commit
# that added it, and the same command before it.
ADMIT_SPREAD = "admit-spread"
ADMIT_SPREAD_BEFORE = ("admit-spread-edcef9e", "edcef9e")
# The same command at the 8ef0422 freeze (the gate on the rollout's mean prompt): its kvc_aware rows are
# today's defaults on seeds 421-425, which the targets table reads.
ADMIT_SPREAD_TODAY = "admit-spread-8ef0422"
# Admission's split in two before a correlation is measured (the admitted
# counterpart of group_spread_open_max_servers): the same command at the commit
# that made it, and at the f0be7ad freeze before it, on fresh seeds.
ADMIT_SPLIT = "admit-split"
ADMIT_SPLIT_BEFORE = ("admit-split-f0be7ad", "f0be7ad")
ADMIT_SPLIT_FREEZE = "0c3bbe8"
ADMIT_SPREAD_SETTINGS = (("rl-r0", "first epoch, ρ 0", None), ("rl-r5", "first epoch, ρ 0.5", None),
                         ("rl-r8", "first epoch, ρ 0.8", None),
                         ("rl-rec", "recurring prompts, epoch 2 (ρ 0.6, epoch correlation 0.8)", 1),
                         ("rl8-r5", "first epoch, ρ 0.5, 8 engines (512 prompts × 16)", None),
                         ("rl8-r8", "first epoch, ρ 0.8, 8 engines (512 prompts × 16)", None))


def render_admit_spread(docs_root: str, folder: str = ADMIT_SPREAD,
                        before: Tuple[str, str] = ADMIT_SPREAD_BEFORE) -> Optional[str]:
    """docs/rl-workloads.md's block for admission's group spread: per RL
    setting, the defaults, admission alone and admission with lengths over
    verl_default now (FOLDER) and before the change (BEFORE: its folder and
    commit), the change's own effect (now over before), and admission's TTFT
    p99, paired by seed."""
    res = os.path.join(docs_root, "docs", "results")
    before_dir, _ = before
    ours = OPT_IN_ORDER
    out = [_now_and_before(folder, "kvbench-admit-spread", before, "the change")
           + "each cell a paired ratio by seed, mean ± 95% CI.", "",
           "| setting | seeds | kvc_aware ÷ verl_default | kvc_aware+admit ÷ verl_default | before | "
           f"admission's change (now ÷ before) | {ours} ÷ verl_default | before | its change (now ÷ before) "
           "| kvc_aware+admit's TTFT p99 (from arrival: the wait in admission counted) ÷ verl_default's |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    rows = 0
    for _, label, now, per in _paired_settings(res, folder, before_dir, ADMIT_SPREAD_SETTINGS):
        seeds = sorted(sd for p, sd in now if p == ours)
        cells = [_paired_cell(per, a, b, m) for a, b, m in (
            ("kvc_aware", "verl_default", "step"),
            ("kvc_aware+admit", "verl_default", "step"), ("kvc_aware+admit before", "verl_default before", "step"),
            ("kvc_aware+admit", "kvc_aware+admit before", "step"),
            (ours, "verl_default", "step"), (ours + " before", "verl_default before", "step"),
            (ours, ours + " before", "step"), ("kvc_aware+admit", "verl_default", "ttft_p99"))]
        out.append(f"| {label} | {seeds[0]}–{seeds[-1]} | " + " | ".join(cells) + " |")
        rows += 1
    return "\n".join(out) if rows else None


MEAN_PROMPT = "mean-prompt"
MEAN_PROMPT_BEFORE = ("mean-prompt-662c078", "662c078")
MEAN_PROMPT_SETTINGS = (("grpo-r0", "held-out `grpo` shape (64 prompts × 16, 8 engines, not oversubscribed), ρ 0",
                         None),
                        ("grpo-r5", "held-out `grpo` shape, ρ 0.5", None),
                        ("grpo-r8", "held-out `grpo` shape, ρ 0.8", None),
                        ("rl-r0", "first epoch, ρ 0", None), ("rl-r5", "first epoch, ρ 0.5", None),
                        ("rl-r8", "first epoch, ρ 0.8", None),
                        ("rl-rec", "recurring prompts, epoch 2 (ρ 0.6, epoch correlation 0.8)", 1),
                        ("rl8-r5", "first epoch, ρ 0.5, 8 engines (512 prompts × 16)", None),
                        ("rl8-r8", "first epoch, ρ 0.8, 8 engines (512 prompts × 16)", None))


def render_mean_prompt(docs_root: str) -> Optional[str]:
    """docs/rl-workloads.md's block for group_spread_min_ratio reading the
    rollout's mean prompt: per setting, kvc_aware over verl_default now and
    before, the change's own effect on step time and TTFT p99, the hit rate,
    and on the held-out grpo shape kvc_aware over each peer, paired by seed."""
    res = os.path.join(docs_root, "docs", "results")
    before_dir, _ = MEAN_PROMPT_BEFORE
    out = [_now_and_before(MEAN_PROMPT, "kvbench-mean-prompt", MEAN_PROMPT_BEFORE, "the change",
                           "kvc_aware at the library defaults, peers at their launcher defaults")
           + "each cell a paired ratio by seed, mean ± 95% CI (the hit rate: mean over seeds).", "",
           "| setting | seeds | kvc_aware ÷ verl_default | before | the change (now ÷ before): step | TTFT p99 "
           "| hit rate, before → now | worst seed, before → now |", "|---|---|---|---|---|---|---|---|"]
    peers: List[str] = []
    rows = 0
    for prefix, label, now, per in _paired_settings(res, MEAN_PROMPT, before_dir, MEAN_PROMPT_SETTINGS):
        seeds = sorted(sd for p, sd in now if p == "kvc_aware")
        cells = [_paired_cell(per, a, b, m) for a, b, m in (
            ("kvc_aware", "verl_default", "step"), ("kvc_aware before", "verl_default before", "step"),
            ("kvc_aware", "kvc_aware before", "step"), ("kvc_aware", "kvc_aware before", "ttft_p99"))]
        hit = [sum(per[(p, sd)]["hit"] for sd in seeds) / len(seeds) for p in ("kvc_aware before", "kvc_aware")]
        worst = [max(per[(p, sd)]["step"] / per[(b, sd)]["step"] for sd in seeds)
                 for p, b in (("kvc_aware before", "verl_default before"), ("kvc_aware", "verl_default"))]
        out.append(f"| {label} | {seeds[0]}–{seeds[-1]} | " + " | ".join(cells)
                   + f" | {100 * hit[0]:.1f}% → {100 * hit[1]:.1f}% | {worst[0]:.3f} → {worst[1]:.3f} |")
        rows += 1
        if prefix.startswith("grpo-"):
            others = [p for p in dict.fromkeys(p for p, _ in now) if p not in ("kvc_aware", "verl_default")]
            peers.append(f"- {label}: " + "; ".join(
                f"{p} ÷ verl_default {_paired_cell(per, p, 'verl_default', 'step')}, kvc_aware ÷ {p} "
                f"{_paired_cell(per, 'kvc_aware', p, 'step')}" for p in others))
    if not rows:
        return None
    if peers:
        out += ["", "The peers on the held-out `grpo` shape (the same runs; step time, paired by seed):", *peers]
    return "\n".join(out)


# The group spread's openings on the demo's shape, each run as `make
# kvbench-demo-shape` and paired seed by seed with a run of the defaults
# before it: the 9c839a2 freeze (group_spread_open_corr 0.25 on) and the
# df6a711 freeze with group_spread_open_ratio 1 (the run's own
# frozen-kvc-aware.json), each against the df6a711 defaults on seeds 461-470;
# and the f0be7ad freeze, which made group_spread_open_ratio 1 the default,
# against the df6a711 defaults on its own fresh seeds 471-480.
OPEN_CORR = "kvbench-demo-shape-open-corr-9c839a2"
OPEN_RATIO = "kvbench-demo-shape-open-ratio"
DEMO_SHAPE_BEFORE = "kvbench-demo-shape-df6a711"  # the df6a711 defaults, seeds 461-470
DEMO_SHAPE_BEFORE_FRESH = "kvbench-demo-shape-df6a711-471-480"  # the same on DEMO_SHAPE's seeds
DEMO_SHAPE_SETTINGS = (("rl-r0", "first epoch, ρ 0", None), ("rl-r5", "first epoch, ρ 0.5", None),
                       ("rl-r8", "first epoch, ρ 0.8", None),
                       ("rl-rec", "recurring prompts (epoch 2), ρ 0.6, epoch correlation 0.8", 1))


def render_opening(docs_root: str, folder: str, base: str, what: str, base_what: str, note: str) -> Optional[str]:
    """docs/rl-workloads.md's block for one opening of the group spread on
    the demo's shape: per setting, kvc_aware in FOLDER over kvc_aware in BASE,
    paired by seed (step time, TTFT p99, the worst and best seed), each over
    verl_default, and FOLDER's over vllm-router's sticky_least_loaded and
    Dynamo's router queue."""
    res = os.path.join(docs_root, "docs", "results")
    sticky, queue = "vllm_router_sticky_least_loaded", "dynamo_cost+queue"
    out = [f"Rendered from `docs/results/{folder}/` ({what}) and `docs/results/{base}/` ({base_what}), both "
           "`make kvbench-demo-shape` on the same fresh seeds; each cell a paired ratio by seed, mean ± 95% CI. "
           + note, "",
           "| setting | seeds | with it ÷ without: step | TTFT p99 | worst, best seed | with it ÷ verl_default "
           "| without ÷ verl_default | with it ÷ sticky_least_loaded | with it ÷ dynamo_cost+queue |",
           "|---|---|---|---|---|---|---|---|---|"]
    rows = 0
    for _, label, now, per in _paired_settings(res, folder, base, DEMO_SHAPE_SETTINGS):
        seeds = sorted(sd for p, sd in now if p == "kvc_aware")
        each = [per[("kvc_aware", sd)]["step"] / per[("kvc_aware before", sd)]["step"] for sd in seeds]
        cells = [_paired_cell(per, "kvc_aware", "kvc_aware before", "step"),
                 _paired_cell(per, "kvc_aware", "kvc_aware before", "ttft_p99"),
                 f"{max(each):.3f}, {min(each):.3f}",
                 _paired_cell(per, "kvc_aware", "verl_default", "step"),
                 _paired_cell(per, "kvc_aware before", "verl_default before", "step"),
                 _paired_cell(per, "kvc_aware", sticky, "step"),
                 _paired_cell(per, "kvc_aware", queue, "step")]
        out.append(f"| {label} | {seeds[0]}–{seeds[-1]} | " + " | ".join(cells) + " |")
        rows += 1
    return "\n".join(out) if rows else None


# Each opening's block: (block, folder, base, what the run is, what the base is, a note on its rows).
OPENINGS = (("rl-open-corr", OPEN_CORR, DEMO_SHAPE_BEFORE, "the 9c839a2 freeze: `group_spread_open_corr` 0.25, "
             "`group_spread_open_max_servers` 2", "the df6a711 defaults",
             "A first epoch measures nothing before it places, so its rows must be identical."),
            ("rl-open-ratio", OPEN_RATIO, DEMO_SHAPE_BEFORE, "the df6a711 freeze with `group_spread_open_ratio` 1",
             "the df6a711 defaults",
             "A step after a measured one closes the band where its samples' lengths are independent "
             "(`group_spread_min_corr`)."),
            ("rl-open-ratio-default", DEMO_SHAPE, DEMO_SHAPE_BEFORE_FRESH,
             "the f0be7ad defaults: `group_spread_open_ratio` 1", "the df6a711 defaults, `group_spread_open_ratio` off",
             "The seeds were never run before f0be7ad was frozen."))


# Issue 26's "Done when" targets, each against the committed runs that measure it.
TARGET_PEERS = ("sglang_cache_aware", "dynamo_cost+ttl", "llmd_precise", "vllm_router_sticky_least_loaded")
# The opt-in configuration that ranks admission by learnt lengths (admission
# and lengths on); the targets table gives it one row of its own.
OPT_IN_ORDER = "kvc_aware+admit+lengths"
TRUE_LENGTH_REFS = ("kvc_aware+work+truelen", "kvc_aware+admit+truelen", "kvc_aware+admit+work+truelen",
                    "longest_lane+truelen")

# (row, seed) -> {"step": s, "ttft_p99": s}: arena_per_seed's shape, so paired() compares them.
PerSeed = Dict[Tuple[str, int], Dict[str, float]]


def _kvb_runs(d: str, prefix: str, step: Optional[int]) -> PerSeed:
    """`make kvbench-rl`-style files D/PREFIX-SEED.json: every row's step time
    (STEP: that step of a multi-step run) and TTFT p99 by seed."""
    out: PerSeed = {}
    for path in sorted(glob.glob(os.path.join(d, f"{prefix}-*.json"))):
        seed = int(os.path.basename(path)[len(prefix) + 1:-5])
        with open(path, encoding="utf-8") as f:
            rep = json.load(f)
        for p, r in rep["policies"].items():
            mk = r["makespan_s"] if step is None else rep["makespan_steps_s"][p][step]
            out[(p, seed)] = {"step": mk, "ttft_p99": r["ttft_p99_s"], "hit": r.get("hit_rate", math.nan)}
    return out


def _heldout_runs(path: str) -> PerSeed:
    """A `kvbench --heldout` file: each row by name (a tuned row as "NAME (tuned)")."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    out: PerSeed = {}
    for r in doc["rows"]:
        name = r["policy"] + (" (tuned)" if r.get("tuned") else "")
        for x in r["per_seed"]:
            out[(name, x["seed"])] = {"step": x["makespan_s"], "ttft_p99": x["ttft_p99_s"], "hit": x["hit_rate"]}
    return out


def _rows(runs: PerSeed) -> set:
    return {p for p, _ in runs}


def _at_best(runs: PerSeed, peer: str) -> Optional[str]:
    """The peer's row with the shorter mean step time: launcher defaults or tuned."""
    def mean_step(row: str) -> float:
        steps = [v["step"] for (p, _), v in runs.items() if p == row]
        return sum(steps) / len(steps)

    rows = [r for r in (peer, peer + " (tuned)") if r in _rows(runs)]
    return min(rows, key=mean_step) if rows else None


def _at_most(ci: MeanCI, bound: float) -> str:
    """Verdict on "ratio <= bound": met with its whole interval, by mean only, or missed by how much."""
    if ci.hi <= bound:
        return "**met** (interval below)"
    if ci.mean <= bound:
        return "met by mean only"
    return f"**missed** by {ci.mean - bound:.3f}" + (" (interval above)" if ci.lo > bound else
                                                      " by mean only (interval reaches the bound)")


def _with_before(now: PerSeed, then: PerSeed) -> PerSeed:
    """NOW's kvc_aware and verl_default rows, and THEN's kvc_aware as "before"."""
    out = {(p, seed): v for (p, seed), v in now.items() if p in ("kvc_aware", "verl_default")}
    out.update({("before", seed): v for (p, seed), v in then.items() if p == "kvc_aware"})
    return out


def _ratio_word(ci: MeanCI) -> str:
    """A paired ratio with the one rule's word: shorter/longer only where its interval excludes 1."""
    return ci.fmt(3) + (" (shorter)" if ci.hi < 1 else " (longer)" if ci.lo > 1 else " (tie)")


def _same_rows(a: PerSeed, b: PerSeed, policy: str) -> bool:
    """POLICY's figures are equal, seed for seed, in both runs (and present)."""
    ra = {seed: v for (p, seed), v in a.items() if p == policy}
    return bool(ra) and ra == {seed: v for (p, seed), v in b.items() if p == policy}


def render_change_effect(d: str, now_path: str) -> str:
    """The change's own effect where a run's folder holds kvc_aware at the freeze before it on the same seeds
    (D/before-FREEZE.json): kvc_aware now ÷ then, paired by seed (step time, TTFT p99, hit rate); "" without."""
    out = ""
    for before in sorted(glob.glob(os.path.join(d, "before-*.json"))):
        freeze = os.path.basename(before)[len("before-"):-len(".json")]
        now, then = _heldout_runs(now_path), _heldout_runs(before)
        runs = _with_before(now, then)
        cis = [paired(runs, "kvc_aware", "before", m) for m in ("step", "ttft_p99", "hit")]
        if any(ci is None for ci in cis):
            continue
        same = _same_rows(now, then, "verl_default")
        out += (f"\n\nThe change's own effect: kvc_aware here ÷ kvc_aware at the {freeze} freeze on the same seeds "
                f"(`docs/results/{os.path.basename(d)}/{os.path.basename(before)}`; verl_default's rows "
                f"{'identical' if same else '**not identical**'}), paired by seed: step time {_ratio_word(cis[0])}, "
                f"TTFT p99 {cis[1].fmt(3)}, hit rate {cis[2].fmt(3)}.")
    return out


def render_targets(docs_root: str) -> Optional[str]:
    """docs/rl-workloads.md's summary of issue 26's targets: each measured
    seed by seed in the committed runs that hold it (paired ratios, mean ±
    95% CI, Student's t), with a verdict."""
    res = os.path.join(docs_root, "docs", "results")
    cur, prev, work = (os.path.join(res, x) for x in (RL_DEFAULTS, RL_PREV, RL_WORK))
    # Every committed `make kvbench-rl-tuned` run (the first is required): (source, runs by key, files by key).
    tuned_runs: List[Tuple[str, Dict[str, PerSeed], Dict[str, str]]] = []
    for sub, _ in RL_TUNED_RUNS:
        files = {k: os.path.join(res, sub, f"heldout-rl-{k}.json") for k in RL_TUNED}
        if all(os.path.isfile(p) for p in files.values()):
            tuned_runs.append((f"`{sub}/` (`make kvbench-rl-tuned`)", {k: _heldout_runs(p) for k, p in files.items()},
                               files))
        elif sub == RL_TUNED_RUNS[0][0]:
            return None
    if not (glob.glob(os.path.join(cur, "rl-r5-*.json")) and glob.glob(os.path.join(work, "rl-rec-*.json"))):
        return None
    src_t, t, _ = tuned_runs[0]

    def seeds(runs: PerSeed) -> str:
        s = sorted(seed for p, seed in runs if p == "verl_default")
        return f"{s[0]}–{s[-1]}"

    def vs(runs: PerSeed, a: str, b: str, metric: str = "step") -> MeanCI:
        ci = paired(runs, a, b, metric)
        assert ci is not None, (a, b)  # every committed run holds both rows
        return ci

    src_cur = f"`{RL_DEFAULTS}/` (`make kvbench-rl`)"
    today_dir = os.path.join(res, RL_TODAY[0])
    has_today = bool(glob.glob(os.path.join(today_dir, "rl-r0-*.json")))
    # The same seeds at today's defaults where they were re-run, else the RL_DEFAULTS freeze's.
    same_dir, same_src = (today_dir, f"`{RL_TODAY[0]}/` (`make kvbench-rl`)") if has_today else (cur, src_cur)
    src_w = f"`{RL_WORK}/` (`make kvbench-work`)"
    mp = os.path.join(res, MEAN_PROMPT)
    src_mp = f"`{MEAN_PROMPT}/` (`make kvbench-mean-prompt`)"
    # Today's defaults on more fresh seeds: the kvc_aware rows of `make kvbench-admit-spread` re-run at the
    # same freeze (seeds no tuning saw).
    today = [(mp, src_mp),
             (os.path.join(res, ADMIT_SPREAD_TODAY), f"`{ADMIT_SPREAD_TODAY}/` (`make kvbench-admit-spread`)"),
             (os.path.join(res, ADMIT_SPLIT), f"`{ADMIT_SPLIT}/` (`make kvbench-admit-spread`)")]
    out = ["Rendered from the committed runs named in each row (under `docs/results/`); kvc_aware at the library "
           f"defaults in every row but the ones marked opt-in (frozen at `{RL_DEFAULTS[3:]}`; the `{MEAN_PROMPT}/`, "
           f"`{ADMIT_SPREAD_TODAY}/` and `{HELDOUT_NOW}/` rows at `{HELDOUT_NOW[8:]}`, whose "
           "response-length gate "
           f"reads the rollout's mean prompt; the `{DEMO_SHAPE}/` rows at `{DEMO_SHAPE_FREEZE}`, which splits a "
           "single-turn rollout's groups in two where responses may outgrow its mean prompt, "
           f"`group_spread_open_ratio`; the `{ADMIT_SPLIT}/` rows at `{ADMIT_SPLIT_FREEZE}`, whose defaults are "
           f"`{ADMIT_SPLIT_BEFORE[1]}`'s, admission alone changed"
           + "".join(f"; the `{sub}/` rows at `{at}`"
                     for sub, at in (*RL_TUNED_RUNS[1:], *RL_TUNED_AGENT_RUNS, RL_TODAY)
                     if os.path.isdir(os.path.join(res, sub))) + "); each cell is "
           "kvc_aware's ratio, paired by seed, mean ± 95% CI. \"Met by mean only\" means the interval still reaches "
           "past the bound.", "",
           "| target | setting | runs (seeds) | kvc_aware, paired | verdict |", "|---|---|---|---|---|"]

    def row(target: str, setting: str, src: str, runs: PerSeed, ci: MeanCI, verdict: str) -> None:
        out.append(f"| {target} | {setting} | {src} ({seeds(runs)}) | {ci.fmt(3)} | {verdict} |")

    for rho, key in (("0.5", "r5"), ("0.8", "r8")):
        setting = f"first epoch, ρ {rho}"
        runs = [(src_cur, _kvb_runs(cur, f"rl-{key}", None))] + [(src, tr[key]) for src, tr, _ in tuned_runs]
        if has_today:
            runs.append((same_src, _kvb_runs(today_dir, f"rl-{key}", None)))
        if glob.glob(os.path.join(work, f"rl-{key}-*.json")):
            runs.append((src_w, _kvb_runs(work, f"rl-{key}", None)))
        runs += [(src, _kvb_runs(d, f"rl-{key}", None)) for d, src in today
                 if glob.glob(os.path.join(d, f"rl-{key}-*.json"))]
        for src, r in runs:
            ci = vs(r, "kvc_aware", "verl_default")
            row("≤ 0.98 × verl_default", setting, src, r, ci, _at_most(ci, 0.98))
        for d, src in today:
            if glob.glob(os.path.join(d, f"rl8-{key}-*.json")):
                r = _kvb_runs(d, f"rl8-{key}", None)
                ci = vs(r, "kvc_aware", "verl_default")
                row("≤ 0.98 × verl_default", setting + ", full size (512 prompts × 16, 8 engines)", src, r, ci,
                    _at_most(ci, 0.98))
        for src, tr, _ in tuned_runs:
            for peer in TARGET_PEERS:
                best = _at_best(tr[key], peer)
                if best:
                    ci = vs(tr[key], "kvc_aware", best)
                    row(f"≤ {best}", setting, src, tr[key], ci, _at_most(ci, 1.0))
    r0, r0_prev = _kvb_runs(same_dir, "rl-r0", None), _kvb_runs(prev, "rl-r0", None)
    both = _with_before(r0, r0_prev)
    ci = vs(both, "kvc_aware", "before")
    row(f"no worse than before issue 26 (÷ kvc_aware at `{RL_PREV[3:]}`)", "first epoch, ρ 0", f"`{RL_PREV}/`, "
        + same_src, both, ci, "**missed**: longer (interval above)" if ci.lo > 1 else
        ("not clearly worse, mean above 1" if ci.mean > 1 else "**met**"))
    rec = [(src_cur, _kvb_runs(cur, "rl-rec", 1)), (src_t, t["rec"]), (src_w, _kvb_runs(work, "rl-rec", 1))]
    rec_rows = rec + [(src, _kvb_runs(d, "rl-rec", 1)) for d, src in today
                      if glob.glob(os.path.join(d, "rl-rec-*.json"))]
    rec_rows += [(src, tr["rec"]) for src, tr, _ in tuned_runs[1:]]
    if has_today:
        rec_rows.append((same_src, _kvb_runs(today_dir, "rl-rec", 1)))
    for src, r in rec_rows:
        ci = vs(r, "kvc_aware", "verl_default")
        row("≤ 0.90 × verl_default", "recurring prompts, epoch 2", src, r, ci, _at_most(ci, 0.90))

    def ahead_of_peers(target: str, setting: str, src: str, runs: PerSeed) -> None:
        for peer in sorted({x.removesuffix(" (tuned)") for x in _rows(runs)} - {"verl_default"}):
            if peer.startswith("kvc_aware"):
                continue
            best = _at_best(runs, peer)
            ci = vs(runs, "kvc_aware", best)
            row(f"{target} {best}", setting, src, runs, ci, _at_most(ci, 1.0))

    for src, tr, _ in tuned_runs:
        ahead_of_peers("ahead of", "recurring prompts, epoch 2", src, tr["rec"])
    # The demo's shape (`make kvbench-demo-shape`): the same step-time targets on make demo's fleet and step.
    demo_dir = os.path.join(res, DEMO_SHAPE)
    src_d = f"`{DEMO_SHAPE}/` (`make kvbench-demo-shape`)"
    demo_rec = _kvb_runs(demo_dir, "rl-rec", 1) if glob.glob(os.path.join(demo_dir, "rl-rec-*.json")) else None
    demo_setting = "the demo's shape (128 prompts × 8, 4 engines × 64 slots)"
    for rho, key in (("0.5", "r5"), ("0.8", "r8")):
        if glob.glob(os.path.join(demo_dir, f"rl-{key}-*.json")):
            r = _kvb_runs(demo_dir, f"rl-{key}", None)
            ci = vs(r, "kvc_aware", "verl_default")
            row("≤ 0.98 × verl_default", f"first epoch, ρ {rho}, {demo_setting}", src_d, r, ci, _at_most(ci, 0.98))
    if demo_rec:
        ci = vs(demo_rec, "kvc_aware", "verl_default")
        row("≤ 0.90 × verl_default", f"recurring prompts, epoch 2, {demo_setting}", src_d, demo_rec, ci,
            _at_most(ci, 0.90))

    def way(ci: MeanCI, who: str, refs: Dict[str, MeanCI], ref: str) -> str:
        if refs[ref].hi >= 1:
            return "no gap to close: the best reference is not clearly shorter than verl_default"
        share = (1 - ci.mean) / (1 - refs[ref].mean)
        return ("**met**" if share >= 0.6 else "**missed**") + (
            f": {100 * share:.0f}% of the way" if share >= 0 else
            f": none of the way ({who}'s mean is {ci.mean - 1:+.1%} against verl_default's, the reference's "
            f"{refs[ref].mean - 1:+.1%})")

    for w, src, where in ((rec[2][1], src_w, "recurring prompts, epoch 2"),
                          (demo_rec, src_d, f"recurring prompts, epoch 2, {demo_setting}")):
        if not w:
            continue
        refs = {x: vs(w, x, "verl_default") for x in TRUE_LENGTH_REFS if x in _rows(w)}
        ref = min(refs, key=lambda x: refs[x].mean)
        kvc = vs(w, "kvc_aware", "verl_default")
        out.append(f"| ≥ 60% of the way to the true-length reference | {where} | {src} ({seeds(w)}) "
                   f"| {kvc.fmt(3)} × verl_default; best reference {ref} {refs[ref].fmt(3)} | "
                   f"{way(kvc, 'kvc_aware', refs, ref)} |")
        if OPT_IN_ORDER in _rows(w):
            opt = vs(w, OPT_IN_ORDER, "verl_default")
            out.append(f"| ≥ 60% of the way to the true-length reference (**opt-in**, not the defaults: `lengths` "
                       f"on with admission, `{OPT_IN_ORDER}`) | {where} | {src} ({seeds(w)}) "
                       f"| {opt.fmt(3)} × verl_default; best reference {ref} {refs[ref].fmt(3)} | "
                       f"{way(opt, OPT_IN_ORDER, refs, ref)} |")
    agent_runs: List[Tuple[str, PerSeed]] = []
    for sub, _ in RL_TUNED_AGENT_RUNS:
        p = os.path.join(res, sub, "heldout-rl-agt.json")
        if os.path.isfile(p):
            agent_runs.append((f"`{sub}/` (`make kvbench-rl-tuned-agent`)", _heldout_runs(p)))
    for src, tr, _ in tuned_runs:
        ahead_of_peers("≤", "agent, task difficulty ρ 0.6", src, tr["agt"])
    for src, r in agent_runs:
        ahead_of_peers("≤", "agent, task difficulty ρ 0.6", src, r)
    ttft_rows = [(src, key, tr[key]) for src, tr, _ in tuned_runs for key in RL_TUNED]
    ttft_rows += [(src, "agt", r) for src, r in agent_runs]
    for src, key, r in ttft_rows:
        setting = {"r0": "first epoch, ρ 0", "r5": "first epoch, ρ 0.5", "r8": "first epoch, ρ 0.8",
                   "rec": "recurring prompts, epoch 2", "agt": "agent"}[key]
        ci = vs(r, "kvc_aware", "verl_default", "ttft_p99")
        row("TTFT p99 no worse than verl_default's", setting, src, r, ci,
            "**regression** (interval above 1)" if ci.lo > 1 else "**met**")
    # Against kvc_aware before issue 26 (the 520d43c freeze), same seeds.
    before_rows: List[Tuple[str, str, PerSeed]] = []
    for key, setting in (("r0", "first epoch, ρ 0"), ("r5", "first epoch, ρ 0.5"), ("r8", "first epoch, ρ 0.8"),
                         ("rec", "recurring prompts, epoch 2"), ("agt", "agent, task difficulty ρ 0.6")):
        step = 1 if key == "rec" else None
        now, then = _kvb_runs(same_dir, f"rl-{key}", step), _kvb_runs(prev, f"rl-{key}", step)
        if now and then:
            before_rows.append((setting, f"`{RL_PREV}/`, {same_src}", _with_before(now, then)))
    # workload: (today's runs, the published 520d43c ones, each earlier freeze's or None)
    held: Dict[str, Tuple[PerSeed, PerSeed, List[Optional[PerSeed]]]] = {}
    for w in HELDOUT_WORKLOADS:
        a, b = os.path.join(res, HELDOUT_NOW, f"kvbench-{w}.json"), os.path.join(res, f"kvbench-{w}.json")
        gs = [os.path.join(res, d, f"kvbench-{w}.json") for d, _ in HELDOUT_EARLIER]
        if os.path.isfile(a) and os.path.isfile(b):
            earlier = [_heldout_runs(g) if os.path.isfile(g) else None for g in gs]
            held[w] = (_heldout_runs(a), _heldout_runs(b), earlier)
            src = f"`{HELDOUT_NOW}/`, `kvbench-{w}.json` (`make kvbench-heldout-defaults`)"
            before_rows.append((f"held-out `{w}`", src, _with_before(*held[w][:2])))
    for setting, src, runs in before_rows:
        ci = vs(runs, "kvc_aware", "before", "ttft_p99")
        row(f"TTFT p99 no worse than before issue 26 (÷ kvc_aware at `{RL_PREV[3:]}`)", setting, src, runs, ci,
            "**regression** (interval above 1)" if ci.lo > 1 else
            ("not clearly worse, mean above 1" if ci.mean > 1 else "**met**"))
    if held:
        out += ["", "The workloads that existed before issue 26 (docs/kvbench.md's held-out set, seeds 311–320), "
                f"kvc_aware at today's defaults (`{HELDOUT_NOW[8:]}`) paired seed by seed with its rows at "
                f"`{RL_PREV[3:]}` (the published tables); ratios today ÷ before, mean ± 95% CI. The last "
                "columns pair today's rows with the same runs at earlier freezes, each before one change to the gates: "
                + "; ".join(f"`{d[8:]}` (`docs/results/{d}/`), before {gate}" for d, gate in HELDOUT_EARLIER)
                + ". Each pair of columns is today's rows ÷ that freeze's, so the last pair is the last change's "
                "own effect.", "",
                "| workload | step time | TTFT p99 | hit rate | today's step ÷ verl_default's "
                "| verl_default's rows identical | "
                + " | ".join(f"step ÷ `{d[8:]}` | TTFT p99 ÷ `{d[8:]}`" for d, _ in HELDOUT_EARLIER) + " |",
                "|---|---|---|---|---|---|" + "---|---|" * len(HELDOUT_EARLIER)]
        for w, (now, then, earlier) in held.items():
            runs = _with_before(now, then)
            same = _same_rows(now, then, "verl_default")
            cells = [vs(runs, "kvc_aware", "before", m).fmt(3) for m in ("step", "ttft_p99", "hit")]
            cells += [_ratio_word(vs(runs, "kvc_aware", "verl_default")), "yes" if same else "**no**"]
            for e in earlier:
                if e is None:
                    cells += ["–", "–"]
                else:
                    g = _with_before(now, e)
                    cells += [vs(g, "kvc_aware", "before", m).fmt(3) for m in ("step", "ttft_p99")]
            out.append(f"| `{w}` | " + " | ".join(cells) + " |")
    # The room each setting leaves, from the newest tuned run (the most seeds, today's defaults).
    src_room, _, tuned = tuned_runs[-1]
    out += ["", "What the engine model leaves a router on each setting (kvbench's own references, computed seed by "
            f"seed in the same {src_room} runs, mean ± 95% CI): the step a replay of verl_default's placement saves "
            "when every prompt is served as if cached (all that prefix caching could buy without moving a request), "
            "and how far the shortest row stays above kvbench's work lower bound (every engine's work spread evenly, "
            "or the longest request chain alone; no router reaches it).", "",
            "| setting | verl_default's step shortened by caching every prompt | shortest row ÷ work lower bound |",
            "|---|---|---|"]
    for key, setting in (("r0", "first epoch, ρ 0"), ("r5", "first epoch, ρ 0.5"), ("r8", "first epoch, ρ 0.8"),
                         ("rec", "recurring prompts, epoch 2"), ("agt", "agent, task difficulty ρ 0.6")):
        with open(tuned[key], encoding="utf-8") as f:
            rep = json.load(f)
        gain, best = (MeanCI(rep[k]["Mean"], rep[k]["CI95"], rep[k]["N"], rep[k]["SD"])
                      for k in ("achievable_gain_over_verl", "best_over_lower_bound"))
        out.append(f"| {setting} | {gain.fmt(1, 100)}% | {best.fmt(3)} |")
    return "\n".join(out)


# The group spread's server cap on 8 engines (`make kvbench-cap`).
RL_CAP = "kvbench-cap"


def render_cap(docs_root: str) -> Optional[str]:
    """docs/rl-workloads.md's cap table: per correlation, kvc_aware at the
    defaults (no cap) and with group_spread_max_servers 4, each over
    verl_default on the same seed, and the cap's own effect (cap 4 ÷
    defaults) on step time, TTFT p99 and hit rate; None without the runs."""
    d = os.path.join(docs_root, "docs", "results", RL_CAP)
    out = ["Rendered from `docs/results/kvbench-cap/` (`make kvbench-cap`: grpo_sat at full size, 512 prompts × 16 "
           "on 8 engines, verl's order, HBM engine model, one step); paired by seed, mean ± 95% CI:", "",
           "| ρ | seeds | kvc_aware ÷ verl_default (defaults, no cap) | cap 4 ÷ verl_default | cap 4 ÷ defaults: "
           "step | TTFT p99 | hit rate, defaults → cap 4 |", "|---|---|---|---|---|---|---|"]
    rows = 0
    for t, label in (("0", "0"), ("5", "0.5"), ("8", "0.8")):
        per: Dict[str, List[float]] = {k: [] for k in ("cap", "off", "step", "ttft", "hit_off", "hit_cap")}
        seeds = []
        for path in sorted(glob.glob(os.path.join(d, f"defaults-r{t}-*.json"))):
            seed = os.path.basename(path)[len(f"defaults-r{t}-"):-5]
            other = os.path.join(d, f"cap4-r{t}-{seed}.json")
            if not os.path.isfile(other):
                continue
            with open(path, encoding="utf-8") as f:
                base = json.load(f)["policies"]
            with open(other, encoding="utf-8") as f:
                cap = json.load(f)["policies"]["kvc_aware"]
            verl, ours = base["verl_default"], base["kvc_aware"]
            seeds.append(int(seed))
            per["off"].append(ours["makespan_s"] / verl["makespan_s"])
            per["cap"].append(cap["makespan_s"] / verl["makespan_s"])
            per["step"].append(cap["makespan_s"] / ours["makespan_s"])
            per["ttft"].append(cap["ttft_p99_s"] / ours["ttft_p99_s"])
            per["hit_off"].append(ours["hit_rate"])
            per["hit_cap"].append(cap["hit_rate"])
        if not seeds:
            continue
        rows += 1
        ci = {k: mean_ci(v) for k, v in per.items()}
        out.append(f"| {label} | {min(seeds)}–{max(seeds)} | {_ratio_word(ci['off'])} | {_ratio_word(ci['cap'])} "
                   f"| {_ratio_word(ci['step'])} | {ci['ttft'].fmt(3)} | {ci['hit_off'].fmt(1, 100)}% → "
                   f"{ci['hit_cap'].fmt(1, 100)}% |")
    return "\n".join(out) if rows else None


# The reverted shared-prompt charge on the real demo fleet: (label, seed,
# the shipped library's demo JSON, the candidate's), under docs/results/.
CHARGE_DEMO = (
    ("`make demo` (grpo_rho05)", 0, "demo-grpo_rho05.json", "charge-candidate-demo/candidate/demo-seed0.json"),
    *(("`make demo --no-rollout` (grpo_rho05)", s, f"charge-candidate-demo/shipped/demo-seed{s}.json",
       f"charge-candidate-demo/candidate/demo-seed{s}.json") for s in (1, 2, 3, 4)),
    ("`make demo DEMO_ARGS=\"--sat-workload grpo_sat\"` (independent lengths)", 0, "demo-grpo_sat.json",
     "charge-candidate-demo/candidate/demo-grpo_sat-seed0.json"),
)


def render_charge_demo(docs_root: str) -> Optional[str]:
    """docs/rl-workloads.md's table of the reverted candidate on the demo's
    oversubscribed step: per seed, kvc_aware's step ÷ default's in the same
    run (engine clock), hit rate and preemptions, shipped and candidate."""
    res = os.path.join(docs_root, "docs", "results")
    out = ["Rendered from the demo JSON under `docs/results/` named in each row (the shipped library's seed 0 is "
           "the published `demo-grpo_rho05.json` / `demo-grpo_sat.json`, the headlines of their day); one run a "
           "seed, so no intervals:", "",
           "| demo step | seed | kvc_aware ÷ default, shipped | kvc_aware ÷ default, candidate | hit rate shipped → "
           "candidate | preemptions shipped → candidate |", "|---|---|---|---|---|---|"]
    for label, seed, shipped, cand in CHARGE_DEMO:
        rows = []
        for rel in (shipped, cand):
            path = os.path.join(res, rel)
            if not os.path.isfile(path):
                return None
            with open(path, encoding="utf-8") as f:
                by = {x["policy"]: x for x in json.load(f)["sat"]["summaries"]}
            rows.append(by)
        ratio = [f"{r['kvc_aware']['step_time_s'] / r['default']['step_time_s']:.3f}" for r in rows]
        hit = " → ".join(f"{100 * r['kvc_aware']['hit_rate']:.1f}%" for r in rows)
        pre = " → ".join(f"{r['kvc_aware']['preemptions']:.0f}" for r in rows)
        out.append(f"| {label} | {seed} | {ratio[0]} | {ratio[1]} | {hit} | {pre} |")
    return "\n".join(out)


def render_rl_block(docs_root: str) -> Optional[str]:
    from render_rl import rows

    res = os.path.join(docs_root, "docs", "results")
    current, off, prev, today = (os.path.join(res, d) for d in (RL_DEFAULTS, RL_GS_OFF, RL_PREV, RL_TODAY[0]))
    if not glob.glob(os.path.join(current, "rl-r0-*.json")):
        return None
    has_today = bool(glob.glob(os.path.join(today, "rl-r0-*.json")))
    first = today if has_today else current
    # Today's defaults first (where re-run), then the freezes that each changed one thing.
    cols = ([(today, f"kvc_aware, library defaults, admission on ({RL_TODAY[1]})", "kvc_aware"),
             (today, f"kvc_aware, admission off ({RL_TODAY[1]})", "kvc_aware+noadmit"),
             (current, f"kvc_aware, defaults at {RL_DEFAULTS[3:]}", "kvc_aware")] if has_today else
            [(current, f"kvc_aware, library defaults ({RL_DEFAULTS[3:]})", "kvc_aware"),
             (current, "kvc_aware + admission, defaults", "kvc_aware+admit")])
    cols += [(off, f"kvc_aware, group_spread off ({RL_GS_OFF[3:]})", "kvc_aware"),
             (prev, f"kvc_aware, task_spread off ({RL_PREV[3:]})", "kvc_aware"),
             (res, "kvc_aware, group_spread 0.1 ungated (3965cf8)", "kvc_aware")]
    dirs = ([today] if has_today else []) + [current, off, prev]
    out = ["kvc_aware's step time ÷ verl_default's on the same seed (`make kvbench-rl`, grpo_sat at half size "
           "and kvbench's agent workload, "
           "verl-ordered arrivals, HBM engine model; mean ± 95% CI over the seeds; rendered from "
           + ", ".join(f"`docs/results/{os.path.basename(d)}/`" for d in dirs) + " and "
           "`docs/results/rl-*.json`):", "",
           "| setting | seeds | " + " | ".join(label for _, label, _ in cols) + " |",
           "|---|---|" + "---|" * len(cols)]
    for prefix, label, step in RL_SETTINGS:
        data = {d: rows(d, prefix, step) for d in {d for d, _, _ in cols}}
        if "kvc_aware" not in data[first]:
            continue
        seeds = sorted(int(os.path.basename(p)[len(prefix) + 1:-5])
                       for p in glob.glob(os.path.join(first, f"{prefix}-*.json")))

        def cell(d: Dict[str, Dict[str, List[float]]], p: str) -> str:
            if p not in d:
                return "n/a"
            ci = mean_ci(d[p]["step"])
            return ci.fmt(3) + {1: " (longer)", -1: " (shorter)", 0: ""}[_clear(ci)]

        out.append(f"| {label} | {seeds[0]}–{seeds[-1]} | "
                   + " | ".join(cell(data[d], p) for d, _, p in cols) + " |")
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arena", default=os.path.join(REPO, "docs", "results", "arena-details.json"))
    ap.add_argument("--arena-tuned", default=None,
                    help="`make arena-tuned`'s tuned peer rows, merged into the arena tables when the file exists "
                         "(default: arena-tuned-details.json beside --arena)")
    ap.add_argument("--kvbench", nargs="*", default=None,
                    help="held-out JSONs (default docs/results/kvbench-*.json)")
    ap.add_argument("--docs", default=REPO, help="repository root holding README.md and docs/")
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if a document would change")
    a = ap.parse_args(argv)
    if a.arena_tuned is None:
        a.arena_tuned = os.path.join(os.path.dirname(os.path.abspath(a.arena)), "arena-tuned-details.json")
    kv_paths = a.kvbench if a.kvbench is not None else sorted(glob.glob(os.path.join(REPO, "docs", "results",
                                                                                        "kvbench-*.json")))
    arena = None
    if os.path.isfile(a.arena):
        with open(a.arena, encoding="utf-8") as f:
            arena = json.load(f)
    kv = []
    for p in kv_paths:
        with open(p, encoding="utf-8") as f:
            kv.append((p, json.load(f)))
    tuned = None
    if arena is not None and a.arena_tuned and os.path.isfile(a.arena_tuned):
        with open(a.arena_tuned, encoding="utf-8") as f:
            tuned = json.load(f)
    rel = os.path.relpath(a.arena, REPO)
    targets = {}
    if arena is not None:
        trel = os.path.relpath(a.arena_tuned, REPO) if tuned else ""
        targets[os.path.join(a.docs, "docs", "arena.md")] = {"arena": render_arena(arena, rel, tuned, trel)}
        targets[os.path.join(a.docs, "README.md")] = {"headline": render_headline(arena, rel, tuned)}
        before_main = os.path.join(os.path.dirname(os.path.abspath(a.arena)), ARENA_BEFORE)
        if os.path.isfile(before_main):
            with open(before_main, encoding="utf-8") as f:
                before_doc = json.load(f)
            rerun_path = os.path.join(os.path.dirname(before_main), ARENA_BEFORE_RERUN)
            rerun_doc = None
            if os.path.isfile(rerun_path):
                with open(rerun_path, encoding="utf-8") as f:
                    rerun_doc = json.load(f)
            targets[os.path.join(a.docs, "docs", "arena.md")]["arena-refreeze"] = render_arena_refreeze(
                arena, before_doc, workloads=list(dict.fromkeys(r["row"]["workload"] for r in arena["runs"])),
                now_file="arena-details.json", before_file=ARENA_BEFORE, policies=ARENA_REFROZEN,
                rerun=rerun_doc, rerun_file=ARENA_BEFORE_RERUN)
    # `make arena-rl`: the realistic-arrival arena, its own file and blocks.
    rl_arena = os.path.join(os.path.dirname(os.path.abspath(a.arena)), "arena-rl-details.json")
    if os.path.isfile(rl_arena):
        with open(rl_arena, encoding="utf-8") as f:
            rl_doc = json.load(f)
        rrel = os.path.relpath(rl_arena, REPO)
        # `make arena-rl-tuned`'s rows: each tunable peer at its best grid
        # point for step time on these workloads, merged like arena-tuned's.
        # `make arena-rl-queue-tuned`'s: Dynamo's router queue, tuned without the hold.
        tuned_parts, trels, ttargets = [], [], []
        for name, tgt in (("arena-rl-tuned-details.json", "make arena-rl-tuned"),
                          ("arena-rl-queue-tuned-details.json", "make arena-rl-queue-tuned")):
            path = os.path.join(os.path.dirname(rl_arena), name)
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    tuned_parts.append(json.load(f))
                trels.append(os.path.relpath(path, REPO))
                ttargets.append(tgt)
        rl_tuned = combine_tuned(tuned_parts)
        rl_trel = "`, `".join(trels)
        targets.setdefault(os.path.join(a.docs, "docs", "arena.md"), {})["arena-rl"] = render_arena(
            rl_doc, rrel, rl_tuned, rl_trel, tuned_target="`, `".join(ttargets) or "make arena-rl-tuned")
        targets.setdefault(os.path.join(a.docs, "README.md"), {})["headline-rl"] = render_headline(
            rl_doc, rrel, rl_tuned, shown=ARENA_RL_WORKLOADS, target="make arena-rl")
        before_path = os.path.join(os.path.dirname(rl_arena), ARENA_RL_BEFORE)
        if os.path.isfile(before_path):
            with open(before_path, encoding="utf-8") as f:
                targets[os.path.join(a.docs, "docs", "arena.md")]["arena-rl-refreeze"] = render_arena_refreeze(
                    rl_doc, json.load(f))
        more_path = os.path.join(os.path.dirname(rl_arena), ARENA_RL_MORE_SEEDS)
        if os.path.isfile(more_path):
            with open(more_path, encoding="utf-8") as f:
                targets[os.path.join(a.docs, "docs", "arena.md")]["arena-rl-more-seeds"] = render_arena_more_seeds(
                    rl_doc, json.load(f))
    if kv:
        targets[os.path.join(a.docs, "docs", "kvbench.md")] = {"kvbench": render_kvbench(kv)}
        step_doc = os.path.join(a.docs, "docs", "step-time.md")
        if any(d.get("workload") in STEP_WORKLOADS for _, d in kv) and os.path.isfile(step_doc):
            oracle = []
            for p in sorted(glob.glob(os.path.join(a.docs, "docs", "results", "oracle-lpt-*.json"))):
                with open(p, encoding="utf-8") as f:
                    oracle.append(json.load(f))
            targets[step_doc] = {"steptime": render_steptime(kv, oracle)}
            readme = os.path.join(a.docs, "README.md")
            with open(readme, encoding="utf-8") as f:
                if "<!-- BEGIN RENDERED: steptime -->" in f.read():
                    targets.setdefault(readme, {})["steptime"] = targets[step_doc]["steptime"]
    # docs/rl-workloads.md's kvbench-rl tables: the ungated group_spread 0.1
    # freeze (docs/results/rl-*.json), the library defaults (RL_DEFAULTS), the
    # defaults without group_spread (RL_GS_OFF), the defaults before
    # task_spread (RL_PREV) and the 41412f1 task_spread freeze (RL_TASK).
    rl_doc = os.path.join(a.docs, "docs", "rl-workloads.md")
    if os.path.isfile(rl_doc):
        from render_rl import render as render_rl_tables

        with open(rl_doc, encoding="utf-8") as f:
            rl_text = f.read()
        for block, sub in (("rl-spread", ""), ("rl-defaults", RL_DEFAULTS), ("rl-gs-off", RL_GS_OFF),
                           ("rl-prev-defaults", RL_PREV), ("rl-task-spread", RL_TASK),
                           ("rl-charge", RL_CHARGE)):
            d = os.path.join(a.docs, "docs", "results", sub) if sub else os.path.join(a.docs, "docs", "results")
            if f"<!-- BEGIN RENDERED: {block} -->" in rl_text:
                shown = "docs/results/" + sub if sub else "docs/results"
                targets.setdefault(rl_doc, {})[block] = render_rl_tables(d, shown)
        charge = render_charge_demo(a.docs)
        if "<!-- BEGIN RENDERED: charge-demo -->" in rl_text and charge:
            targets.setdefault(rl_doc, {})["charge-demo"] = charge
        if "<!-- BEGIN RENDERED: rl-arena-shape -->" in rl_text:
            targets.setdefault(rl_doc, {})["rl-arena-shape"] = render_rl_tables(
                os.path.join(a.docs, "docs", "results", RL_ARENA_SHAPE), "docs/results/" + RL_ARENA_SHAPE,
                shape=RL_ARENA_SHAPE_TITLE)
        cap = render_cap(a.docs)
        if "<!-- BEGIN RENDERED: rl-cap -->" in rl_text and cap:
            targets.setdefault(rl_doc, {})["rl-cap"] = cap
        goals = render_targets(a.docs)
        if "<!-- BEGIN RENDERED: rl-targets -->" in rl_text and goals:
            targets.setdefault(rl_doc, {})["rl-targets"] = goals
        work = render_work(a.docs)
        if "<!-- BEGIN RENDERED: rl-work -->" in rl_text and work:
            targets.setdefault(rl_doc, {})["rl-work"] = work
        heldout_admit = render_heldout_admit(a.docs)
        if "<!-- BEGIN RENDERED: rl-heldout-admit -->" in rl_text and heldout_admit:
            targets.setdefault(rl_doc, {})["rl-heldout-admit"] = heldout_admit
        heldout_split = render_heldout_admit(a.docs, HELDOUT_ADMIT_SPLIT, HELDOUT_ADMIT_SPLIT_BEFORE, "the split")
        if "<!-- BEGIN RENDERED: rl-heldout-admit-split -->" in rl_text and heldout_split:
            targets.setdefault(rl_doc, {})["rl-heldout-admit-split"] = heldout_split
        mean_prompt = render_mean_prompt(a.docs)
        if "<!-- BEGIN RENDERED: rl-mean-prompt -->" in rl_text and mean_prompt:
            targets.setdefault(rl_doc, {})["rl-mean-prompt"] = mean_prompt
        for block, folder, base, what, base_what, note in OPENINGS:
            opening = render_opening(a.docs, folder, base, what, base_what, note)
            if f"<!-- BEGIN RENDERED: {block} -->" in rl_text and opening:
                targets.setdefault(rl_doc, {})[block] = opening
        admit_spread = render_admit_spread(a.docs)
        if "<!-- BEGIN RENDERED: rl-admit-spread -->" in rl_text and admit_spread:
            targets.setdefault(rl_doc, {})["rl-admit-spread"] = admit_spread
        admit_split = render_admit_spread(a.docs, ADMIT_SPLIT, ADMIT_SPLIT_BEFORE)
        if "<!-- BEGIN RENDERED: rl-admit-split -->" in rl_text and admit_split:
            targets.setdefault(rl_doc, {})["rl-admit-split"] = admit_split
        admit_clock = render_admit_clock(a.docs)
        arena_md = os.path.join(a.docs, "docs", "arena.md")
        if admit_clock and os.path.isfile(arena_md):
            with open(arena_md, encoding="utf-8") as f:
                if "<!-- BEGIN RENDERED: arena-admit-clock -->" in f.read():
                    targets.setdefault(arena_md, {})["arena-admit-clock"] = admit_clock
        admit_lengths = render_admit_lengths(a.docs)
        if "<!-- BEGIN RENDERED: rl-admit-lengths -->" in rl_text and admit_lengths:
            targets.setdefault(rl_doc, {})["rl-admit-lengths"] = admit_lengths
        # Every peer tuned for step time on the same settings (`make kvbench-rl-tuned`), one block per run.
        for sub, _ in RL_TUNED_RUNS:
            tuned_rl = [os.path.join(a.docs, "docs", "results", sub, f"heldout-rl-{k}.json") for k in RL_TUNED]
            if f"<!-- BEGIN RENDERED: {sub} -->" in rl_text and all(os.path.isfile(p) for p in tuned_rl):
                tdocs = []
                for p in tuned_rl:
                    with open(p, encoding="utf-8") as f:
                        tdocs.append((p, json.load(f)))
                targets.setdefault(rl_doc, {})[sub] = render_kvbench(tdocs)
        for sub, _ in RL_TUNED_AGENT_RUNS:
            p = os.path.join(a.docs, "docs", "results", sub, "heldout-rl-agt.json")
            if f"<!-- BEGIN RENDERED: {sub} -->" in rl_text and os.path.isfile(p):
                with open(p, encoding="utf-8") as f:
                    block = render_kvbench([(p, json.load(f))])
                targets.setdefault(rl_doc, {})[sub] = block + render_change_effect(os.path.dirname(p), p)
    readme = os.path.join(a.docs, "README.md")
    has_rl = False
    if os.path.isfile(readme):
        with open(readme, encoding="utf-8") as f:
            has_rl = "<!-- BEGIN RENDERED: rl -->" in f.read()
    rl = render_rl_block(a.docs) if has_rl else None
    if rl is not None:
        targets.setdefault(readme, {})["rl"] = rl
    # agent_task re-measured with Dynamo's proxy answering non-streamed (its own file and block).
    agent_json = os.path.join(os.path.dirname(os.path.abspath(a.arena)), "arena-agent-task-details.json")
    arena_md = os.path.join(a.docs, "docs", "arena.md")
    if os.path.isfile(agent_json) and os.path.isfile(arena_md):
        with open(arena_md, encoding="utf-8") as f:
            has_block = "<!-- BEGIN RENDERED: arena-agent-task -->" in f.read()
        if has_block:
            with open(agent_json, encoding="utf-8") as f:
                targets.setdefault(arena_md, {})["arena-agent-task"] = render_arena(
                    json.load(f), os.path.relpath(agent_json, REPO))
    gap = render_turn_gap(os.path.join(a.docs, "docs", "results", "agent-turn-gap"))
    arena_doc = os.path.join(a.docs, "docs", "arena.md")
    if gap is not None and os.path.isfile(arena_doc):
        with open(arena_doc, encoding="utf-8") as f:
            if "<!-- BEGIN RENDERED: agent-turn-gap -->" in f.read():
                targets.setdefault(arena_doc, {})["agent-turn-gap"] = gap
    # The demo's table (README "Headline"): docs/results/demo.json, a copy of
    # the last `make demo`'s build/demo/demo-summary.json.
    demo_json = os.path.join(a.docs, "docs", "results", "demo.json")
    if os.path.isfile(demo_json):
        from kvc_harness.demo import render_readme

        with open(demo_json, encoding="utf-8") as f:
            demo_block = render_readme(json.load(f))
        targets.setdefault(os.path.join(a.docs, "README.md"), {})["demo"] = demo_block
        # docs/demo.md: the same block, and the independent-length step
        # (--sat-workload grpo_sat) from docs/results/demo-grpo_sat.json.
        demo_doc = os.path.join(a.docs, "docs", "demo.md")
        if os.path.isfile(demo_doc):
            with open(demo_doc, encoding="utf-8") as f:
                demo_text = f.read()
            blocks = {}
            if "<!-- BEGIN RENDERED: demo -->" in demo_text:
                blocks["demo"] = demo_block
            if blocks:
                targets.setdefault(demo_doc, {}).update(blocks)
    # docs/demo.md's blocks from their own JSON, with or without demo.json.
    demo_doc = os.path.join(a.docs, "docs", "demo.md")
    if os.path.isfile(demo_doc):
        with open(demo_doc, encoding="utf-8") as f:
            demo_text = f.read()
        from kvc_harness.demo import render_readme

        blocks = {}
        # The steps that headlined before: the independent-length burst
        # (--sat-workload grpo_sat) and the first-epoch rho 0.5 step
        # (--sat-workload grpo_rho05).
        for block, name in (("demo-grpo-sat", "demo-grpo_sat.json"), ("demo-grpo-rho05", "demo-grpo_rho05.json")):
            path = os.path.join(a.docs, "docs", "results", name)
            if f"<!-- BEGIN RENDERED: {block} -->" in demo_text and os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    blocks[block] = render_readme(json.load(f), source=f"docs/results/{name}")
        shape_dir = os.path.join(a.docs, "docs", "results", DEMO_SHAPE)
        if "<!-- BEGIN RENDERED: demo-shape -->" in demo_text and os.path.isdir(shape_dir):
            from render_rl import render as render_rl_tables

            blocks["demo-shape"] = render_rl_tables(shape_dir, "docs/results/" + DEMO_SHAPE,
                                                    shape=DEMO_SHAPE_TITLE, counters=True)
        if blocks:
            targets.setdefault(demo_doc, {}).update(blocks)
    # docs/demo.md: the headline step on other seeds (docs/results/demo-seeds/demo-seed*.json),
    # and the first-epoch step that headlined before (docs/results/demo-seeds-grpo_rho05/).
    demo_doc = os.path.join(a.docs, "docs", "demo.md")
    for block, sub in (("demo-seeds", "demo-seeds"), ("demo-seeds-grpo-rho05", "demo-seeds-grpo_rho05")):
        seed_paths = sorted(glob.glob(os.path.join(a.docs, "docs", "results", sub, "demo-seed*.json")))
        if not seed_paths or not os.path.isfile(demo_doc):
            continue
        with open(demo_doc, encoding="utf-8") as f:
            has_block = f"<!-- BEGIN RENDERED: {block} -->" in f.read()
        if has_block:
            from kvc_harness.demo import render_seeds

            seed_docs = []
            for sp in seed_paths:
                with open(sp, encoding="utf-8") as f:
                    seed_docs.append(json.load(f))
            targets.setdefault(demo_doc, {})[block] = render_seeds(seed_docs, f"docs/results/{sub}/")
    changed = []
    for path, blocks in targets.items():
        with open(path, encoding="utf-8") as f:
            old = f.read()
        new = replace_blocks(old, blocks, path)
        if new != old:
            changed.append(path)
            if not a.check:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
    for p in changed:
        print(f"{'stale' if a.check else 'rendered'}: {os.path.relpath(p, a.docs)}")
    return 1 if (a.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
