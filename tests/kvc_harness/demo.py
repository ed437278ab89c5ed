"""The demo behind ``make demo`` and ``scripts/gpu-validate.sh``: default
(verl's balancer) vs kvc_aware on the same seeded GRPO + agent workload, each on
a cold simulated fleet (or on attached servers, whose prefix caches are reset
between the policies), measured from the servers' own /metrics and client-side
TTFT. ``scripts/demo.py`` is its command line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from kvc_harness import REPO, client, fleet, report, rollout
from kvc_harness.procs import Reaper, start_ray
from kvc_harness.workloads import WorkloadSpec

POLICIES = ("default", "kvc_aware")


@dataclass
class DemoOptions:
    """What scripts/demo.py's flags set; None means the workload's default
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

    spec = workload(a)
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
        if attach:
            servers = fleet.read_servers_file(a.servers_file)
            backend = f"{len(servers)} attached servers ({a.servers_file})"
            time_scale, time_unit = 1.0, "s"
        else:
            if not os.access(a.sim_binary, os.X_OK):
                raise SystemExit(
                    f"{a.sim_binary} not found: run `make build` (or go build -o bin/vllm-sim ./cmd/vllm-sim)"
                )
            extra = [
                "--speed",
                str(speed),
                "--num-gpu-blocks",
                str(a.gpu_blocks),
                "--seed",
                str(a.seed),
                "--max-num-seqs",
                str(a.max_num_seqs),
            ]
            # One cold fleet per policy, both started before Ray (no threads yet,
            # so the fleets can be tied to this process's lifetime).
            for pol in POLICIES:
                p, servers, cmd = fleet.start_sim_fleet(
                    a.sim_binary, a.servers, cleanup, extra, os.path.join(a.out, f"vllm-sim-{pol}.log")
                )
                fleets[pol] = (p, servers)
            log(f"vllm-sim fleets (pids {' '.join(str(p.pid) for p, _ in fleets.values())}): {' '.join(cmd[1:])}")
            backend = (
                f"{a.servers} vllm-sim servers ({a.gpu_blocks} GPU blocks x 16 tokens each, KV events on, "
                f"speed {speed:g}x)"
            )
            # Times are reported on the servers' clock: wall x speed.
            time_scale, time_unit = speed, "sim s"
        log(f"backend: {backend}")
        log(f"workload: {spec.describe()}, seed {a.seed}")

        ray = start_ray(a.num_cpus, namespace="kvc-router-demo")
        cleanup.add(ray.shutdown)
        cleanup.install_signal_handlers()  # after ray.init, which may install its own

        model = None
        runs = []
        for pol in POLICIES:
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
        sums = [report.summarize(r, time_scale) for r in runs]
        title = f"{a.title}: {backend}"
        log("")
        log(report.format_table(sums, title, time_unit))
        if not attach:
            log(
                f"(times on the simulated servers' clock: wall seconds x {speed:g}; server ids differ between the "
                f"two cold fleets, rows are matched by position)"
            )
        err = report.plot(sums, plot_path, title, time_unit)
        log(err or f"plot: {plot_path}")
        report.write_json(
            json_path,
            {
                "backend": backend,
                "workload": spec,
                "time_unit": time_unit,
                "time_scale": time_scale,
                "summaries": [{k: v for k, v in s.items() if k != "ttft_samples_s"} for s in sums],
                "steps": {r["policy"]: r["steps"] for r in runs},
                "requests": {r["policy"]: r["results"] for r in runs},
                "pids": [p.pid for p, _ in fleets.values()],
                "elapsed_s": time.time() - t_start,
            },
        )
        log(f"results: {json_path}  (elapsed {time.time() - t_start:.0f}s)")
        bad = [s for s in sums if s["errors"]]
        for s in bad:
            log(f"{s['policy']}: {s['errors']} failed requests, first: {s['first_error']}")
        return 1 if bad else 0
    except KeyboardInterrupt:
        print("\ninterrupted; cleaning up", file=sys.stderr, flush=True)
        return 130
    finally:
        cleanup.close()
