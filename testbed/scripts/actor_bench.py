"""Balancer actor throughput, ours against verl's, in one run: writes
build/overhead/actor.json. Needs an interpreter with verl and ray (see
`make actor-bench`, which runs it with PYTHONPATH=python:tests so that
kvc_router comes from this tree)."""

from __future__ import annotations

import argparse
import json
import os
import sys

try:
    from kvc_harness import REPO as ROOT
    from kvc_harness import actor_bench
except ModuleNotFoundError as e:
    if e.name != "kvc_harness":
        raise
    sys.exit("kvc_harness not found: run with PYTHONPATH=testbed (as `make actor-bench` does)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--callers", default="8,32,128")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--client-actors", type=int, default=2)
    ap.add_argument(
        "--kvc-variant", default="kvc", help="variant reported as kvc_pairs_per_s (kvc: as the verl hook runs it)"
    )
    ap.add_argument("--extra", action="store_true", help="also the unshipped async and threaded actors")
    ap.add_argument(
        "--metrics-cost",
        action="store_true",
        help="only the Ray metrics exporter's cost: kvc with the exporter off, on (5 s) and at 0.5 s;"
        " every round's figure, mean and 95%% CI -> build/overhead/actor-metrics.json",
    )
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "overhead", "actor.json"))
    a = ap.parse_args()
    import ray

    cfg = actor_bench.BenchConfig(
        callers=tuple(int(x) for x in a.callers.split(",")), seconds=a.seconds, rounds=a.rounds,
        prompt_tokens=a.prompt_tokens, client_actors=a.client_actors,
    )
    pypath = os.pathsep.join([os.path.join(ROOT, "python"), os.path.join(ROOT, "testbed")])
    ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": pypath}})
    every: dict = {}
    try:
        if a.metrics_cost:
            variants = actor_bench.metrics_variants()
        else:
            variants = actor_bench.default_variants() + (actor_bench.extra_variants() if a.extra else [])
        res = actor_bench.run(ray, cfg, variants, every=every)
    finally:
        ray.shutdown()
    if a.metrics_cost:
        from kvc_harness.report import mean_ci

        # Rounds interleave the variants, so each round's difference from the
        # exporter-off actor is a paired sample (machine noise largely cancels).
        off = every["kvc_metrics_off"]
        table = {
            v: {
                n: {
                    "rounds": [round(x, 1) for x in xs],
                    "mean_ci95": mean_ci(xs),
                    "minus_off_mean_ci95": mean_ci([x - o for x, o in zip(xs, off[n])]),
                }
                for n, xs in per.items()
            }
            for v, per in every.items()
        }
        out = os.path.join(os.path.dirname(a.out), "actor-metrics.json")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as f:
            json.dump(table, f, indent=1)
        print(json.dumps(table))
        return
    rows = actor_bench.rows(res, a.kvc_variant, cfg.callers)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)
    print(json.dumps({"results": res, "rows": rows}))


if __name__ == "__main__":
    main()
