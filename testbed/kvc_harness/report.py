"""Figures out of raw samples: the one percentile definition every published
number uses, the demo's per-policy summary, comparison table and plot, plain
measurement tables, and JSON output."""

from __future__ import annotations

import json
import math
import os
import re
import textwrap
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple


def percentile(samples: Sequence[float], p: float) -> float:
    """The p-th percentile (p in 0..100) by linear interpolation between the
    closest ranks (numpy's default): p0 is the minimum, p100 the maximum.
    NaN when there are no samples. The only definition in the harness: every
    test bound and every published figure uses it."""
    return _interpolate(sorted(samples), p)


def percentiles(samples: Sequence[float], *ps: float) -> List[float]:
    """:func:`percentile` for each p (in 0..100), sorting the samples once."""
    s = sorted(samples)
    return [_interpolate(s, p) for p in ps]


def _interpolate(s: Sequence[float], p: float) -> float:
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile {p} is outside 0..100")
    if not s:
        return float("nan")
    k = (len(s) - 1) * p / 100.0
    lo = int(math.floor(k))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


#: Student's t, two-sided 95%, by degrees of freedom (1..30; 1.96 beyond).
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


def mean_ci(samples: Sequence[float]) -> List[float]:
    """[mean, half-width of its 95% confidence interval (t distribution)]."""
    n = len(samples)
    m = sum(samples) / n
    if n < 2:
        return [m, float("nan")]
    sd = (sum((x - m) ** 2 for x in samples) / (n - 1)) ** 0.5
    t = _T95[n - 2] if n - 1 <= len(_T95) else 1.96
    return [round(m, 1), round(t * sd / n**0.5, 1)]


def format_rows(head: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """A plain-text table: a header line, a rule, one line per row; the
    columns listed in `right` are right-aligned, the others left-aligned."""
    w = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]

    def line(r: Sequence[str]) -> str:
        cells = [f"{str(c):>{w[i]}}" if i in right else f"{str(c):<{w[i]}}" for i, c in enumerate(r)]
        return "  ".join(cells).rstrip()

    return "\n".join([line(head), "-" * (sum(w) + 2 * (len(w) - 1)), *[line(r) for r in rows]])


@dataclass
class Row:
    """One row of a comparison table: ``label``, the summary ``key`` (or a
    ``get`` function of a summary), how a value is printed, and how a policy
    compares with the baseline: ``diff`` is "pct" (relative), "pt"
    (percentage points of a fraction) or "abs"; ``better`` is "lower",
    "higher" or "" (the difference is shown without a verdict, and never
    listed as a loss)."""

    label: str
    key: str = ""
    fmt: Callable[[Any], str] = str
    diff: str = "pct"
    better: str = "lower"
    get: Optional[Callable[[dict], Any]] = None
    unit: str = ""  # appended to an "abs" difference

    def value(self, s: dict) -> Any:
        return self.get(s) if self.get is not None else s.get(self.key, float("nan"))


def _nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def compare(row: Row, base: Any, v: Any) -> Tuple[str, Optional[bool]]:
    """(text, worse?) of ``v`` against the baseline ``base`` under ``row``'s
    rule; worse is None when the row gives no verdict or a value is missing."""
    if _nan(base) or _nan(v) or base is None or v is None or isinstance(v, str):
        return "", None
    d = v - base
    if row.diff == "pt":
        text = f"{d * 100:+.1f} pt"
    elif row.diff == "abs":
        text = f"{d:+.{0 if float(d).is_integer() else 2}f}{row.unit}"
    else:
        if not base:
            return "", None
        text = f"{d / base * 100:+.1f}%"
    if not row.better or abs(d) < 1e-12:
        return (text + (" (same)" if row.better and abs(d) < 1e-12 else "")), (False if row.better else None)
    worse = d > 0 if row.better == "lower" else d < 0
    return f"{text} {'worse' if worse else 'better'}", worse


