"""The demo behind ``make demo`` and ``testbed/scripts/gpu-validate.sh``: default
(verl's balancer) vs kvc_aware, each on a cold simulated fleet (or on attached
servers, whose prefix caches are reset between the policies), measured from the
servers' own /metrics and the clients' clocks. Two sections:

* the headline, one oversubscribed GRPO step (:mod:`kvc_harness.satstep`):
  prompts x samples submitted at once through the balancer actor, several
  times the fleet's running slots, step time first, hit rate and TTFT beside it;
* rollout steps at a size where routing shows in hit rate and TTFT: GRPO steps
  with a weight update between them and a multi-turn agent step.

``testbed/scripts/demo.py`` is its command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from kvc_harness import REPO, client, fleet, report, rollout, satstep
from kvc_harness.procs import Reaper, start_ray
from kvc_harness.workloads import WorkloadSpec

POLICIES = ("default", "kvc_aware")
# The oversubscribed step also runs kvc_aware with router-side admission
# (kvc_aware+admit: what verl's hook runs at the defaults, admission.enabled
# auto; the plain kvc_aware row is the routing alone, as the synchronous
# class runs it), where late binding pays off; on a step whose prompts recur
# (a later epoch), also with the length learning that ranks admission by each
# prompt's earlier lengths (router.lengths.enabled, opt-in), the
# configuration docs/verl.md gives for recurring prompts.
SAT_POLICIES = POLICIES + ("kvc_aware+admit",)
SAT_POLICIES_RECURRING = SAT_POLICIES + ("kvc_aware+admit+lengths",)


@dataclass
class DemoOptions:
    """What testbed/scripts/demo.py's flags set; None means the workload's default
    (or the quick run's, with ``quick``)."""

    servers: int = 4
    prompts: Optional[int] = None
    samples: Optional[int] = None
    steps: Optional[int] = None
    tasks: Optional[int] = None
    agent_samples: Optional[int] = None
    turns: Optional[int] = None
    workers: int = 4
    seed: int = 0
    quick: bool = False
    speed: Optional[float] = None  # vllm-sim seconds per wall second; default 2, quick 4
    gpu_blocks: int = 3072
    max_num_seqs: int = 64
    sim_binary: str = os.path.join(REPO, "bin", "vllm-sim")
    servers_file: Optional[str] = None
    out: str = os.path.join(REPO, "build", "demo")
    plot: Optional[str] = None
    json: Optional[str] = None
    num_cpus: int = 2
    title: str = "kvc-router demo"
    # The oversubscribed GRPO step (None: satstep's defaults, or its quick size).
    sat: bool = True
    sat_prompts: Optional[int] = None
    sat_samples: Optional[int] = None
    sat_speed: Optional[float] = None
    sat_gpu_blocks: Optional[int] = None
    sat_max_num_seqs: Optional[int] = None
    # The arena workload whose shape the step takes: RL's (a prompt's samples'
    # lengths correlated, sent in verl's order); grpo_sat has independent ones.
    sat_workload: str = "grpo_recur"
    # The rollout steps after the headline (False: the headline alone, as the
    # reproducibility test runs it).
    rollout: bool = True


def sat_options(a: DemoOptions) -> satstep.SatOptions:
    """The oversubscribed step's size and fleet; SystemExit on a bad value."""
    o = satstep.quick_options(a.seed) if a.quick else satstep.SatOptions(seed=a.seed)
    o.servers, o.workers, o.workload = a.servers, a.workers, a.sat_workload
    for name in ("prompts", "samples", "speed", "gpu_blocks", "max_num_seqs"):
        v = getattr(a, f"sat_{name}")
        if v is not None:
            if v <= 0:
                raise SystemExit(f"--sat-{name.replace('_', '-')} must be > 0")
            setattr(o, name, type(getattr(o, name))(v))
    return o


def sat_spec(a: DemoOptions, o: satstep.SatOptions) -> WorkloadSpec:
    spec = satstep.workload(o)
    if a.quick:
        satstep.scale_for_quick(spec)
    return spec


def sat_workload(a: DemoOptions, o: satstep.SatOptions) -> List[List[dict]]:
    """Every step of the headline's rollout in order; the last is reported."""
    return satstep.steps(sat_spec(a, o))


def sat_policies(spec: WorkloadSpec) -> Tuple[str, ...]:
    """The headline's rows: a step whose prompts ran in an earlier step (a
    dataset's later epoch) gets the opt-in row that learns their lengths."""
    return SAT_POLICIES_RECURRING if spec.steps > 1 and spec.dataset_prompts else SAT_POLICIES


def commit() -> str:
    """The commit the demo ran at (``+dirty`` with local changes), or "unknown"."""
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + ("+dirty" if dirty else "")) if head else "unknown"


