"""Figures out of raw samples: the one percentile definition every published
number uses, the demo's per-policy summary, comparison table and plot, plain
measurement tables, and JSON output."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, is_dataclass
from typing import Any, Callable, List, Optional, Sequence


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


def _chg(a: float, b: float, unit: str = "%") -> str:
    if unit == "pt":
        return f"{(b - a) * 100:+.1f} pt"
    if not a or a != a or b != b:
        return ""
    return f"{(b - a) / a * 100:+.0f}%"


def format_table(sums: List[dict], title: str, time_unit: str) -> str:
    base, new = sums[0], sums[-1]
    names = [s["policy"] for s in sums]
    w0 = 34
    cols = "".join(f"{n:>14}" for n in names)
    lines = [title, "", f"{'':<{w0}}{cols}{'change':>12}", "-" * (w0 + 14 * len(sums) + 12)]

    def row(label: str, vals: Sequence[Any], fmt: Callable[[Any], str], change: str = "") -> None:
        lines.append(f"{label:<{w0}}" + "".join(f"{fmt(v):>14}" for v in vals) + f"{change:>12}")

    # Step time first: what a verl user installs a router for.
    row(
        f"step time, all steps ({time_unit})",
        [s["total_makespan_s"] for s in sums],
        lambda v: f"{v:.2f}s",
        _chg(base["total_makespan_s"], new["total_makespan_s"]),
    )
    for step in base["makespan_s"]:
        row(
            f"  {step} ({time_unit})",
            [s["makespan_s"].get(step, float("nan")) for s in sums],
            lambda v: f"{v:.2f}s",
            _chg(base["makespan_s"][step], new["makespan_s"].get(step, float("nan"))),
        )
    pct = lambda v: f"{v * 100:.1f}%"  # noqa: E731
    row(
        "prefix-cache hit rate (servers)",
        [s["hit_rate"] for s in sums],
        pct,
        _chg(base["hit_rate"], new["hit_rate"], "pt"),
    )
    for i in range(len(base["hit_rate_by_server"])):
        cells = []
        for s in sums:
            hr, nreq = list(s["hit_rate_by_server"].values()), list(s["requests_by_server"].values())
            cells.append(f"{hr[i] * 100:.1f}% /{nreq[i]:>3}" if i < len(hr) else "")
        row(f"  server {i}", cells, str)
    sec = lambda v: f"{v:.3f}s"  # noqa: E731
    row(
        f"TTFT p50 (client, {time_unit})",
        [s["ttft_p50_s"] for s in sums],
        sec,
        _chg(base["ttft_p50_s"], new["ttft_p50_s"]),
    )
    row(
        f"TTFT p99 (client, {time_unit})",
        [s["ttft_p99_s"] for s in sums],
        sec,
        _chg(base["ttft_p99_s"], new["ttft_p99_s"]),
    )
    row(
        "TTFT mean (servers' histogram)",
        [s["server_ttft_mean_s"] for s in sums],
        sec,
        _chg(base["server_ttft_mean_s"], new["server_ttft_mean_s"]),
    )
    row("preemptions (servers)", [s["preemptions"] for s in sums], lambda v: f"{v:.0f}")
    row(
        "acquire p50 / p99 (Ray RTT, ms)",
        [f"{s['acquire_p50_us'] / 1e3:.1f} / {s['acquire_p99_us'] / 1e3:.1f}" for s in sums],
        str,
    )
    row("acquire share of request time", [s["acquire_share"] for s in sums], lambda v: f"{v * 100:.2f}%")
    row("requests / errors", [f"{s['requests']} / {s['errors']}" for s in sums], str)
    row("KV-event blocks applied", [s["router"]["event_stored_blocks"] for s in sums], lambda v: f"{v:.0f}")
    lines.append("-" * (w0 + 14 * len(sums) + 12))
    lines.append("per-server rows: hit rate / requests routed there")
    return "\n".join(lines)


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
    colors = {"default": "#8c8c8c", "kvc_aware": "#1f77b4"}
    names = [s["policy"] for s in sums]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), gridspec_kw={"width_ratios": [1.5, 1, 1.2]})
    fig.suptitle(title, fontsize=11)

    # 1. Step time, relative to default, absolute values on the bars.
    ax = axes[0]
    groups: List[tuple] = []  # (label, {policy: seconds})
    if sat_sums:
        clock = "engines'" if sat_sums[0].get("step_time_clock") == "engines" else "clients'"
        sat_times = {s["policy"]: s["step_time_s"] for s in sat_sums}
        groups.append((f"oversubscribed\nGRPO step\n({clock} clock)", sat_times))
    for step in sums[0]["makespan_s"]:
        groups.append((step, {s["policy"]: s["makespan_s"].get(step, float("nan")) for s in sums}))
    width = 0.8 / len(names)
    top = 1.0
    for j, n in enumerate(names):
        xs, ys, labels = [], [], []
        for i, (_, vals) in enumerate(groups):
            base = vals.get(names[0]) or float("nan")
            xs.append(i + (j - (len(names) - 1) / 2) * width)
            ys.append(vals.get(n, float("nan")) / base)
            labels.append(f"{vals.get(n, float('nan')):.1f}s")
        bars = ax.bar(xs, ys, width=width, color=colors.get(n, "C2"), label=n)
        for b, lab, y in zip(bars, labels, ys):
            if y == y:
                ax.text(b.get_x() + b.get_width() / 2, y + 0.01, lab, ha="center", va="bottom", fontsize=7)
                top = max(top, y)
    ax.axhline(1.0, color="black", lw=0.6, ls=":")
    ax.set_xticks(range(len(groups)), [g[0] for g in groups], fontsize=8)
    ax.set_ylim(0, top * 1.18)
    ax.set_ylabel(f"step time / {names[0]}'s (labels: {time_unit})")
    ax.set_title("step time (first request to last completion), lower is better")
    ax.legend(fontsize=8, loc="lower left", ncol=len(names))
    if sat_sums:
        ax.axvspan(-0.5, 0.5, color="#fff3cd", zorder=0)

    # 2. Prefix-cache hit rate from the servers' counters, per section.
    ax = axes[1]
    sections = ([("oversubscribed\nGRPO step", list(sat_sums))] if sat_sums else []) + [("rollout steps", sums)]
    for j, n in enumerate(names):
        for i, (_, ss) in enumerate(sections):
            s = next((x for x in ss if x["policy"] == n), None)
            if s is None:
                continue
            x = i + (j - (len(names) - 1) / 2) * width
            ax.bar([x], [s["hit_rate"] * 100], width=width, color=colors.get(n, "C2"), label=n if i == 0 else None)
            per = [v * 100 for v in s["hit_rate_by_server"].values()]
            ax.scatter([x] * len(per), per, color="black", s=10, zorder=3,
                       label="per server" if (i == 0 and j == 0) else None)
            ax.text(x, max([s["hit_rate"] * 100] + per) + 2, f"{s['hit_rate'] * 100:.0f}%", ha="center", fontsize=9)
    ax.set_xticks(range(len(sections)), [sec[0] for sec in sections], fontsize=8)
    ax.set_ylim(0, 110)
    ax.set_ylabel("prefix-cache hit rate (%)")
    ax.set_title("hit rate (servers' /metrics)")
    ax.legend(loc="upper left", fontsize=8, ncol=3)

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
    ax.set_title("TTFT CDF")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
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