def comparison_table(sums: Sequence[dict], sections: Sequence[Tuple[str, Sequence[Row]]],
                     baseline: int = 0) -> Tuple[List[str], List[str]]:
    """A table with one value column per policy and one column per other
    policy headed "<policy> / vs <baseline>", each cell saying better or worse.
    ``sections`` are (heading, rows); an empty heading prints no line.
    Returns (lines, losses): every cell where a policy is worse than the
    baseline, as "<policy>: <label> <change>"."""
    base = sums[baseline]
    others = [s for i, s in enumerate(sums) if i != baseline]
    names = [s["policy"] for s in sums]
    w0 = max(len(r.label) for _, rows in sections for r in rows) + 2
    shown = [r.fmt(v) for _, rows in sections for r in rows for v in map(r.value, sums) if not _nan(v)]
    wv = max(12, max(len(n) for n in names) + 2, max((len(x) for x in shown), default=0) + 2)
    wc = max(16, max(len(s["policy"]) for s in others) + 2) if others else 0
    head1 = f"{'':<{w0}}" + "".join(f"{n:>{wv}}" for n in names) + "".join(f"{s['policy']:>{wc}}" for s in others)
    head2 = f"{'':<{w0}}" + " " * (wv * len(names)) + "".join(f"{'vs ' + base['policy']:>{wc}}" for _ in others)
    rule = "-" * len(head1)
    lines, losses = [head1, head2, rule], []
    for heading, rows in sections:
        if heading:
            lines.append(heading)
        for r in rows:
            vals = [r.value(s) for s in sums]
            cells = "".join(f"{('n/a' if _nan(v) else r.fmt(v)):>{wv}}" for v in vals)
            changes = []
            for s in others:
                text, worse = compare(r, r.value(base), r.value(s))
                changes.append(f"{text:>{wc}}")
                if worse:
                    label = re.sub(r" \[\w\]", "", r.label.strip())
                    losses.append(f"{s['policy']}: {label} {text.rsplit(' ', 1)[0]} against {base['policy']}")
            lines.append(f"{r.label:<{w0}}{cells}{''.join(changes)}")
    lines.append(rule)
    return lines, losses


def summarize(run: dict, time_scale: float = 1.0) -> dict:
    """time_scale converts wall seconds into the servers' clock (vllm-sim --speed)."""
    res = run["results"]
    ok = [r for r in res if not r["error"]]
    c = run["counters"]
    tot_q = sum(v["queries"] for v in c.values())
    tot_h = sum(v["hits"] for v in c.values())
    ttft = [r["ttft"] * time_scale for r in ok]
    acq = [r["acquire_s"] for r in ok]
    e2e = [r["e2e"] for r in ok]
    srv_ttft_n = sum(v["ttft_count"] for v in c.values())
    return {
        "policy": run["policy"],
        "requests": len(res),
        "errors": len(res) - len(ok),
        "hit_rate": tot_h / tot_q if tot_q else 0.0,
        "hit_rate_by_server": {sid: (v["hits"] / v["queries"] if v["queries"] else 0.0) for sid, v in c.items()},
        "queries_by_server": {sid: v["queries"] for sid, v in c.items()},
        "requests_by_server": {sid: sum(1 for r in res if r["server"] == sid) for sid in c},
        "client_cached_tokens": sum(r.get("cached", 0) for r in ok),
        "prompt_tokens": sum(r["prompt_len"] for r in ok),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "ttft_mean_s": sum(ttft) / len(ttft) if ttft else float("nan"),
        "server_ttft_mean_s": (sum(v["ttft_sum"] for v in c.values()) / srv_ttft_n) if srv_ttft_n else float("nan"),
        "preemptions": sum(v["preemptions"] for v in c.values()),
        "makespan_s": {s["step"]: s["makespan_s"] * time_scale for s in run["steps"]},
        "total_makespan_s": sum(s["makespan_s"] for s in run["steps"]) * time_scale,
        "acquire_p50_us": percentile(acq, 50) * 1e6,
        "acquire_p99_us": percentile(acq, 99) * 1e6,
        "acquire_share": (sum(acq) / sum(e2e + acq)) if ok else float("nan"),
        "router": run["router"],
        "ttft_samples_s": sorted(ttft),
        "first_error": next((r["error"] for r in res if r["error"]), None),
    }


HOST_NOTE = (
    "clients' clock = wall seconds x the simulator's speed, measured by the client: it includes this shared "
    "machine's stalls (Ray, Python threads), so read it as context, not as a result"
)