def _slim(s: dict) -> dict:
    return {k: v for k, v in s.items() if k != "ttft_samples_s"}


def summary_doc(full: dict) -> dict:
    """The demo's figures without its per-request records: what
    docs/results/demo.json holds and the README's demo table is rendered from."""
    sat = full.get("sat") or {}
    return {
        "commit": full.get("commit", "unknown"),
        "seed": full.get("seed"),
        "command": full.get("command", "make demo"),
        "sat": {
            "description": sat.get("description"),
            "backend": sat.get("backend"),
            "options": sat.get("options"),
            "workload_sha256": sat.get("workload_sha256"),
            "summaries": [_slim(x) for x in sat.get("summaries") or []],
        },
        "rollout": {
            "backend": full.get("backend"),
            "workload": full.get("workload"),
            "summaries": [_slim(x) for x in full.get("summaries") or []],
        },
    }


def _ratio(s: dict, base: dict, key: str) -> str:
    b = base.get(key)
    return f" ({s[key] / b:.3f}x)" if b and s is not base else ""


def render_seeds(docs: list, source: str) -> str:
    """The demo's headline step on other seeds (one `make demo` run each,
    ``DEMO_ARGS=--seed N``): per seed each policy's step time over the first
    policy's (default) in the same run, then the mean ± 95% CI of those
    paired ratios; "shorter"/"longer" only where the interval excludes 1."""
    from kvc_harness.stats import mean_ci

    docs = sorted(docs, key=lambda d: d.get("seed", 0))
    pols = [s["policy"] for s in docs[0]["sat"]["summaries"]]
    base = pols[0]
    out = [f"`make demo` on seeds {', '.join(str(d.get('seed')) for d in docs)} (rendered from `{source}`; commit "
           f"{', '.join(sorted({d['commit'] for d in docs}))}; each policy's step time, engines' clock, over "
           f"{base}'s in the same run; hit rates from the servers' metrics):", "",
           "| seed | " + f"{base} step (sim s) | " + " | ".join(f"{p} ÷ {base}" for p in pols[1:])
           + " | hit rate " + " / ".join(pols) + " |",
           "|---|---|" + "---|" * (len(pols) - 1) + "---|"]
    ratios: dict = {p: [] for p in pols[1:]}
    for d in docs:
        by = {s["policy"]: s for s in d["sat"]["summaries"]}
        b = by[base]["step_time_s"]
        cells = []
        for p in pols[1:]:
            r = by[p]["step_time_s"] / b
            ratios[p].append(r)
            cells.append(f"{r:.3f}")
        hits = " / ".join(f"{by[p]['hit_rate'] * 100:.1f}%" for p in pols)
        out.append(f"| {d.get('seed')} | {b:.1f} | " + " | ".join(cells) + f" | {hits} |")
    summary = []
    for p in pols[1:]:
        ci = mean_ci(ratios[p])
        word = "shorter" if ci.hi < 1 else "longer" if ci.lo > 1 else "tie"
        summary.append(f"{ci.fmt(3)} ({word})")
    out.append("| mean ± 95% CI | | " + " | ".join(summary) + " | |")
    out.append(f"| seeds shorter than {base} | | "
               + " | ".join(f"{sum(r < 1 for r in ratios[p])} of {len(ratios[p])}" for p in pols[1:]) + " | |")
    return "\n".join(out) + "\n"


