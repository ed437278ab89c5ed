#!/usr/bin/env python3
"""kvc-router demo: default (verl's balancer) vs kvc_aware on a rollout workload.

Starts a small simulated vLLM fleet (bin/vllm-sim, KV events on, prefix caching,
a GPU KV capacity small enough that cache affinity matters), starts Ray locally,
creates the balancer exactly as verl does (``ray.remote(KVCAwareBalancer)``),
and drives a GRPO workload (prompts x samples per step, a weight update =
``POST /reset_prefix_cache`` on every server + ``reset_prefix_index()``
between steps) and a multi-turn agent workload from several Ray worker actors
that acquire a server through the balancer actor, call it over HTTP
(``/v1/completions`` with token ids, streaming) and release it. It does this
twice on cold fleets, once per policy, and prints a comparison measured from
the servers' own ``/metrics`` and client-side TTFT, and writes a plot.

With ``--servers-file FILE`` it attaches to running servers instead (one JSON
object per line: url, kv_events_endpoints, kv_events_replay_endpoints, topic;
the lines vllm-sim prints) and resets their prefix caches between the policies;
``scripts/gpu-validate.sh`` uses this with real vLLM servers.

Every process it starts (the fleet, Ray) is stopped on exit, on an error and on
Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import demo_lib as dl  # noqa: E402

POLICIES = ("default", "kvc_aware")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=4, help="simulated servers (default 4)")
    ap.add_argument("--prompts", type=int, help="GRPO prompts per step (default 8)")
    ap.add_argument("--samples", type=int, help="GRPO samples per prompt (default 8)")
    ap.add_argument("--steps", type=int, help="GRPO rollout steps (default 3)")
    ap.add_argument("--tasks", type=int, help="agent tasks (default 4)")
    ap.add_argument("--agent-samples", type=int, help="agent trajectories per task (default 4)")
    ap.add_argument("--turns", type=int, help="agent turns per trajectory (default 4)")
    ap.add_argument("--workers", type=int, default=4, help="Ray rollout-worker actors (default 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a smaller, faster run (the test suite's)")
    ap.add_argument("--speed", type=float, help="vllm-sim simulated seconds per wall second (default 2, quick 4)")
    ap.add_argument(
        "--gpu-blocks",
        type=int,
        default=3072,
        help="KV blocks (16 tokens) per simulated server (default 3072 = 48k tokens)",
    )
    ap.add_argument(
        "--max-num-seqs",
        type=int,
        default=64,
        help="running-set capacity per simulated server, also given to the router (default 64)",
    )
    ap.add_argument("--sim-binary", default=os.path.join(REPO, "bin", "vllm-sim"))
    ap.add_argument("--servers-file", help="attach to running servers listed in FILE (JSON lines) instead")
    ap.add_argument("--out", default=os.path.join(REPO, "build", "demo"), help="output directory")
    ap.add_argument("--plot", help="plot path (default OUT/demo.png)")
    ap.add_argument("--json", help="results path (default OUT/demo.json)")
    ap.add_argument("--num-cpus", type=int, default=2, help="ray.init(num_cpus=...)")
    ap.add_argument("--title", default="kvc-router demo")
    return ap.parse_args(argv)


def workload(a) -> dl.WorkloadSpec:
    spec = dl.WorkloadSpec(seed=a.seed)
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


def ensure_matplotlib(log) -> None:
    """The plot needs matplotlib; install it into this interpreter when missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log("installing matplotlib for the plot ...")
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], check=False)
        if r.returncode:
            log("matplotlib could not be installed; the demo runs without a plot")


def main(argv=None) -> int:
    a = parse_args(argv)
    t_start = time.time()
    log = lambda *x: print(*x, flush=True)  # noqa: E731
    spec = workload(a)
    os.makedirs(a.out, exist_ok=True)
    plot_path = a.plot or os.path.join(a.out, "demo.png")
    json_path = a.json or os.path.join(a.out, "demo.json")
    cleanup = dl.Cleanup()
    cleanup.install_signal_handlers()
    speed = a.speed if a.speed is not None else (4.0 if a.quick else 2.0)
    try:
        ensure_matplotlib(log)
        attach = a.servers_file is not None
        fleets = {}
        if attach:
            servers = dl.read_servers_file(a.servers_file)
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
                p, servers, cmd = dl.start_sim_fleet(
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

        import ray

        os.environ["PYTHONPATH"] = os.pathsep.join(
            [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(
            address="local",
            num_cpus=a.num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            namespace="kvc-router-demo",
        )
        cleanup.add(ray.shutdown)
        cleanup.install_signal_handlers()  # after ray.init, which may install its own

        model = None
        runs = []
        for pol in POLICIES:
            if attach:
                dl.wait_healthy({s.sid: s.url for s in servers})
                dl.reset_prefix_caches({s.sid: s.url for s in servers})  # cold start
                srv = servers
            else:
                srv = fleets[pol][1]
                dl.wait_healthy({s.sid: s.url for s in srv})
            model = model or dl.served_model(srv[0].url)
            log(f"running policy {pol} ...")
            runs.append(
                dl.run_policy(
                    ray, pol, srv, spec, model, workers=a.workers, log=log, max_num_seqs=0 if attach else a.max_num_seqs
                )
            )
            if not attach:
                cleanup.stop_process(fleets[pol][0])
        sums = [dl.summarize(r, time_scale) for r in runs]
        title = f"{a.title}: {backend}"
        log("")
        log(dl.format_table(sums, title, time_unit))
        if not attach:
            log(
                f"(times on the simulated servers' clock: wall seconds x {speed:g}; server ids differ between the "
                f"two cold fleets, rows are matched by position)"
            )
        err = dl.plot(sums, plot_path, title, time_unit)
        log(err or f"plot: {plot_path}")
        dl.write_json(
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
        cleanup.run()


if __name__ == "__main__":
    sys.exit(main())
