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
otherwise the row says "tie" (tests/kvc_harness/stats.py).

  PYTHONPATH=tests python scripts/render_results.py \\
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
from typing import Dict, List, Optional, Sequence, Tuple

try:
    from kvc_harness.stats import MeanCI, mean_ci, verdict
except ModuleNotFoundError as e:
    if e.name != "kvc_harness":
        raise
    sys.exit("kvc_harness not found: run with PYTHONPATH=tests")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOUND = "prefill_free_bound"
REPEAT_SUFFIX = "#repeat"  # a policy run a second time on every seed: the noise floor


def is_policy(name: str) -> bool:
    return name != BOUND and not name.endswith(REPEAT_SUFFIX)
BLOCK = re.compile(r"(<!-- BEGIN RENDERED: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- END RENDERED: (?P=name) -->)",
                   re.S)

# Arena metrics: (key, where, label, digits, lower is better)
ARENA_METRICS = (
    ("engine_makespan_s", "details", "step time (engine clock) s", 1, True),
    ("makespan_s", "row", "client makespan s", 1, True),
    ("ttft_p99_s", "row", "TTFT p99 s", 3, True),
    ("ttft_p50_s", "row", "TTFT p50 s", 3, True),
    ("hit_rate", "row", "hit rate", 3, False),
    ("imbalance", "row", "imbalance", 2, True),
)
VERDICT_METRICS = ("engine_makespan_s", "ttft_p99_s", "hit_rate")
RL_WORKLOADS = ("grpo_sat", "agent_scale", "long_agent")


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
    stats = {k: {m: mean_ci([x[src].get(m, float("nan")) for x in rs]) for m, src, *_ in ARENA_METRICS}
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
    for p in dict.fromkeys(p for p, _ in by):
        ratios = [v / by[(base, seed)] for (pp, seed), v in by.items()
                  if pp == p and (base, seed) in by and by[(base, seed)] > 0]
        if ratios:
            out[p] = mean_ci(ratios)
    return out


def paired_lines(w: str, ratios: Dict[str, MeanCI]) -> List[str]:
    shorter, longer, same = [], [], []
    for p, ci in ratios.items():
        if not is_policy(p) or p == "verl_default":
            continue
        cell = f"{p} {ci.fmt(3)}"
        if ci.n < 2 or math.isnan(ci.ci95):
            same.append(cell + " (one seed, no interval)")
            continue
        (shorter if ci.hi < 1.0 else longer if ci.lo > 1.0 else same).append(cell)
    lines = []
    if shorter:
        lines.append("- step time shorter than verl_default, paired by seed (the ratio's interval is below 1): "
                     + ", ".join(shorter))
    if longer:
        lines.append("- step time longer than verl_default, paired by seed (the ratio's interval is above 1): "
                     + ", ".join(longer))
    if same:
        lines.append("- step time paired by seed, no interval clear of 1 (tie with verl_default): " + ", ".join(same))
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
        base = r["row"]["policy"].partition("@")[0]
        # After the base policy's first run: tables list policies in the order they first appear.
        at = min((i for i, x in enumerate(runs) if x["row"]["workload"] == r["row"]["workload"]
                  and x["row"]["policy"].partition("@")[0] == base), default=len(runs) - 1)
        runs.insert(at + 1, r)
    return dict(doc, runs=runs, tuning=tuned.get("tuning"), tuned_config=tuned.get("config"))


def display_name(p: str, w: str, doc: dict) -> str:
    if p == BOUND:
        return f"{p} (bound: free prefill)"
    if p.endswith(REPEAT_SUFFIX):
        return f"{p[: -len(REPEAT_SUFFIX)]}, second run (noise floor)"
    base, _, tag = p.partition("@")
    if tag == "tuned":
        params = ((doc.get("tuning") or {}).get("chosen") or {}).get(base, {}).get(w, {})
        knobs = ", ".join(f"{k} {v}" if isinstance(v, bool) else f"{k} {v:g}" for k, v in sorted(params.items()))
        return f"{base} (tuned: {knobs})" if knobs else f"{base} (tuned)"
    return p


def tuning_lines(doc: dict, w: str) -> List[str]:
    t = doc.get("tuning")
    if not t:
        return []
    kept, moved = [], []
    for peer, per_w in sorted(t["chosen"].items()):
        if w not in per_w:
            continue
        if per_w[w] == t["grid"][peer][0]:
            kept.append(peer)
        else:
            moved.append(peer)
    seeds = ", ".join(map(str, t["tune_seeds"]))
    out = []
    if moved:
        out.append(f"- tuned peer rows: the grid point with the best objective on seeds {seeds} "
                   f"({t['objective']}): " + ", ".join(moved))
    if kept:
        out.append(f"- launcher default kept by tuning on seeds {seeds} (its row is the tuned row): " + ", ".join(kept))
    return out


def render_arena(doc: dict, source: str, tuned: Optional[dict] = None, tuned_source: str = "") -> str:
    doc = merge_tuned(doc, tuned)
    runs = doc["runs"]
    cfg = doc.get("config") or {}
    workloads, policies, stats, errors = arena_stats(runs)
    seeds = sorted({r["row"]["seed"] for r in runs})
    out = [f"Rendered by `scripts/render_results.py` from `{source}`: seeds {', '.join(map(str, seeds))}; "
           f"vllm-sim `--speed {cfg.get('speed')}`, `--clock {cfg.get('clock', 'wall')}`, "
           f"{'streamed' if cfg.get('stream', True) else 'non-streamed'} requests; kvc_aware's configuration: "
           f"`{os.path.relpath(cfg['kvc_frozen'], REPO) if cfg.get('kvc_frozen') else 'library defaults'}`"
           + (f" at commit `{cfg['kvc_frozen_commit']}`" if cfg.get("kvc_frozen_commit") else "") + "."
           + (f" Tuned peer rows from `{tuned_source}` (`make arena-tuned`, same seeds)." if tuned else ""),
           "", "Every cell is the mean ± the 95% confidence interval of the mean over the seeds (Student's t). "
           "Step time is the engine-clock makespan (grpo: last finish − first arrival over the fleet; agents: the "
           "longest trajectory's summed engine latencies); the client makespan adds the client's and proxies' time.",
           ""]
    for w in workloads:
        ps = policies[w]
        out.append(f"#### {w}")
        out.append("")
        ratios = paired_ratios(runs, w)
        hdr = ("| policy | " + " | ".join(label for _, _, label, *_ in ARENA_METRICS[:1])
               + " | step time ÷ verl_default (paired) | "
               + " | ".join(label for _, _, label, *_ in ARENA_METRICS[1:]) + " | errors |")
        out += [hdr, "|" + "---|" * (len(ARENA_METRICS) + 3)]
        for p in ps:
            cells = [stats[(w, p)][m].fmt(d) for m, _s, _l, d, _lo in ARENA_METRICS]
            ratio = ratios[p].fmt(3) if p in ratios and p != "verl_default" else "1"
            name = display_name(p, w, doc)
            out.append(f"| {name} | {cells[0]} | {ratio} | " + " | ".join(cells[1:]) + f" | {sum(errors[(w, p)])} |")
        out.append("")
        out.append(f"Who wins on {w} (\"best\" only where the 95% intervals do not overlap):")
        out += arena_verdicts(w, ps, stats)
        out += paired_lines(w, ratios)
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


def render_kvbench(docs: List[Tuple[str, dict]]) -> str:
    out = ["Rendered by `scripts/render_results.py` from `kvbench --heldout --json` outputs. Each tunable peer has "
           "its launcher-default row and, below it, its row tuned on seeds 101–102 (one row when the tuning chose "
           "the launcher default); cells are mean ± 95% CI over the reported seeds (Student's t).", ""]
    for path, d in docs:
        rows = d["rows"]
        frozen = d.get("kvc_frozen") or {}
        title = d["workload"]
        if d.get("arrival_spread_s"):
            title += f", arrivals spread over {d['arrival_spread_s']:g} s"
        out.append(f"#### {title} (`{os.path.relpath(path, REPO)}`)")
        out.append("")
        seeds = ", ".join(map(str, d["report_seeds"]))
        tuned_on = ", ".join(map(str, d["tune_seeds"]))
        out.append(f"Reported seeds {seeds}; tuned on {tuned_on}"
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
        out.append(f"Who wins on {title} (\"best\" only where the 95% intervals do not overlap):")
        for key, label, lower, digits, scale in (("makespan_s", "makespan s", True, 1, 1.0),
                                                 ("ttft_p99_s", "TTFT p99 s", True, 3, 1.0),
                                                 ("hit_rate", "hit rate %", False, 1, 100.0)):
            st = {row_name(r): _ci(r[key]) for r in rows}
            v = verdict(key, st, lower)
            if v is not None:
                out.append(f"- {label}: {v.text(st, digits, scale)}")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# docs/step-time.md: step time on the RL-scale kvbench workloads

STEP_WORKLOADS = ("grpo_sat", "agent_scale", "agent_long", "agent_long_few")


def render_steptime(docs: List[Tuple[str, dict]], oracle: List[dict]) -> str:
    out = ["Held-out kvbench (`make kvbench-heldout`): mean ± 95% CI over the reported seeds; each peer at the better "
           "of its launcher-default and tuned rows (by mean makespan; both rows are in docs/kvbench.md); "
           "\"better\" only where the intervals do not overlap. Bound share = the share of verl_default's gap "
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
        mk = {row_name(r): _ci(r["makespan_s"]) for r in (verl, best, kvc) + ((adm,) if adm else ())}
        v = verdict("makespan_s", mk, True)
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
                   f"{v.text(mk, 1) if v else 'n/a'} |")
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


def render_headline(arena: Optional[dict], source: str, tuned: Optional[dict] = None) -> str:
    if arena is None:
        return "(no arena results rendered yet)"
    arena = merge_tuned(arena, tuned)
    workloads, policies, stats, _ = arena_stats(arena["runs"])
    out = [f"Step time on the RL workloads (`make arena`: real routers, vllm-sim fleets; rendered from `{source}`; "
           "mean ± 95% CI over seeds; \"best\" only where the intervals do not overlap):", "",
           "| workload | verl_default | kvc_aware | kvc_aware ÷ verl_default (paired by seed) | best peer (by mean) "
           "| hit rate kvc_aware / peer | TTFT p99 s kvc_aware / peer | who wins step time |",
           "|---|---|---|---|---|---|---|---|"]
    for w in workloads:
        if w not in RL_WORKLOADS:
            continue
        ps = [p for p in policies[w] if is_policy(p)]
        peers = [p for p in ps if p not in ("verl_default", "kvc_aware", "round_robin")]
        if "kvc_aware" not in ps or not peers:
            continue
        key = "engine_makespan_s"
        best_peer = min(peers, key=lambda p: stats[(w, p)][key].mean)
        st = {p: stats[(w, p)][key] for p in ps}
        v = verdict(key, st, True)
        base = stats[(w, "verl_default")][key].fmt(1) if (w, "verl_default") in stats else "n/a"
        k, b = stats[(w, "kvc_aware")], stats[(w, best_peer)]
        ratio = paired_ratios(arena["runs"], w).get("kvc_aware")
        out.append(f"| {w} | {base} | {k[key].fmt(1)} | {ratio.fmt(3) if ratio else 'n/a'} | "
                   f"{best_peer} {b[key].fmt(1)} | "
                   f"{k['hit_rate'].fmt(3)} / {b['hit_rate'].fmt(3)} | "
                   f"{k['ttft_p99_s'].fmt(3)} / {b['ttft_p99_s'].fmt(3)} | "
                   f"{v.text(st, 1) if v else 'n/a'} |")
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arena", default=os.path.join(REPO, "docs", "results", "arena-details.json"))
    ap.add_argument("--arena-tuned", default=os.path.join(REPO, "docs", "results", "arena-tuned-details.json"),
                    help="`make arena-tuned`'s tuned peer rows, merged into the arena tables when the file exists")
    ap.add_argument("--kvbench", nargs="*", default=None,
                    help="held-out JSONs (default docs/results/kvbench-*.json)")
    ap.add_argument("--docs", default=REPO, help="repository root holding README.md and docs/")
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if a document would change")
    a = ap.parse_args(argv)
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