def render_readme(doc: dict, source: str = "docs/results/demo.json") -> str:
    """The README's demo block, from :func:`summary_doc`'s document: every
    column says what it is against, losses are stated, nothing is typed."""
    sat = doc["sat"]
    sums = sat["summaries"]
    base = sums[0]
    lines = [
        f"`{doc.get('command') or 'make demo'}` at commit {doc['commit']}: {sat['description']} "
        f"(rendered from `{source}`; ratios are each policy's over {base['policy']}'s, same run):",
        "",
        "| policy | step time, engines' clock (sim s) | hit rate (servers) | TTFT p50 / p99, submit to first "
        "token (sim s) † | of which acquire wait p99 (sim s) † | preemptions |",
        "|---|---|---|---|---|---|",
    ]
    for s in sums:
        adm = ((s.get("router") or {}).get("admission") or {})
        learns = ((s.get("router") or {}).get("lengths") or {}).get("corr_only") is False
        if s["policy"] == "default":
            what = ""
        elif adm.get("enabled"):
            what = (" (admission and length learning; lengths opt-in)" if learns
                    else " (admission on: verl's hook's default since 2f74939)")
        else:
            what = " (admission off)"
        name = s["policy"] + what + (" †" if s.get("host_timed", True) else "")
        lines.append(
            f"| {name} | {s['step_time_s']:.1f}{_ratio(s, base, 'step_time_s')} | {s['hit_rate'] * 100:.1f}% | "
            f"{s['ttft_p50_s']:.1f} / {s['ttft_p99_s']:.1f} | {s['acquire_p99_s']:.1f} | {s['preemptions']:.0f} |")
    lines.append("")
    for s in sums:
        adm = ((s.get("router") or {}).get("admission") or {})
        if adm.get("enabled"):
            lines.append(
                f"The acquire wait of {s['policy']} is the admission hold: the balancer held "
                f"{adm.get('queued_total', 0)} of {s['requests']} samples while every server had its cap in "
                f"flight, a wait the other policies spend queued inside the engines; TTFT includes it."
                + (f" The hold is read on the engines' clocks, as every wait inside an engine is (each server's "
                   f"own sends and arrivals map the clients' wall clock onto its paced clock, so this host's "
                   f"stalls add no simulated time to it); read as wall time × speed instead, the same waits give "
                   f"an acquire wait p99 of {s['acquire_wall_p99_s']:.1f} and TTFT p50 / p99 of "
                   f"{s['ttft_wall_p50_s']:.1f} / {s['ttft_wall_p99_s']:.1f} sim s."
                   if s.get("acquire_clock") == "engines" else ""))
    worse = [f"{s['policy']} {key} {s[k] / base[k]:.3f}x" for s in sums[1:]
             for key, k in (("step time", "step_time_s"), ("TTFT p99", "ttft_p99_s"))
             if base.get(k) and s[k] > base[k]]
    lines.append("Losses in this run: " + ("; ".join(worse) if worse else "none") + ".")
    lines.append("")
    lines.append("† host-timed (a rerun moves it within the tolerance below); every other figure is the seed's. "
                 + satstep.reproducibility_text(sums, doc.get("seed")) + " `make test-e2e` reruns the step "
                 "(testbed/tests/test_demo.py) and checks both. One seed is one step: the held-out tables below "
                 "are the evidence for step time.")
    return "\n".join(lines) + "\n"


def workload(a: DemoOptions) -> WorkloadSpec:
    """The workload the options describe; SystemExit on a count below 1."""
    spec = WorkloadSpec(seed=a.seed)
    if a.quick:
        spec.steps, spec.prompts, spec.samples = 2, 4, 8
        spec.tasks, spec.agent_samples, spec.turns = 2, 4, 3
        spec.prompt_tokens = (1024, 2048)
    for name in ("prompts", "samples", "steps", "tasks", "agent_samples", "turns"):
        v = getattr(a, name)
        if v is not None:
            if v < 1:
                raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
            setattr(spec, name, v)
    return spec


