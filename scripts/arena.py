"""`make arena`: real routers (sglang-router, vllm-router) against kvc-router's
balancer on vllm-sim fleets. Prints a table, writes build/arena/arena.json,
arena-details.json and arena.png. Run with PYTHONPATH=tests (the
Makefile does)."""

from __future__ import annotations

import argparse
import sys
import time

try:
    from kvc_harness.arena import (
        DEFAULT_POLICIES,
        DEFAULT_SEEDS,
        DEFAULT_WORKLOADS,
        FROZEN_DEFAULT,
        POLICIES,
        ArenaConfig,
        format_table,
        load_frozen,
        peers_available,
        run_arena,
        workload_specs,
        write_outputs,
    )
except ModuleNotFoundError as e:
    if e.name != "kvc_harness":
        raise
    sys.exit("kvc_harness not found: run with PYTHONPATH=tests (as `make arena` does)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--short", action="store_true", help="small traces (the pytest/make arena-short size)")
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS), help="comma-separated, or 'all'")
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help="comma-separated, or 'all'")
    ap.add_argument("--seeds", default=DEFAULT_SEEDS,
                    help="reported seeds (fresh: never run before the freeze); tune only on 101,102")
    ap.add_argument("--servers", type=int, default=4)
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
    a = ap.parse_args(argv)
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
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        ap.error(f"unknown policies {bad}; known: {list(POLICIES)}")
    why = peers_available()
    if why and any(p.startswith(("sglang", "vllm")) for p in policies):
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
                      stream=a.stream, clock=a.clock)
    if a.out:
        cfg.out_dir = a.out
    t0 = time.time()
    results = run_arena([specs[w] for w in names], policies, [int(s) for s in a.seeds.split(",")], cfg)
    paths = write_outputs(results, cfg.out_dir, cfg)
    print()
    print(format_table(results))
    if commit:
        print(f"\nkvc_aware: frozen configuration {a.kvc_frozen} at {cfg.kvc_frozen_commit}")
    print(f"\nwrote {', '.join(paths.values())} in {time.time() - t0:.0f}s")
    return 0 if all(r["row"]["errors"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