def rollout_sections(sums: Sequence[dict], time_unit: str) -> List[Tuple[str, List[Row]]]:
    """The rollout steps' rows: the servers' own figures first, then what
    only the clients' clock measures (step times, streamed TTFT)."""
    sec = lambda v: f"{v:.2f}s"  # noqa: E731
    ms = lambda v: f"{v:.3f}s"  # noqa: E731
    server = [
        Row("prefix-cache hit rate (servers)", "hit_rate", lambda v: f"{v * 100:.1f}%", "pt", "higher"),
        Row(f"TTFT mean (servers' histogram, {time_unit})", "server_ttft_mean_s", ms),
        Row("preemptions (servers)", "preemptions", lambda v: f"{v:.0f}", "abs"),
        Row("KV-event blocks applied (router)", fmt=lambda v: f"{v:.0f}", diff="abs", better="",
            get=lambda s: s["router"]["event_stored_blocks"]),
    ]
    host = [Row(f"step time, all steps ({time_unit})", "total_makespan_s", sec)]
    for step in sums[0]["makespan_s"]:
        host.append(Row(f"  {step} ({time_unit})", fmt=sec,
                        get=lambda s, st=step: s["makespan_s"].get(st, float("nan"))))
    host += [
        Row(f"TTFT p50 (client, streamed, {time_unit})", "ttft_p50_s", ms),
        Row(f"TTFT p99 (client, streamed, {time_unit})", "ttft_p99_s", ms),
        Row("acquire p50 / p99 (Ray round trip, ms)", fmt=str, better="",
            get=lambda s: f"{s['acquire_p50_us'] / 1e3:.1f} / {s['acquire_p99_us'] / 1e3:.1f}"),
        Row("requests / errors", fmt=str, better="", get=lambda s: f"{s['requests']} / {s['errors']}"),
    ]
    return [("servers' counters (engine side):", server), ("clients' clock (see the note):", host)]


def format_table(sums: List[dict], title: str, time_unit: str) -> str:
    """The rollout steps: every change column says which baseline it is
    against and whether the policy is better or worse there; the rows only
    the clients' clock measures come last, under a note; losses listed."""
    lines, losses = comparison_table(sums, rollout_sections(sums, time_unit))
    out = [title, "", *lines, wrap(f"Note: {HOST_NOTE}. These steps are sized for hit rate and TTFT, not step "
                                   "time; the oversubscribed step above is the step-time result.")]
    out.append(losses_text(losses))
    return "\n".join(out)


def losses_text(losses: Sequence[str]) -> str:
    if not losses:
        return "Losses in this run: none (no policy is worse than the baseline on any row)."
    return "Losses in this run (where a policy is worse than the baseline):\n" + "\n".join(f"  - {x}" for x in losses)


def wrap(text: str, width: int = 110, indent: str = "") -> str:
    """A note wrapped for a terminal; continuation lines indented."""
    return "\n".join(textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "    "))