def ensure_matplotlib(log: Callable[[str], Any]) -> None:
    """The plot needs matplotlib; install it into this interpreter when missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log("installing matplotlib for the plot ...")
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], check=False)
        if r.returncode:
            log("matplotlib could not be installed; the demo runs without a plot")


def run(a: DemoOptions) -> int:
    """Runs the demo; the exit status (1 when any request failed, 130 on Ctrl-C)."""
    t_start = time.time()

    def log(msg: str) -> None:
        print(msg, flush=True)

    if not (a.sat or a.rollout):
        raise SystemExit("--no-sat and --no-rollout together leave nothing to run")
    spec = workload(a)
    sat = sat_options(a) if a.sat else None
    sat_steps = sat_workload(a, sat) if sat is not None else []
    sat_reqs = sat_steps[-1] if sat_steps else []
    sat_pols = sat_policies(sat_spec(a, sat)) if sat is not None else ()
    os.makedirs(a.out, exist_ok=True)
    plot_path = a.plot or os.path.join(a.out, "demo.png")
    json_path = a.json or os.path.join(a.out, "demo.json")
    cleanup = Reaper(at_exit=True)
    cleanup.install_signal_handlers()
    speed = a.speed if a.speed is not None else (4.0 if a.quick else 2.0)
    try:
        ensure_matplotlib(log)
        attach = a.servers_file is not None
        fleets: Dict[str, Tuple[subprocess.Popen, list]] = {}
        sat_fleets: Dict[str, Tuple[subprocess.Popen, list]] = {}
        sat_backend, sat_scale = "", 1.0
        if attach:
            servers = fleet.read_servers_file(a.servers_file)
            backend = f"{len(servers)} attached servers ({a.servers_file})"
            sat_backend = backend
            time_scale, time_unit = 1.0, "s"
        else:
            if not os.access(a.sim_binary, os.X_OK):
                raise SystemExit(
                    f"{a.sim_binary} not found: run `make build` (or go build -o bin/vllm-sim ./cmd/vllm-sim)"
                )
            extra = [
                "--speed",
                str(speed),
                # Host stalls (a shared machine) add no simulated time to busy engines.
                "--clock",
                "paced",
                "--num-gpu-blocks",
                str(a.gpu_blocks),
                "--seed",
                str(a.seed),
                "--max-num-seqs",
                str(a.max_num_seqs),
            ]
            # One cold fleet per policy and section, all started before Ray (no
            # threads yet, so the fleets can be tied to this process's lifetime).
            for pol in POLICIES if a.rollout else ():
                p, servers, cmd = fleet.start_sim_fleet(
                    a.sim_binary, a.servers, cleanup, extra, os.path.join(a.out, f"vllm-sim-{pol}.log")
                )
                fleets[pol] = (p, servers)
            if fleets:
                log(f"vllm-sim fleets (pids {' '.join(str(p.pid) for p, _ in fleets.values())}): {' '.join(cmd[1:])}")
            if sat is not None:
                for pol in sat_pols:
                    p, sat_servers, sat_cmd = fleet.start_sim_fleet(
                        a.sim_binary, a.servers, cleanup, satstep.sim_flags(sat),
                        os.path.join(a.out, f"vllm-sim-sat-{pol}.log"),
                    )
                    sat_fleets[pol] = (p, sat_servers)
                log(
                    f"vllm-sim fleets for the oversubscribed step (pids "
                    f"{' '.join(str(p.pid) for p, _ in sat_fleets.values())}): {' '.join(sat_cmd[1:])}"
                )
                sat_backend = (
                    f"{a.servers} vllm-sim servers x max_num_seqs {sat.max_num_seqs} = {sat.slots} running slots, "
                    f"{sat.gpu_blocks} GPU blocks x 16 tokens each, speed {sat.speed:g}x"
                )
                sat_scale = sat.speed
            backend = (
                f"{a.servers} vllm-sim servers ({a.gpu_blocks} GPU blocks x 16 tokens each, KV events on, "
                f"speed {speed:g}x)"
            )
            # Times are reported on the servers' clock: wall x speed.
            time_scale, time_unit = speed, "sim s"
        log(f"backend: {backend}")
        if a.rollout:
            log(f"workload: {spec.describe()}, seed {a.seed}")
        if sat is not None:
            ratio = "" if attach else f" ({len(sat_reqs) / sat.slots:.0f}x the running slots)"
            log(
                f"oversubscribed GRPO step: {sat.prompts} prompts x {sat.samples} samples = {len(sat_reqs)} sequences "
                f"at once{ratio} on {sat_backend}"
            )

        ray = start_ray(a.num_cpus, namespace="kvc-router-demo")
        cleanup.add(ray.shutdown)
        cleanup.install_signal_handlers()  # after ray.init, which may install its own

        model = None
        runs = []
        for pol in POLICIES if a.rollout else ():
            if attach:
                client.wait_healthy(fleet.urls(servers))
                client.reset_prefix_caches(fleet.urls(servers))  # cold start
                srv = servers
            else:
                srv = fleets[pol][1]
                client.wait_healthy(fleet.urls(srv))
            model = model or client.served_model(srv[0].url)
            log(f"running policy {pol} ...")
            runs.append(
                rollout.run_policy(
                    ray, pol, srv, spec, model, workers=a.workers, log=log, max_num_seqs=0 if attach else a.max_num_seqs
                )
            )
            if not attach:
                cleanup.stop_process(fleets[pol][0])
        sat_runs = []
        if sat is not None:
            for pol in sat_pols:
                if attach:
                    client.reset_prefix_caches(fleet.urls(servers))  # cold start
                    srv = servers
                else:
                    srv = sat_fleets[pol][1]
                    client.wait_healthy(fleet.urls(srv))
                log(f"oversubscribed GRPO step, policy {pol} ...")
                sat_runs.append(
                    satstep.run_policy(
                        ray, pol, srv, sat_reqs, client.served_model(srv[0].url), workers=sat.workers,
                        max_num_seqs=0 if attach else sat.max_num_seqs, log=log, hold=not attach,
                        warm=sat_steps[:-1], response_tokens=sat_spec(a, sat).response_max,
                    )
                )
                if not attach:
                    cleanup.stop_process(sat_fleets[pol][0])
        sums = [report.summarize(r, time_scale) for r in runs]
        sat_sums = [satstep.summarize(r, sat_scale) for r in sat_runs]
        sat_text = satstep.describe(sat, sat_spec(a, sat), sat_backend) if sat is not None else None
        log("")
        if sat_sums:
            log(
                satstep.format_table(
                    sat_sums,
                    report.wrap(f"HEADLINE - {sat_text}"),
                    time_unit,
                    cap=None if attach else sat.max_num_seqs,
                    seed=a.seed,
                )
            )
            log("")
        if sums:
            log(report.format_table(sums, f"{a.title}: rollout steps on {backend}", time_unit))
        if sums and not attach:
            log(
                "(times on the simulated servers' clock: wall seconds x speed; server ids differ between the "
                "cold fleets, rows are matched by position)"
            )
        err = report.plot(sums, plot_path, a.title, time_unit, sat_sums=sat_sums)
        log(err or f"plot: {plot_path}")
        full = {
                "commit": commit(),
                "seed": a.seed,
                "command": "scripts/demo.py " + " ".join(sys.argv[1:]) if sys.argv[1:] else "make demo",
                "backend": backend,
                "workload": spec,
                "time_unit": time_unit,
                "time_scale": time_scale,
                "summaries": [{k: v for k, v in s.items() if k != "ttft_samples_s"} for s in sums],
                "steps": {r["policy"]: r["steps"] for r in runs},
                "requests": {r["policy"]: r["results"] for r in runs},
                "sat": {
                    "description": sat_text,
                    "workload_sha256": satstep.fingerprint(sat_steps) if sat_steps else None,
                    "backend": sat_backend or None,
                    "options": sat,
                    "time_scale": sat_scale,
                    "summaries": [{k: v for k, v in s.items() if k != "ttft_samples_s"} for s in sat_sums],
                    "requests": {r["policy"]: r["records"] for r in sat_runs},
                },
                "pids": [p.pid for p, _ in list(fleets.values()) + list(sat_fleets.values())],
                "elapsed_s": time.time() - t_start,
        }
        report.write_json(json_path, full)
        # The figures alone (docs/results/demo.json is a copy: `make render`).
        report.write_json(os.path.splitext(json_path)[0] + "-summary.json",
                          summary_doc(json.loads(json.dumps(full, default=report._jsonable))))
        log(f"results: {json_path}  (elapsed {time.time() - t_start:.0f}s)")
        bad = [s for s in sums + sat_sums if s["errors"] or s.get("steps_before_failed")]
        for s in bad:
            log(f"{s['policy']}: {s['errors']} failed requests, first: {s['first_error']}"
                + (f"; {s['steps_before_failed']} failed in the steps before" if s.get("steps_before_failed") else ""))
        return 1 if bad else 0
    except KeyboardInterrupt:
        print("\ninterrupted; cleaning up", file=sys.stderr, flush=True)
        return 130
    finally:
        cleanup.close()
