"""`make arena`: real routers (sglang-router, vllm-router) against kvc-router's
balancer on vllm-sim fleets. Prints a table, writes build/arena/arena.json,
arena-details.json and arena.png. Run with PYTHONPATH=testbed (the
Makefile does)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

try:
    from kvc_harness.arena import (
        DEFAULT_POLICIES,
        DEFAULT_SEEDS,
        DEFAULT_WORKLOADS,
        FROZEN_DEFAULT,
        POLICIES,
        ROUTER_QUEUES,
        TUNE_GRID,
        ArenaConfig,
        format_table,
        load_frozen,
        peers_available,
        run_arena,
        tune_peers,
        workload_specs,
        write_outputs,
    )
except ModuleNotFoundError as e:
    if e.name != "kvc_harness":
        raise
    sys.exit("kvc_harness not found: run with PYTHONPATH=testbed (as `make arena` does)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--short", action="store_true", help="small traces (the pytest/make arena-short size)")
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS), help="comma-separated, or 'all'")
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help="comma-separated, or 'all'")
    ap.add_argument("--seeds", default=DEFAULT_SEEDS,
                    help="reported seeds (fresh: never run before the freeze); tune only on 101,102")
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--tune-peers", default="", metavar="PEERS",
                    help="tuned peer rows: tune these peers (comma list, or 'all') on --tune-seeds per workload, "
                         "then run each as PEER@tuned on --seeds where the chosen point is not its launcher "
                         f"default (tunable: {', '.join(TUNE_GRID)}); --policies is ignored")
    ap.add_argument("--ordered", action=argparse.BooleanOptionalAction, default=True,
                    help="requests submitted together are routed and sent in the workload's order")
    ap.add_argument("--hold", action=argparse.BooleanOptionalAction, default=True,
                    help="hold the engines (vllm-sim /sim/hold) until a burst submitted at once has arrived")
    ap.add_argument("--both-holds", action="store_true",
                    help="also run every policy without the burst hold on the same seeds (rows POLICY+nohold)")
    ap.add_argument("--nohold-only", action="store_true",
                    help="only the POLICY+nohold rows (to add to a run that has the held rows: arena_merge.py)")
    ap.add_argument("--tune-seeds", default="101,102", help="seeds for --tune-peers (never reported)")
    ap.add_argument("--tune-objective", choices=("step+ttft", "step"), default="step+ttft",
                    help="--tune-peers' objective: step time and TTFT p99 over verl_default's, averaged "
                         "(`make arena-tuned`), or step time alone (`make arena-rl-tuned`)")
    ap.add_argument("--repeat", default="", metavar="POLICY",
                    help="run POLICY a second time on every seed: the noise floor ('' = none)")
    ap.add_argument("--speed", type=float, default=20.0, help="simulated seconds per wall second")
    ap.add_argument("--out", default=None, help="output directory (default build/arena)")
    ap.add_argument("--kvc-knob", action="append", default=[], metavar="KEY=VALUE",
                    help="KVCAwareStrategyConfig override for kvc_aware, on top of the frozen configuration "
                         "(tune only on seeds 101-102)")
    ap.add_argument("--kvc-frozen", default=FROZEN_DEFAULT,
                    help="kvc_aware's frozen configuration (docs/frozen-kvc-aware.json); '' = the library defaults")
    ap.add_argument("--clock", choices=("paced", "wall"), default="paced",
                    help="vllm-sim's clock: paced (host stalls add no simulated time to busy engines) or wall")
    ap.add_argument("--stream", action=argparse.BooleanOptionalAction, default=False,
                    help="streamed requests (client TTFT measured) or not (less client work per request)")
    ap.add_argument("--turn-gap", type=float, default=0.0, metavar="S",
                    help="experiment: simulated seconds every later agent turn waits on top of its tool latency")
    a = ap.parse_args(argv)
    if a.turn_gap < 0:
        ap.error("--turn-gap must be >= 0")
    if a.nohold_only and not a.hold:
        ap.error("--nohold-only with --no-hold: the rows would be held ones' names without a hold to compare")
    specs = workload_specs(short=a.short)
    if a.workloads == "all":
        a.workloads = ",".join(specs)
    if a.policies == "all":
        a.policies = ",".join(POLICIES)
    names = [w for w in a.workloads.split(",") if w]
    unknown = [w for w in names if w not in specs]
    if unknown:
        ap.error(f"unknown workloads {unknown}; known: {sorted(specs)}")
    policies = [p for p in a.policies.split(",") if p]
    held = a.hold and not a.nohold_only
    if held and a.policies in (",".join(POLICIES), ",".join(DEFAULT_POLICIES)):
        # "all" or the default set under the hold: a router queue's rows cannot be held (ROUTER_QUEUES)
        policies = [p for p in policies if p not in ROUTER_QUEUES]
        print(f"arena: {', '.join(ROUTER_QUEUES)} left out of the policy set under the burst hold (run it with "
              "--nohold-only)", file=sys.stderr)
    bad = [p for p in policies + ([a.repeat] if a.repeat else []) if p not in POLICIES]
    if bad:
        ap.error(f"unknown policies {bad}; known: {list(POLICIES)}")
    if held and a.tune_peers == "all":
        a.tune_peers = ",".join(p for p in TUNE_GRID if p not in ROUTER_QUEUES)
    tuned = [p for p in a.tune_peers.split(",") if p]
    queued = sorted({p for p in policies + tuned if p.partition("@")[0] in ROUTER_QUEUES})
    if queued and held:
        ap.error(f"{', '.join(queued)} hold requests in the router until the engines report progress, which "
                 "engines under the burst hold never do (the two would wait for each other until the hold's "
                 "deadline): run these rows with --nohold-only (or --no-hold)")
    why = peers_available()
    if why and any(p.startswith(("sglang", "vllm", "smg", "dynamo")) for p in policies):
        print(f"arena: real peers unavailable: {why}", file=sys.stderr)
        return 2
    knobs: dict = {}
    commit = ""
    if a.kvc_frozen:
        knobs, commit = load_frozen(a.kvc_frozen)
    for kv in a.kvc_knob:
        k, _, v = kv.partition("=")
        knobs[k] = (v.lower() == "true") if v.lower() in ("true", "false") else (float(v) if "." in v else int(v))
    cfg = ArenaConfig(servers=a.servers, speed=a.speed, kvc_knobs=knobs, kvc_frozen=a.kvc_frozen,
                      kvc_frozen_commit=commit + (" + --kvc-knob " + " ".join(a.kvc_knob) if a.kvc_knob else ""),
                      stream=a.stream, clock=a.clock, repeat_policy=a.repeat,
                      ordered=a.ordered, hold=a.hold, both_holds=a.both_holds or a.nohold_only,
                      nohold_only=a.nohold_only, turn_gap_s=a.turn_gap)
    if a.out:
        cfg.out_dir = a.out
    t0 = time.time()
    seeds = [int(s) for s in a.seeds.split(",")]
    if a.tune_peers:
        peers = list(TUNE_GRID) if a.tune_peers == "all" else [p for p in a.tune_peers.split(",") if p]
        tune_seeds = [int(s) for s in a.tune_seeds.split(",")]
        if set(tune_seeds) & set(seeds):
            ap.error(f"seeds {sorted(set(tune_seeds) & set(seeds))} are both tuning and reported seeds")
        cfg.bound_workloads, cfg.repeat_policy = (), ""
        # --nohold-only: the grid is tuned without the hold too (against
        # verl_default without it), as its reported rows are run.
        tune_cfg = replace(cfg, hold=False, both_holds=False, nohold_only=False) if a.nohold_only else cfg
        tuning = tune_peers([specs[w] for w in names], peers, tune_seeds, tune_cfg, objective=a.tune_objective)
        tuning["hold"] = tune_cfg.hold
        results = []
        for w in names:
            variants = []
            for p in peers:
                if tuning["chosen"][p][w] != TUNE_GRID[p][0]:  # the launcher default's row is in `make arena`
                    cfg.peer_params.setdefault(f"{p}@tuned", {})[w] = tuning["chosen"][p][w]
                    variants.append(f"{p}@tuned")
            if variants:
                results += run_arena([specs[w]], variants, seeds, cfg)
        paths = write_outputs(results, cfg.out_dir, cfg, extra={"tuning": tuning})
    else:
        results = run_arena([specs[w] for w in names], policies, seeds, cfg)
        paths = write_outputs(results, cfg.out_dir, cfg)
    print()
    print(format_table(results))
    if commit:
        print(f"\nkvc_aware: frozen configuration {a.kvc_frozen} at {cfg.kvc_frozen_commit}")
    print(f"\nwrote {', '.join(paths.values())} in {time.time() - t0:.0f}s")
    return 0 if all(r["row"]["errors"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