def plot(
    sums: List[dict], path: str, title: str, time_unit: str, sat_sums: Sequence[dict] = ()
) -> Optional[str]:
    """Step time first (each step relative to default, the oversubscribed step
    leftmost), then hit rate and the TTFT CDF. ``sums`` are the rollout
    steps' summaries, ``sat_sums`` the oversubscribed step's (satstep)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); no plot written"
    colors = {"default": "#8c8c8c", "kvc_aware": "#1f77b4", "kvc_aware+admit": "#2ca02c",
              "kvc_aware+admit+lengths": "#2ca02c"}
    # Every policy of either section, in run order: each panel shows all of
    # them (a policy a section did not run has no bar there).
    names: List[str] = []
    for s in list(sat_sums) + list(sums):
        if s["policy"] not in names:
            names.append(s["policy"])
    base_name = names[0]
    fig, axes = plt.subplots(1, 3, figsize=(17, 6.4), gridspec_kw={"width_ratios": [1.5, 1, 1.2]})
    fig.suptitle(title, fontsize=11)
    below = {"loc": "upper center", "bbox_to_anchor": (0.5, -0.2), "fontsize": 8, "frameon": False}

    # 1. Step time, relative to the baseline, absolute values on the bars.
    ax = axes[0]
    groups: List[tuple] = []  # (label, {policy: seconds})
    if sat_sums:
        clock = "engines'" if sat_sums[0].get("step_time_clock") == "engines" else "clients'"
        groups.append((f"oversubscribed\nstep\n({clock} clock)", {s["policy"]: s["step_time_s"] for s in sat_sums}))
    for step in sums[0]["makespan_s"] if sums else []:
        groups.append((f"{step}\n(clients'\nclock)", {s["policy"]: s["makespan_s"].get(step, float("nan"))
                                                    for s in sums}))
    width = 0.8 / len(names)
    top = 1.0
    def offset(n: str, present: Sequence[str]) -> float:
        """A bar's offset in its group, the group's bars centred on the tick."""
        k = list(present).index(n)
        return (k - (len(present) - 1) / 2) * width

    for j, n in enumerate(names):
        xs, ys, labels = [], [], []
        for i, (_, vals) in enumerate(groups):
            if n not in vals:
                continue
            base = vals.get(base_name) or float("nan")
            xs.append(i + offset(n, [m for m in names if m in vals]))
            ys.append(vals[n] / base)
            labels.append(f"{vals[n]:.1f}s")
        bars = ax.bar(xs, ys, width=width, color=colors.get(n, f"C{j}"), label=n)
        for b, lab, y in zip(bars, labels, ys):
            if y == y:
                ax.text(b.get_x() + b.get_width() / 2, y + 0.01, lab, ha="center", va="bottom", fontsize=7,
                        rotation=90 if len(names) > 2 else 0)
                top = max(top, y)
    ax.axhline(1.0, color="black", lw=0.6, ls=":")
    ax.set_xticks(range(len(groups)), [g[0] for g in groups], fontsize=8)
    ax.set_ylim(0, top * 1.25)
    ax.set_ylabel(f"step time / {base_name}'s (labels: {time_unit})")
    ax.set_title("step time (first request to last completion), lower is better", fontsize=10)
    ax.legend(ncol=len(names), **below)
    if sat_sums:
        ax.axvspan(-0.5, 0.5, color="#fff3cd", zorder=0)

    # 2. Prefix-cache hit rate from the servers' counters, per section.
    ax = axes[1]
    sections = ([("oversubscribed\nstep", list(sat_sums))] if sat_sums else []) + [("rollout steps", list(sums))]
    labelled = set()
    for j, n in enumerate(names):
        for i, (_, ss) in enumerate(sections):
            s = next((x for x in ss if x["policy"] == n), None)
            if s is None:
                continue
            x = i + offset(n, [m for m in names if any(y["policy"] == m for y in ss)])
            ax.bar([x], [s["hit_rate"] * 100], width=width, color=colors.get(n, f"C{j}"),
                   label=None if n in labelled else n)
            labelled.add(n)
            per = [v * 100 for v in s["hit_rate_by_server"].values()]
            ax.scatter([x] * len(per), per, color="black", s=10, zorder=3,
                       label="per server" if (i == 0 and j == 0) else None)
            ax.text(x, max([s["hit_rate"] * 100] + per) + 2, f"{s['hit_rate'] * 100:.0f}%", ha="center", fontsize=8)
    ax.set_xticks(range(len(sections)), [sec[0] for sec in sections], fontsize=8)
    ax.set_ylim(0, 110)
    ax.set_ylabel("prefix-cache hit rate (%)")
    ax.set_title("hit rate (servers' /metrics), higher is better", fontsize=10)
    ax.legend(ncol=len(names) + 1, **below)

    # 3. TTFT CDFs: the oversubscribed step (submission to first token) and
    # the rollout steps (streamed, client side).
    ax = axes[2]
    curves = [(s, "oversubscribed step", "-") for s in sat_sums] + [(s, "rollout", "--") for s in sums]
    for s, what, ls in curves:
        v = s.get("ttft_samples_s") or []
        if v:
            ax.step(v, [(i + 1) / len(v) for i in range(len(v))], where="post", ls=ls,
                    color=colors.get(s["policy"], "C2"),
                    label=f"{s['policy']}, {what} (p50 {s['ttft_p50_s']:.2f}s, p99 {s['ttft_p99_s']:.2f}s)")
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"TTFT ({time_unit}, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF (oversubscribed step: incl. the acquire wait)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(ncol=1, **dict(below, bbox_to_anchor=(0.5, -0.14)))
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return None


def _jsonable(o: Any) -> Any:
    if is_dataclass(o) and not isinstance(o, type):
        return asdict(o)
    return str(o)


def write_json(path: str, payload: dict) -> None:
    """Writes payload (dataclasses as dicts, anything else unknown as str)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=1, default=_jsonable)
